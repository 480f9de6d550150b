"""Traversals on stub geometries whose answers are known, and the entailment filter against the cone formula."""

import math

import torch

from euclip_cli.analysis.traverse import dedupe, nearest_captions, traversal_points, traverse
from euclip_cli.data import world as W
from euclip_cli.geometry import get_geometry


def test_a_straight_walk_meets_captions_from_specific_to_generic():
    g = get_geometry("euclidean", logit="d")
    captions = torch.tensor([[4.0, 0.0], [2.0, 0.0], [0.2, 0.0], [0.0, 5.0]])  # specific, mid, generic, unrelated
    assert traverse(g, torch.tensor([4.0, 0.0]), torch.zeros(2), captions, steps=50) == [0, 1, 2]


def test_clip_points_stay_on_the_sphere_and_end_at_the_normalized_root():
    g = get_geometry("clip")
    z = torch.nn.functional.normalize(torch.tensor([1.0, 0.2, 0.0]), dim=0)
    root = torch.tensor([0.0, 0.3, 0.1])  # a mean of unit vectors: inside the ball
    points = traversal_points(g, z, root, 7)
    torch.testing.assert_close(points.norm(dim=1), torch.ones(7))
    torch.testing.assert_close(points[0], z)
    torch.testing.assert_close(points[-1], torch.nn.functional.normalize(root, dim=0))


def inside_cone(x, y, k):
    """The Euclidean cone test written out: ext(x, y) <= aper(x)."""
    aper = math.asin(min(1.0, k / x.norm().item()))
    d = y - x
    cos_ext = (d @ x / (d.norm() * x.norm())).clamp(-1, 1).item()
    return math.acos(cos_ext) <= aper + 1e-9


def test_the_entailment_filter_keeps_exactly_the_captions_whose_cone_holds_the_point():
    g = get_geometry("euclidean", logit="d")
    gen = torch.Generator().manual_seed(0)
    captions = torch.randn(40, 3, generator=gen)
    points = traversal_points(g, torch.tensor([3.0, 1.0, -1.0]), torch.zeros(3), 20)
    k = 0.5
    chosen = nearest_captions(g, points, captions, entail_k=k)
    unfiltered = nearest_captions(g, points, captions)
    differs = 0
    for s, point in enumerate(points):
        allowed = [c for c in range(len(captions)) if inside_cone(captions[c], point, k)]
        if not allowed:
            assert chosen[s] is None
            continue
        distances = {c: (captions[c] - point).norm().item() for c in allowed}
        assert chosen[s] == min(distances, key=distances.get)
        differs += chosen[s] != unfiltered[s]
    assert differs > 0  # the filter changed some answers, so the test exercised it


def test_dedupe_keeps_first_appearances():
    assert dedupe([3, 3, None, 1, 3, 2, 1]) == [3, 1, 2]


def test_the_world_vocabulary_spans_the_hierarchy_and_its_truth_is_exact():
    specs = W.traversal_vocabulary()
    assert {s["rank"] for s in specs} == {1, 2, 3, 4}
    scene = [W.Obj("star", "red", "large", "solid", "left")]
    true = {W.caption_text(s) for s in specs if W.entails(s, scene)}
    assert {"a symbol", "a red shape", "a star", "a red star", "a large red star", "one shape"} <= true
    assert "a circle" not in true and "a blue star" not in true and "two shapes" not in true
