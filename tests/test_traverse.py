"""Traversals on stub geometries whose answers are known, and the entailment filter against the cone formula."""

import math

import torch

import json

import pytest

from euclip_cli.analysis.traverse import (ROOT, caption_count, dedupe, nearest_captions, text_pool, traversal_points,
                                          traverse)
from euclip_cli.errors import UsageError
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


def test_with_root_in_the_pool_an_image_nearest_the_root_counts_no_caption():
    g = get_geometry("euclidean", logit="d")
    captions = torch.tensor([[4.0, 0.0], [2.0, 0.0], [0.0, 5.0]])
    walk = traverse(g, torch.tensor([4.0, 0.0]), torch.zeros(2), captions, steps=50, root_in_pool=True)
    # [ROOT] (the origin) wins the steps nearer it than to (2, 0): it ends the walk, uncounted.
    assert walk == [0, 1, ROOT] and caption_count(walk) == 2
    near_root = traverse(g, torch.tensor([0.3, 0.0]), torch.zeros(2), captions, steps=50, root_in_pool=True)
    assert near_root == [ROOT] and caption_count(near_root) == 0
    # Without [ROOT] as a candidate the same image is named by the nearest real caption.
    assert traverse(g, torch.tensor([0.3, 0.0]), torch.zeros(2), captions, steps=50) == [1]


def test_root_passes_every_entailment_filter():
    g = get_geometry("euclidean", logit="d")
    captions = torch.tensor([[0.0, 5.0]])  # its cone does not hold points on the x axis
    points = traversal_points(g, torch.tensor([3.0, 0.0]), torch.zeros(2), 5)
    assert nearest_captions(g, points, captions, entail_k=0.1) == [None] * 5
    assert nearest_captions(g, points, captions, entail_k=0.1, root=torch.zeros(2)) == [ROOT] * 5


def test_hyperbolic_scores_against_the_root_are_finite():
    # The origin's exponential map is the vertex; a NaN there would make argmax pick at random.
    g = get_geometry("hyperbolic", logit="d2")
    points = torch.randn(6, 4)
    walk = nearest_captions(g, points, torch.randn(3, 4) * 3, torch.tensor(1.0), root=torch.zeros(4))
    assert all(i is not None for i in walk)
    assert torch.isfinite(g.similarity(points, torch.zeros(1, 4), torch.tensor(1.0))).all()


def test_text_pool_reads_merus_layout_with_its_prompts(tmp_path):
    pool = tmp_path / "pexels_text.json"
    pool.write_text(json.dumps({"captions": ["avocado toast on a plate "], "nouns": ["cherry tomatoes"],
                                "adjectives": ["tasty"]}))
    texts = ["avocado toast on a plate ", "a photo of a cherry tomatoes.", "this photo is tasty."]
    assert text_pool(pool) == texts
    for name, lines in (("captions.txt", "avocado toast on a plate\n#sunday brunch\n"),
                        ("nouns.txt", "cherry tomatoes\n\n"), ("adjectives.txt", "tasty\n")):
        (tmp_path / name).write_text(lines)
    assert text_pool(None, tmp_path / "captions.txt", tmp_path / "nouns.txt", tmp_path / "adjectives.txt") == [
        "avocado toast on a plate", "#sunday brunch", "a photo of a cherry tomatoes.", "this photo is tasty."]


@pytest.mark.parametrize("content,message", [
    ('{"captions": ["a"], "tags": ["b"]}', "unknown key 'tags'"),
    ('{"nouns": "dog"}', "'nouns' must be a list of strings"),
    ('["a photo"]', "expected an object"),
    ('{"nouns": [', "not valid JSON"),
    ('{}', "needs candidate captions"),
])
def test_a_bad_text_pool_is_named(tmp_path, content, message):
    pool = tmp_path / "pool.json"
    pool.write_text(content)
    with pytest.raises(UsageError, match=message):
        text_pool(pool)
    with pytest.raises(UsageError, match="no such file"):
        text_pool(tmp_path / "missing.json")
    with pytest.raises(UsageError, match="one or the other"):
        text_pool(pool, nouns=pool)
