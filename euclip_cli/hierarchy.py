"""How far a classifier's mistakes fall in a class tree: HyCoCLIP's hierarchical metrics (Pal et al., ICLR
2025, ``hycoclip/evaluation/hierarchical_metrics.py``), for any geometry's predictions.

For a prediction p of an image whose class is t, with A(n) the set of n, its ancestors and the root:

- tree-induced error (TIE): the number of edges between p and t in the tree;
- LCA error: |A(p)| - |A(p) & A(t)| + 1, HyCoCLIP's count (1 for a correct prediction);
- Jaccard similarity |A(p) & A(t)| / |A(p) | A(t)|, hierarchical precision |A(p) & A(t)| / |A(p)| and
  recall |A(p) & A(t)| / |A(t)|;

each averaged over the images. Where euclip differs: HyCoCLIP reads ancestor sets from a file made from
WordNet; here they come from the tree given, and each holds the node itself and the root (so that a
prediction at the root has a defined precision, 1, and recall 1 / |A(t)|).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean


@dataclass(frozen=True)
class Tree:
    """A rooted tree by each node's parent (the root has none)."""

    parent: dict[str, str]

    @property
    def root(self) -> str:
        roots = set(self.parent.values()) - set(self.parent)
        if len(roots) != 1:
            raise ValueError(f"a tree has one root, not {sorted(roots)}")  # a bug in the caller's table
        return roots.pop()

    def ancestors(self, node: str) -> list[str]:
        """``node``, its parent, ..., the root."""
        chain = [node]
        while chain[-1] in self.parent:
            chain.append(self.parent[chain[-1]])
        return chain

    def distance(self, a: str, b: str) -> int:
        """Edges between ``a`` and ``b``: each one's depth below their lowest common ancestor, added."""
        up_a, up_b = self.ancestors(a), self.ancestors(b)
        above_b = set(up_b)
        common = next(n for n in up_a if n in above_b)
        return up_a.index(common) + up_b.index(common)


def hierarchical_metrics(predicted: list[str], true: list[str], tree: Tree) -> dict[str, float]:
    """``{tie, lca_error, jaccard, h_precision, h_recall, accuracy, n}`` averaged over the pairs."""
    if len(predicted) != len(true) or not true:
        raise ValueError("one prediction per true class, and at least one")
    rows = []
    for p, t in zip(predicted, true):
        a_p, a_t = set(tree.ancestors(p)), set(tree.ancestors(t))
        shared = len(a_p & a_t)
        rows.append((tree.distance(p, t), len(a_p) - shared + 1, shared / len(a_p | a_t), shared / len(a_p),
                     shared / len(a_t), float(p == t)))
    names = ("tie", "lca_error", "jaccard", "h_precision", "h_recall", "accuracy")
    return {name: mean(r[i] for r in rows) for i, name in enumerate(names)} | {"n": len(rows)}


WORLD_ROOT = "shape"  # the world's captions name the root so at their most generic ("a shape")


def chance(true: list[str], classes: list[str], tree: Tree) -> dict[str, float]:
    """The metrics of a classifier that guesses uniformly among ``classes``: every class predicted once for
    each true class, averaged (what a model that learned nothing scores on the same images)."""
    return hierarchical_metrics([p for _ in true for p in classes], [t for t in true for _ in classes], tree)


def world_tree() -> Tree:
    """The embedded world's class tree: shapes under their families, families under one root."""
    from euclip_cli.data.world import TAXONOMY

    parent = {family: WORLD_ROOT for family in TAXONOMY}
    parent.update({shape: family for family, shapes in TAXONOMY.items() for shape in shapes})
    return Tree(parent)


def world_guessing() -> dict[str, float]:
    """Uniform guessing among the world's shapes, scored in its tree (every shape equally often true)."""
    from euclip_cli.data.world import SHAPES

    return chance(SHAPES, SHAPES, world_tree())


def world_hierarchy_tasks() -> list[str]:
    """The world's classification tasks whose classes are the tree's leaves (labels index ``world.SHAPES``)."""
    from euclip_cli.data.world_tasks import SHAPE_CLASSES, WORLD_TASKS

    return [f"world/{t.name}" for t in WORLD_TASKS if t.classes == SHAPE_CLASSES]
