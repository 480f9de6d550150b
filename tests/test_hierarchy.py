"""HyCoCLIP's hierarchical metrics against hand computations, and the world's tree against its generator."""

from __future__ import annotations

import random
import pytest

from euclip_cli.hierarchy import Tree, chance, hierarchical_metrics, world_hierarchy_tasks, world_tree

# r -> a -> a1, a2;  r -> b -> b1
SMALL = Tree.from_parent({"a": "r", "b": "r", "a1": "a", "a2": "a", "b1": "b"})
# r -> a, b; x under both a and b (two parents, as WordNet allows); a -> a1; x -> x1
GRAPH = Tree({"a": ("r",), "b": ("r",), "x": ("a", "b"), "a1": ("a",), "x1": ("x",)})


@pytest.mark.parametrize("predicted, true, expected", [
    # (tie, lca_error, jaccard, precision, recall), worked out from A(n) = {n, its ancestors, r}
    ("a1", "a1", (0, 1, 1, 1, 1)),  # right: nothing lost
    ("a2", "a1", (2, 2, 2 / 4, 2 / 3, 2 / 3)),  # a sibling: {a, r} shared of {a1, a2, a, r}
    ("b1", "a1", (4, 3, 1 / 5, 1 / 3, 1 / 3)),  # a cousin: only the root shared
    ("r", "a1", (2, 1, 1 / 3, 1, 1 / 3)),  # the root: nothing wrong said, little said
    ("a", "a1", (1, 1, 2 / 3, 1, 2 / 3)),  # the parent
    ("b1", "a", (3, 3, 1 / 4, 1 / 3, 1 / 2)),  # depths differ
])
def test_each_metric_as_worked_out_by_hand(predicted, true, expected):
    found = hierarchical_metrics([predicted], [true], SMALL)
    assert [found[k] for k in ("tie", "lca_error", "jaccard", "h_precision", "h_recall")] == pytest.approx(expected)
    assert found["accuracy"] == float(predicted == true) and found["n"] == 1


def test_metrics_are_means_over_images():
    found = hierarchical_metrics(["a1", "a2", "b1"], ["a1", "a1", "a1"], SMALL)
    assert found["tie"] == pytest.approx((0 + 2 + 4) / 3) and found["jaccard"] == pytest.approx((1 + 0.5 + 0.2) / 3)
    assert found["accuracy"] == pytest.approx(1 / 3) and found["n"] == 3


def test_tree_distance_is_the_depths_below_the_lowest_common_ancestor():
    rng = random.Random(0)
    parent = {f"n{i}": f"n{rng.randrange(i)}" for i in range(1, 60)}  # a random tree rooted at n0
    tree = Tree.from_parent(parent)

    def chain(node):  # node, its parent, ..., n0
        up = [node]
        while up[-1] in parent:
            up.append(parent[up[-1]])
        return up

    nodes = ["n0", *parent]
    for a in rng.sample(nodes, 10):
        for b in nodes:
            up_a, up_b = chain(a), chain(b)
            lowest = next(n for n in up_a if n in up_b)
            assert tree.distance(a, b) == up_a.index(lowest) + up_b.index(lowest)


@pytest.mark.parametrize("predicted, true, expected", [
    # A(x1) = {x1, x, a, b, r}: both of x's parents; A(a1) = {a1, a, r}
    ("a1", "x1", (3, 2, 2 / 6, 2 / 3, 2 / 5)),  # x1 - x - a - a1: through the nearer of x's parents
    ("b", "x1", (2, 1, 2 / 5, 1, 2 / 5)),  # the other parent's side: b is above x1
    ("x1", "a1", (3, 4, 2 / 6, 2 / 5, 2 / 3)),
])
def test_a_node_with_two_parents_has_both_above_it(predicted, true, expected):
    found = hierarchical_metrics([predicted], [true], GRAPH)
    assert [found[k] for k in ("tie", "lca_error", "jaccard", "h_precision", "h_recall")] == pytest.approx(expected)
    assert GRAPH.root == "r" and set(GRAPH.ancestors("x1")) == {"x1", "x", "a", "b", "r"}


def test_guessing_scores_what_uniform_predictions_score():
    classes = ["a1", "a2", "b1"]
    found = chance(["a1"], classes, SMALL)
    assert found["tie"] == pytest.approx((0 + 2 + 4) / 3) and found["accuracy"] == pytest.approx(1 / 3)
    # Several images, a class true more often than another: every (guess, image) pair scored once.
    true = ["a1", "b1", "a1", "a2"]
    pairs = hierarchical_metrics([p for _ in true for p in classes], [t for t in true for _ in classes], SMALL)
    found = chance(true, classes, SMALL)
    assert {k: found[k] for k in pairs} == pytest.approx(pairs)


def test_the_worlds_tree_is_its_generators_families_and_shapes():
    from euclip_cli.data.world import FAMILY_OF, SHAPES
    from euclip_cli.data.world_tasks import WORLD_TASKS

    tree = world_tree()
    leaves = set(tree.parents) - {p for above in tree.parents.values() for p in above}
    assert leaves == set(SHAPES) and all(tree.parents[s] == (FAMILY_OF[s],) for s in SHAPES)
    assert {tree.parents[f] for f in FAMILY_OF.values()} == {(tree.root,)}
    # The tasks scored on it are those whose classes are the shapes, in the order their labels index.
    shape_tasks = [f"world/{t.name}" for t in WORLD_TASKS if t.classes and t.classes[0].endswith(SHAPES[0])]
    assert world_hierarchy_tasks() == shape_tasks and len(shape_tasks) == 4


def test_entailment_scores_rank_pairs_inside_the_cones_above_the_others():
    """Points placed by hand: each specific point lies outward along its own generic point's direction
    (inside that cone, outside the other's), so the cone score separates the related pairs perfectly."""
    import torch

    from euclip_cli.analysis.studies import entailment_study
    from euclip_cli.geometry import get_geometry

    g = get_geometry("euclidean", logit="d")
    generic = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    specific = torch.tensor([[4.0, 0.1], [0.1, 4.0], [3.0, -0.1]])
    related = torch.tensor([[True, False, True], [False, True, False]])
    found = entailment_study(g, None, generic, specific, related, min_radius=0.1)
    assert found["cone"]["roc_auc"] == 1.0 and found["cone"]["average_precision"] == 1.0
    assert found["cone"]["positives"] == 3 and found["cone"]["pairs"] == 6
    assert set(found) == {"similarity", "cone"}
    assert set(entailment_study(get_geometry("clip"), None, generic, specific, related, 0.1)) == {"similarity"}
