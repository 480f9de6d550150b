"""How far a classifier's mistakes fall in a class tree: HyCoCLIP's hierarchical metrics (Pal et al., ICLR
2025, ``hycoclip/evaluation/hierarchical_metrics.py``), for any geometry's predictions.

For a prediction p of an image whose class is t, with A(n) the set of n, its ancestors and the root:

- tree-induced error (TIE): the number of edges between p and t in the tree;
- LCA error: |A(p)| - |A(p) & A(t)| + 1, HyCoCLIP's count (1 for a correct prediction);
- Jaccard similarity |A(p) & A(t)| / |A(p) | A(t)|, hierarchical precision |A(p) & A(t)| / |A(p)| and
  recall |A(p) & A(t)| / |A(t)|;

each averaged over the images. Where euclip differs: HyCoCLIP reads ancestor sets from a file made from
WordNet; here they come from the hierarchy given, and each holds the node itself and the root (so that a
prediction at the root has a defined precision, 1, and recall 1 / |A(t)|). WordNet is a graph, not a tree
(a synset may have two hypernyms): A(n) is then every node above n, and the TIE the shortest path between
p and t over the graph's edges in either direction, as HyCoCLIP computes it on ImageNet's is-a graph.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from statistics import mean


@dataclass(frozen=True)
class Tree:
    """A rooted hierarchy by each node's parents (the root has none; a tree's nodes have one each)."""

    parents: dict[str, tuple[str, ...]]
    # Ancestors, ancestor sets and distances memoised per node, and the children of each node: a task
    # scores its classes' pairs many times over (uniform guessing on ImageNet: a million pairs).
    _up: dict = field(default_factory=dict, compare=False, repr=False)
    _up_sets: dict = field(default_factory=dict, compare=False, repr=False)
    _around: dict = field(default_factory=dict, compare=False, repr=False)
    _below: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_parent(cls, parent: dict[str, str]) -> "Tree":
        """A tree by each node's one parent."""
        return cls({node: (above,) for node, above in parent.items()})

    @property
    def root(self) -> str:
        roots = {p for above in self.parents.values() for p in above} - set(self.parents)
        if len(roots) != 1:
            raise ValueError(f"a hierarchy has one root, not {sorted(roots)}")  # a bug in the caller's table
        return roots.pop()

    def ancestors(self, node: str) -> list[str]:
        """``node`` and every node above it, nearest first (breadth first), the root last."""
        if node not in self._up:
            seen, queue = [node], deque([node])
            while queue:
                for above in self.parents.get(queue.popleft(), ()):
                    if above not in seen:
                        seen.append(above)
                        queue.append(above)
            self._up[node] = seen
        return self._up[node]

    def ancestor_set(self, node: str) -> frozenset[str]:
        """``ancestors(node)`` as a set."""
        if node not in self._up_sets:
            self._up_sets[node] = frozenset(self.ancestors(node))
        return self._up_sets[node]

    def distance(self, a: str, b: str) -> int:
        """Edges on the shortest path between ``a`` and ``b``, each edge walked either way (in a tree: each
        one's depth below their lowest common ancestor, added)."""
        if a not in self._around:
            self._around[a] = self._distances_from(a)
        return self._around[a][b]

    def _distances_from(self, start: str) -> dict[str, int]:
        if not self._below:
            for node, above in self.parents.items():
                for p in above:
                    self._below.setdefault(p, []).append(node)
        below = self._below
        hops, queue = {start: 0}, deque([start])
        while queue:
            node = queue.popleft()
            for near in (*self.parents.get(node, ()), *below.get(node, ())):
                if near not in hops:
                    hops[near] = hops[node] + 1
                    queue.append(near)
        return hops


def _row(p: str, t: str, tree: Tree) -> tuple[float, ...]:
    a_p, a_t = tree.ancestor_set(p), tree.ancestor_set(t)
    shared = len(a_p & a_t)
    return (tree.distance(p, t), len(a_p) - shared + 1, shared / len(a_p | a_t), shared / len(a_p),
            shared / len(a_t), float(p == t))


METRICS = ("tie", "lca_error", "jaccard", "h_precision", "h_recall", "accuracy")


def hierarchical_metrics(predicted: list[str], true: list[str], tree: Tree) -> dict[str, float]:
    """``{tie, lca_error, jaccard, h_precision, h_recall, accuracy, n}`` averaged over the pairs."""
    if len(predicted) != len(true) or not true:
        raise ValueError("one prediction per true class, and at least one")
    rows = [_row(p, t, tree) for p, t in zip(predicted, true)]
    return {name: mean(r[i] for r in rows) for i, name in enumerate(METRICS)} | {"n": len(rows)}


WORLD_ROOT = "shape"  # the world's captions name the root so at their most generic ("a shape")


def chance(true: list[str], classes: list[str], tree: Tree) -> dict[str, float]:
    """The metrics of a classifier that guesses uniformly among ``classes``: every class predicted once for
    each true class, averaged (what a model that learned nothing scores on the same images). Each distinct
    true class is scored once and weighted by how often it is true (ImageNet: 1,000 classes, 50,000 images)."""
    if not true:
        raise ValueError("at least one true class")
    counts = Counter(true)
    per_class = {t: [mean(col) for col in zip(*(_row(p, t, tree) for p in classes))] for t in counts}
    return {name: sum(per_class[t][i] * n for t, n in counts.items()) / len(true) for i, name in enumerate(METRICS)
            } | {"n": len(true) * len(classes)}


def world_tree() -> Tree:
    """The embedded world's class tree: shapes under their families, families under one root."""
    from euclip_cli.data.world import TAXONOMY

    parent = {family: WORLD_ROOT for family in TAXONOMY}
    parent.update({shape: family for family, shapes in TAXONOMY.items() for shape in shapes})
    return Tree.from_parent(parent)


def world_guessing() -> dict[str, float]:
    """Uniform guessing among the world's shapes, scored in its tree (every shape equally often true)."""
    from euclip_cli.data.world import SHAPES

    return chance(SHAPES, SHAPES, world_tree())


def world_hierarchy_tasks() -> list[str]:
    """The world's classification tasks whose classes are the tree's leaves (labels index ``world.SHAPES``)."""
    from euclip_cli.data.world_tasks import SHAPE_CLASSES, WORLD_TASKS

    return [f"world/{t.name}" for t in WORLD_TASKS if t.classes == SHAPE_CLASSES]
