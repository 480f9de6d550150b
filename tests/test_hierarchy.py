"""HyCoCLIP's hierarchical metrics against hand computations and an independent implementation of its code's
definitions, the trees they are scored in (pruned, restricted, compared), and the world's tree against its
generator."""

from __future__ import annotations

import random
import re
import pytest

from euclip_cli.hierarchy import (Tree, chance, collapse, compare_trees, hierarchical_metrics, prune, restrict,
                                  world_hierarchy_tasks, world_tree)

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
def test_each_metric_as_worked_out_by_hand_with_inclusive_ancestor_sets(predicted, true, expected):
    found = hierarchical_metrics([predicted], [true], SMALL, ["a1", "a2", "b1"], "inclusive")
    assert [found[k] for k in ("tie", "lca_error", "jaccard", "h_precision", "h_recall")] == pytest.approx(expected)
    assert found["accuracy"] == float(predicted == true) and found["n"] == 1


@pytest.mark.parametrize("predicted, true, expected", [
    # (tie, lca_error, jaccard, precision, recall), worked out from A(n) = {n's ancestors, r}: n excluded
    ("a1", "a1", (0, 1, 1, 1, 1)),
    ("a2", "a1", (2, 1, 1, 1, 1)),  # a sibling: the same ancestors, so only the TIE sees the mistake
    ("b1", "a1", (4, 2, 1 / 3, 1 / 2, 1 / 2)),  # a cousin: {b, r} against {a, r}
    ("b1", "a", (3, 2, 1 / 2, 1 / 2, 1)),  # depths differ: {b, r} against {r}
])
def test_each_metric_as_worked_out_by_hand_with_hycoclips_ancestor_sets(predicted, true, expected):
    found = hierarchical_metrics([predicted], [true], SMALL, ["a1", "a2", "b1"])
    assert [found[k] for k in ("tie", "lca_error", "jaccard", "h_precision", "h_recall")] == pytest.approx(expected)


def test_a_prediction_at_the_root_has_no_ancestors_to_score_under_hycoclips_convention():
    with pytest.raises(ValueError, match="r is the tree's root"):
        hierarchical_metrics(["r"], ["a1"], SMALL, ["a1", "r"])


def test_metrics_are_means_over_images_and_mistakes_are_scored_beside_uniform_ones():
    found = hierarchical_metrics(["a1", "a2", "b1"], ["a1", "a1", "a1"], SMALL, ["a1", "a2", "b1"], "inclusive")
    assert found["tie"] == pytest.approx((0 + 2 + 4) / 3) and found["jaccard"] == pytest.approx((1 + 0.5 + 0.2) / 3)
    assert found["accuracy"] == pytest.approx(1 / 3) and found["n"] == 3
    # Two mistakes, TIE 2 and 4; a uniform mistake on a1 is a2 or b1 alike: (2 + 4) / 2 for each.
    assert found["mistakes"] == 2 and found["mistake_tie"] == 3 and found["random_mistake_tie"] == 3
    # Mistakes on b1 (uniformly a1 or a2 instead: 4) and on a1 (a2 or b1: 3), the model's mistakes both siblings'
    # where it can: it beats uniform mistakes at the same images.
    found = hierarchical_metrics(["a2", "a1", "a1"], ["a1", "b1", "a1"], SMALL, ["a1", "a2", "b1"])
    assert found["mistake_tie"] == (2 + 4) / 2 and found["random_mistake_tie"] == (3 + 4) / 2
    right = hierarchical_metrics(["a1"], ["a1"], SMALL, ["a1", "a2", "b1"])
    assert right["mistakes"] == 0 and right["mistake_tie"] is None and right["random_mistake_tie"] is None


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
    found = hierarchical_metrics([predicted], [true], GRAPH, ["a1", "b", "x1"], "inclusive")
    assert [found[k] for k in ("tie", "lca_error", "jaccard", "h_precision", "h_recall")] == pytest.approx(expected)
    assert GRAPH.root == "r" and set(GRAPH.ancestors("x1")) == {"x1", "x", "a", "b", "r"}


def test_guessing_scores_what_uniform_predictions_score():
    classes = ["a1", "a2", "b1"]
    found = chance(["a1"], classes, SMALL, "inclusive")
    assert found["tie"] == pytest.approx((0 + 2 + 4) / 3) and found["accuracy"] == pytest.approx(1 / 3)
    # Several images, a class true more often than another: every (guess, image) pair scored once.
    true = ["a1", "b1", "a1", "a2"]
    for convention in ("hycoclip", "inclusive"):
        pairs = hierarchical_metrics([p for _ in true for p in classes], [t for t in true for _ in classes], SMALL,
                                     classes, convention)
        found = chance(true, classes, SMALL, convention)
        assert {k: found[k] for k in found if k != "n"} == pytest.approx({k: pairs[k] for k in found if k != "n"})


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


def random_tree(rng: random.Random, size: int) -> tuple[dict[str, str], list[str]]:
    """A random tree rooted at n0 and its leaves."""
    parent = {f"n{i}": f"n{rng.randrange(i)}" for i in range(1, size)}
    leaves = sorted(set(parent) - set(parent.values()))
    return parent, leaves


def hycoclip_reference(predicted: list[str], true: list[str], parent: dict[str, str], include_self: bool) -> list[float]:
    """HyCoCLIP's ``hierarchical_based_metrics`` as its code defines them, written again over networkx: ancestor
    sets are ``nx.ancestors`` of the node in the parent -> child digraph (the root in, the node out, as its
    ``all_ancestors_indices.pkl`` holds them), TIE the shortest path in the undirected graph; summed, then
    divided by the count."""
    import networkx as nx

    graph = nx.DiGraph([(above, node) for node, above in parent.items()])
    undirected = graph.to_undirected()
    sums = [0.0] * 5
    for p, t in zip(predicted, true):
        a_p, a_t = nx.ancestors(graph, p) | ({p} if include_self else set()), nx.ancestors(graph, t) | ({t} if include_self else set())
        both, either = a_p & a_t, a_p | a_t
        for i, value in enumerate((nx.shortest_path_length(undirected, p, t), len(a_p) - len(both) + 1,
                                   len(both) / len(either), len(both) / len(a_p), len(both) / len(a_t))):
            sums[i] += value
    return [v / len(true) for v in sums]


@pytest.mark.parametrize("seed", range(6))
def test_the_metrics_are_hycoclips_code_on_random_trees_under_both_conventions(seed):
    rng = random.Random(seed)
    parent, leaves = random_tree(rng, rng.randrange(8, 80))
    true = [rng.choice(leaves) for _ in range(50)]
    predicted = [t if rng.random() < 0.3 else rng.choice(leaves) for t in true]
    tree = Tree.from_parent(parent)
    for convention, include_self in (("hycoclip", False), ("inclusive", True)):
        found = hierarchical_metrics(predicted, true, tree, leaves, convention)
        expected = hycoclip_reference(predicted, true, parent, include_self)
        assert [found[k] for k in ("tie", "lca_error", "jaccard", "h_precision", "h_recall")] == pytest.approx(expected)
    # The two conventions' LCA errors differ by the error rate exactly.
    inclusive = hierarchical_metrics(predicted, true, tree, leaves, "inclusive")
    hycoclip = hierarchical_metrics(predicted, true, tree, leaves, "hycoclip")
    assert inclusive["lca_error"] - hycoclip["lca_error"] == pytest.approx(1 - hycoclip["accuracy"])


def random_dag(rng: random.Random, size: int) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """A random rooted DAG (a node's parents are earlier nodes; a fifth have two) and its sinks."""
    parents = {}
    for i in range(1, size):
        above = {f"n{rng.randrange(i)}" for _ in range(2 if rng.random() < 0.2 else 1)}
        parents[f"n{i}"] = tuple(sorted(above))
    sinks = sorted(set(parents) - {p for above in parents.values() for p in above})
    return parents, sinks


@pytest.mark.parametrize("seed", range(8))
def test_pruning_a_graph_gives_a_tree_over_its_leaves_with_every_parent_an_ancestor_and_no_one_child_node(seed):
    import networkx as nx

    rng = random.Random(seed)
    parents, sinks = random_dag(rng, rng.randrange(10, 120))
    leaves = rng.sample(sinks, max(2, len(sinks) // 2))
    tree = prune(parents, leaves)
    found = Tree.from_parent(tree)
    graph = nx.DiGraph([(p, n) for n, above in parents.items() for p in above])
    children = {}
    for node, above in tree.items():
        children.setdefault(above, []).append(node)
    assert set(found.nodes) - set(children) == set(leaves)  # the leaves, and only they, have no children
    assert all(len(kids) > 1 for node, kids in children.items() if node not in leaves)
    assert all(above in nx.ancestors(graph, node) for node, above in tree.items())
    assert found.root in {n for n in graph if graph.in_degree(n) == 0} | set(nx.ancestors(graph, leaves[0]))
    assert prune({n: (p,) for n, p in tree.items()}, leaves) == tree  # a pruned tree prunes to itself


def test_pruning_keeps_the_parent_toward_the_preferred_node_then_the_most_specific():
    # x is under a (depth 1) and under c (depth 2, below b): the deeper c wins unless a reaches the preferred p.
    graph = {"a": ("r",), "b": ("r",), "c": ("b",), "x": ("a", "c"), "y": ("a",), "z": ("c",), "w": ("b",)}
    assert prune(graph, ["x", "y", "z", "w"])["x"] == "c"
    with_p = {**graph, "a": ("p",), "p": ("r",)}
    assert prune(with_p, ["x", "y", "z", "w"], prefer="p")["x"] == "a"
    # A chain with one child at each step is spliced out, the root included.
    assert prune({"a": ("r",), "b": ("a",), "l1": ("b",), "l2": ("b",)}, ["l1", "l2"]) == {"l1": "b", "l2": "b"}


def test_a_tasks_tree_over_part_of_the_classes_keeps_only_what_branches_above_them():
    # r -> a -> a1, a2; r -> b -> b1, b2. Over {a1, b1, b2}: a has one child left and goes.
    full = {"a": "r", "b": "r", "a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    assert restrict(full, ["a1", "b1", "b2"]) == {"a1": "r", "b": "r", "b1": "b", "b2": "b"}
    assert restrict(full, ["a1", "a2", "b1", "b2"]) == full
    assert collapse(full, set()) == full  # no node of it has one child


def test_two_trees_compared_by_hand():
    ours = {"a": "r", "b": "r", "a1": "a", "a2": "a", "b1": "b"}
    theirs = {"a": "r", "a1": "a", "a2": "a", "b1": "r"}  # b spliced out
    found = compare_trees(Tree.from_parent(ours), Tree.from_parent(theirs), ["a1", "a2", "b1"])
    assert (found["nodes"], found["nodes_against"], found["shared_nodes"]) == (6, 5, 5)
    assert found["same_parent"] == 3  # a, a1, a2 (b1's differs)
    assert found["same_ancestors"] == 2 and found["pairs"] == 3
    # TIEs (a1-a2, a1-b1, a2-b1): ours 2, 4, 4; theirs 2, 3, 3.
    assert found["equal_tie"] == pytest.approx(1 / 3) and found["tie_correlation"] == pytest.approx(1.0)
    assert found["mean_tie"] == pytest.approx(10 / 3) and found["mean_tie_against"] == pytest.approx(8 / 3)


def test_the_worlds_caption_order_holds_every_implied_pair_at_every_level():
    from euclip_cli.data.world import COLOURS, FAMILIES, FILLS, POSITIONS, SHAPES, SIZES, caption_order_pairs

    specs, pairs = caption_order_pairs()
    attributes = len(COLOURS) + len(SIZES) + len(FILLS) + len(POSITIONS)
    by_level = {}
    for a, b in pairs:
        key = (specs[a]["level"], specs[b]["level"])
        by_level[key] = by_level.get(key, 0) + 1
    # Counted from the world's sizes: each shape under its one family; each (shape, property) caption under its
    # shape, its family and its property; each (shape, size, colour) caption under those and its two one-property
    # captions.
    detailed, detailed2 = len(SHAPES) * attributes, len(SHAPES) * len(SIZES) * len(COLOURS)
    assert by_level == {("family", "shape"): len(SHAPES), ("family", "detailed"): detailed,
                        ("attribute", "detailed"): detailed, ("shape", "detailed"): detailed,
                        ("family", "detailed2"): detailed2, ("attribute", "detailed2"): 2 * detailed2,
                        ("shape", "detailed2"): detailed2, ("detailed", "detailed2"): 2 * detailed2}
    assert len(FAMILIES) == 3 and all(spec["mentions"] for spec in specs)


def test_the_order_score_tells_a_pair_from_its_reverse_only_where_the_geometry_says_so():
    """Points placed by hand in Euclidean space: each specific caption farther from the origin along its
    generic one's direction (inside its cone): both scores order every pair; mirrored, neither does."""
    import torch

    from euclip_cli.analysis.studies import order_study
    from euclip_cli.geometry import get_geometry

    g = get_geometry("euclidean", logit="d")
    texts = torch.tensor([[1.0, 0.0], [3.0, 0.2], [0.0, 1.0], [0.2, 3.0]])
    pairs = [(0, 1), (2, 3)]
    root = torch.zeros(2)
    found = order_study(g, None, texts, pairs, root, min_radius=0.1)
    assert found == {"root_order": {"roc_auc": 1.0, "pairs": 2}, "cone": {"roc_auc": 1.0, "pairs": 2}}
    found = order_study(g, None, texts, [(1, 0), (3, 2)], root, min_radius=0.1)
    assert found["root_order"]["roc_auc"] == 0.0 and found["cone"]["roc_auc"] == 0.0
    # A geometry without cones is scored by its distance from [ROOT] alone.
    assert set(order_study(get_geometry("clip"), None, torch.nn.functional.normalize(texts, dim=-1), pairs,
                           torch.tensor([1.0, 1.0]) / 2 ** 0.5, 0.1)) == {"root_order"}


@pytest.mark.parametrize("text, said", [
    ("n1 n2 n3\n", "t.txt:1: expected 'PARENT CHILD'"),
    ("n0 n1\nn0 n2\nn9 n1\n", "t.txt:3: n1 has a second parent"),
    ("n0 n1\nn5 n6\n", "a tree has one root, this file has 2"),
    ("n1 n2\nn2 n1\n", "this file has 0 (a cycle)"),
    (b"\xff\xfe\n", "cannot read the tree"),
])
def test_a_tree_file_that_is_not_one_tree_is_refused_naming_the_file_and_line(tmp_path, text, said):
    from euclip_cli.data.wordnet import read_isa
    from euclip_cli.errors import UsageError

    path = tmp_path / "t.txt"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UsageError, match=re.escape(said)):
        read_isa(path)
