"""How far a classifier's mistakes fall in a class tree: HyCoCLIP's hierarchical metrics (Pal et al., ICLR
2025, ``hycoclip/evaluation/hierarchical_metrics.py``), for any geometry's predictions, and the trees they
are scored in.

For a prediction p of an image whose class is t, with A(n) the ancestor set of n (by the convention below):

- tree-induced error (TIE): the number of edges between p and t in the tree;
- LCA error: |A(p)| - |A(p) & A(t)| + 1;
- Jaccard similarity |A(p) & A(t)| / |A(p) | A(t)|, hierarchical precision |A(p) & A(t)| / |A(p)| and
  recall |A(p) & A(t)| / |A(t)|;

each averaged over the images. Two conventions for A(n) (``CONVENTIONS``):

- ``hycoclip`` (the default): the nodes strictly above n, the root included, as HyCoCLIP's
  ``all_ancestors_indices.pkl`` holds them (and PHyCLIP's and UNCHA's copies of its function). A correct
  prediction and a mistake among siblings score alike (LCA error 1; Jaccard, precision, recall 1): only the
  TIE tells them apart.
- ``inclusive``: n itself as well, so every mistake costs something in every metric; its LCA error is
  HyCoCLIP's plus the error rate, its other values differ by up to 0.2 on ImageNet.

Because a model's TIE is mostly its error rate (a wrong prediction costs at least 2), the mistakes are also
scored on their own: the mistake TIE (the mean over wrong predictions only) beside what uniform mistakes
score on the same images (each wrong prediction replaced by every other class in turn), so a ratio below
1 says a model's mistakes sit nearer in the tree than chance would put them at its accuracy.

WordNet is a graph, not a tree (a synset may have two hypernyms): ``Tree`` takes each node's parents, A(n)
is then every node above n, and the TIE the shortest path over the edges in either direction, as HyCoCLIP
computes it. ``prune`` makes a tree of such a graph the way HyCoCLIP's ImageNet tree is shaped.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from statistics import mean
from typing import Optional


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
        roots = self.nodes - set(self.parents)
        if len(roots) != 1:
            raise ValueError(f"a hierarchy has one root, not {sorted(roots)}")  # a bug in the caller's table
        return roots.pop()

    @property
    def nodes(self) -> set[str]:
        """Every node: those with parents, and the root."""
        return set(self.parents) | {p for above in self.parents.values() for p in above}

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


@dataclass(frozen=True)
class Convention:
    """Which nodes the ancestor set of a node holds: always those above it up to the root; the node itself
    only where ``includes_self``."""

    name: str
    includes_self: bool


CONVENTIONS = {c.name: c for c in (Convention("hycoclip", includes_self=False),
                                   Convention("inclusive", includes_self=True))}
DEFAULT_CONVENTION = "hycoclip"


def ancestor_set(tree: Tree, node: str, convention: Convention) -> frozenset[str]:
    """A(node) under ``convention`` (module docstring). Empty only for the root under ``hycoclip``, where
    precision would divide by zero: a class at the root is a caller's bug, so it raises."""
    found = tree.ancestor_set(node) if convention.includes_self else tree.ancestor_set(node) - {node}
    if not found:
        raise ValueError(f"{node} is the tree's root: it has no ancestors to score a prediction by")
    return found


def _row(p: str, t: str, tree: Tree, convention: Convention) -> tuple[float, ...]:
    a_p, a_t = ancestor_set(tree, p, convention), ancestor_set(tree, t, convention)
    shared = len(a_p & a_t)
    return (tree.distance(p, t), len(a_p) - shared + 1, shared / len(a_p | a_t), shared / len(a_p),
            shared / len(a_t), float(p == t))


METRICS = ("tie", "lca_error", "jaccard", "h_precision", "h_recall", "accuracy")


def _convention(name: str) -> Convention:
    if name not in CONVENTIONS:
        raise ValueError(f"unknown convention {name!r}: one of {', '.join(CONVENTIONS)}")
    return CONVENTIONS[name]


def hierarchical_metrics(predicted: list[str], true: list[str], tree: Tree, classes: list[str],
                         convention: str = DEFAULT_CONVENTION) -> dict[str, float]:
    """``{tie, lca_error, jaccard, h_precision, h_recall, accuracy, n}`` averaged over the pairs, with
    ``mistakes`` (how many are wrong), ``mistake_tie`` (their mean TIE) and ``random_mistake_tie`` (the mean,
    over the same wrong images, of the TIE from the true class to every other of ``classes``); both None
    without a mistake."""
    if len(predicted) != len(true) or not true:
        raise ValueError("one prediction per true class, and at least one")
    rule = _convention(convention)
    rows = [_row(p, t, tree, rule) for p, t in zip(predicted, true)]
    found = {name: mean(r[i] for r in rows) for i, name in enumerate(METRICS)} | {"n": len(rows)}
    wrong = [(p, t) for p, t in zip(predicted, true) if p != t]
    random_tie = {t: mean(tree.distance(q, t) for q in classes if q != t) for t in {t for _, t in wrong}}
    return found | {"mistakes": len(wrong),
                    "mistake_tie": mean(tree.distance(p, t) for p, t in wrong) if wrong else None,
                    "random_mistake_tie": mean(random_tie[t] for _, t in wrong) if wrong else None}


def compare_trees(ta: Tree, tb: Tree, leaves: list[str]) -> dict[str, float]:
    """How far hierarchy ``ta`` is from ``tb`` over the same ``leaves``: their sizes, the nodes both hold and
    how many of those have the same parents, how many leaves have the same nodes above them, and over every
    pair of leaves the correlation of their TIEs, the share of pairs at an equal TIE and each one's mean."""
    from itertools import combinations

    import numpy as np

    both, roots = ta.nodes & tb.nodes, {ta.root, tb.root}
    pairs = list(combinations(leaves, 2))
    tie_a = np.array([ta.distance(x, y) for x, y in pairs], dtype=float)
    tie_b = np.array([tb.distance(x, y) for x, y in pairs], dtype=float)
    return {"nodes": len(ta.nodes), "nodes_against": len(tb.nodes), "shared_nodes": len(both),
            "same_parent": sum(ta.parents.get(n) == tb.parents.get(n) for n in both if n in ta.parents or n in tb.parents),
            "leaves": len(leaves),
            "same_ancestors": sum(ta.ancestor_set(x) == tb.ancestor_set(x) for x in leaves),
            # Trees rooted at different nodes (entity, physical_entity) agree below both roots or not at all.
            "same_ancestors_below_root": sum(ta.ancestor_set(x) - roots == tb.ancestor_set(x) - roots for x in leaves),
            "pairs": len(pairs), "tie_correlation": float(np.corrcoef(tie_a, tie_b)[0, 1]),
            "equal_tie": float((tie_a == tie_b).mean()), "mean_tie": float(tie_a.mean()),
            "mean_tie_against": float(tie_b.mean())}


WORLD_ROOT = "shape"  # the world's captions name the root so at their most generic ("a shape")


def chance(true: list[str], classes: list[str], tree: Tree, convention: str = DEFAULT_CONVENTION) -> dict[str, float]:
    """The metrics of a classifier that guesses uniformly among ``classes``: every class predicted once for
    each true class, averaged (what a model that learned nothing scores on the same images). Each distinct
    true class is scored once and weighted by how often it is true (ImageNet: 1,000 classes, 50,000 images)."""
    if not true:
        raise ValueError("at least one true class")
    rule, counts = _convention(convention), Counter(true)
    per_class = {t: [mean(col) for col in zip(*(_row(p, t, tree, rule) for p in classes))] for t in counts}
    return {name: sum(per_class[t][i] * n for t, n in counts.items()) / len(true) for i, name in enumerate(METRICS)
            } | {"n": len(true) * len(classes)}


def prune(parents: dict[str, tuple[str, ...]], leaves: list[str], prefer: Optional[str] = None) -> dict[str, str]:
    """A tree (each node's one parent) over ``leaves`` from a graph above them (each node's parents), shaped
    as HyCoCLIP's ImageNet tree is: each node keeps the parent through which it reaches ``prefer`` (where
    it can; WordNet: physical_entity, so that a class of things is not filed under an abstraction), among
    those the one with the longest path to the root (the most specific), then the first in order; then only
    the nodes above a leaf through those parents are kept, and every node that is not a leaf and has one
    child is spliced out (its child takes its parent), the root included. The leaves are kept whatever their
    children."""
    above: dict[str, tuple[str, ...]] = {}
    todo = list(leaves)
    while todo:  # only what lies above the leaves
        node = todo.pop()
        if node in above:
            continue
        above[node] = tuple(parents.get(node, ()))
        todo.extend(above[node])
    depth: dict[str, int] = {}  # the longest path from the node up to the root
    reaches: dict[str, bool] = {}

    def climb(node: str) -> tuple[bool, int]:
        # Memoised recursion over a DAG of WordNet's depth (under 20): no deep stacks.
        if node not in depth:
            ups = [climb(p) for p in above[node]]
            reaches[node] = node == prefer or any(r for r, _ in ups)
            depth[node] = 1 + max((d for _, d in ups), default=-1)
        return reaches[node], depth[node]

    parent = {}
    for node, ups in above.items():
        if ups:
            parent[node] = max(ups, key=lambda p: (climb(p), -ups.index(p)))
    # A synset whose children all kept their other parents is left above no leaf: only the leaves' chains stay.
    return restrict(parent, leaves)


def collapse(parent: dict[str, str], keep: set[str]) -> dict[str, str]:
    """``parent`` with every node outside ``keep`` that has one child spliced out (the root too: its child
    becomes the root). Splicing replaces one child of a node by one other, so no other node's count of
    children changes and one pass suffices."""
    parent = dict(parent)
    children: dict[str, set[str]] = {}
    for node, above in parent.items():
        children.setdefault(above, set()).add(node)
    for node in list(children):
        if node in keep or len(children[node]) != 1:
            continue
        (child,) = children.pop(node)
        above = parent.pop(node, None)
        if above is None:
            del parent[child]
        else:
            parent[child] = above
            children[above].remove(node)
            children[above].add(child)
    return parent


def restrict(parent: dict[str, str], leaves: list[str]) -> dict[str, str]:
    """A tree's part above ``leaves`` (a task's own classes), its one-child nodes spliced out: the tree a
    task of fewer classes is scored in."""
    kept: dict[str, str] = {}
    for leaf in leaves:
        node = leaf
        while node in parent and node not in kept:
            kept[node] = parent[node]
            node = parent[node]
    return collapse(kept, set(leaves))


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
