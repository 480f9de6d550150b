"""HyCoCLIP's hierarchical metrics against hand computations, and the world's tree against its generator."""

from __future__ import annotations

import random
from collections import deque

import pytest

from euclip_cli.hierarchy import Tree, chance, hierarchical_metrics, world_hierarchy_tasks, world_tree

# r -> a -> a1, a2;  r -> b -> b1
SMALL = Tree({"a": "r", "b": "r", "a1": "a", "a2": "a", "b1": "b"})


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


def test_tree_distance_is_the_shortest_path_in_the_undirected_tree():
    rng = random.Random(0)
    parent = {f"n{i}": f"n{rng.randrange(i)}" for i in range(1, 60)}  # a random tree rooted at n0
    tree = Tree(parent)
    neighbours: dict[str, set[str]] = {}
    for child, up in parent.items():
        neighbours.setdefault(child, set()).add(up)
        neighbours.setdefault(up, set()).add(child)

    def bfs(source):
        seen, queue = {source: 0}, deque([source])
        while queue:
            node = queue.popleft()
            for n in neighbours[node]:
                if n not in seen:
                    seen[n] = seen[node] + 1
                    queue.append(n)
        return seen

    for source in rng.sample(sorted(neighbours), 10):
        hops = bfs(source)
        assert all(tree.distance(source, target) == d for target, d in hops.items())


def test_guessing_scores_what_uniform_predictions_score():
    classes = ["a1", "a2", "b1"]
    found = chance(["a1"], classes, SMALL)
    assert found["tie"] == pytest.approx((0 + 2 + 4) / 3) and found["accuracy"] == pytest.approx(1 / 3)


def test_the_worlds_tree_is_its_generators_families_and_shapes():
    from euclip_cli.data.world import FAMILY_OF, SHAPES
    from euclip_cli.data.world_tasks import WORLD_TASKS

    tree = world_tree()
    leaves = set(tree.parent) - set(tree.parent.values())
    assert leaves == set(SHAPES) and all(tree.parent[s] == FAMILY_OF[s] for s in SHAPES)
    assert {tree.parent[f] for f in FAMILY_OF.values()} == {tree.root}
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
