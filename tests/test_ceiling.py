"""A world task's ceiling: the best score its labels or captions let any model expect."""

import random

import pytest

from euclip_cli.data import world as w
from euclip_cli.data.world_tasks import (RETRIEVAL_LEVELS, WORLD_TASKS, caption_likelihood, retrieval_ceiling,
                                         retrieval_specs)

RETRIEVAL = next(t for t in WORLD_TASKS if t.name == "retrieval")


def obj(shape, colour, size, position, fill="solid"):
    return w.Obj(shape=shape, colour=colour, size=size, fill=fill, position=position)


def full(scene):
    return {"level": "full", "count": len(scene),
            "mentions": [{"shape": o.shape, "colour": o.colour, "size": o.size, "fill": o.fill, "position": o.position}
                         for o in scene]}


def detailed(**mention):
    return {"level": "detailed", "mentions": [mention]}


def test_the_retrieval_sets_captions_give_back_the_specs_they_were_drawn_from():
    rng = random.Random(3)
    for _ in range(300):
        image, captions, scene = RETRIEVAL.sample(rng)
        specs = retrieval_specs(scene, captions)
        assert [s["level"] for s in specs] == list(RETRIEVAL_LEVELS)
        for spec, text in zip(specs, captions):
            assert w.entails(spec, scene) and w.caption_text(spec) in text
    with pytest.raises(ValueError, match="no detailed caption of this scene reads 'a green star'"):
        retrieval_specs([obj("star", "red", "small", "left")], [w.caption_text(full([obj("star", "red", "small", "left")])),
                                                                 "a green star"])


def test_a_captions_likelihood_is_how_often_the_sampler_writes_it():
    """Simulated: the sampler's own frequencies of one detailed text from two scenes, against the ratio of
    the likelihoods (1 object of 1 against 1 of 2), and zero where the caption is false."""
    alone = [obj("star", "red", "small", "left")]
    shared = [obj("star", "red", "small", "top"), obj("circle", "blue", "large", "right")]
    other = [obj("circle", "blue", "large", "middle")]
    spec = detailed(shape="star", size="small")
    text = w.caption_text(spec)
    rng = random.Random(0)
    counts = {}
    for name, scene in (("alone", alone), ("shared", shared), ("other", other)):
        counts[name] = sum(w.caption_text(w.sample_spec(scene, rng, "detailed")) == text for _ in range(24000))
    assert counts["other"] == 0 and caption_likelihood(spec, other) == 0
    assert caption_likelihood(spec, alone) / caption_likelihood(spec, shared) == 2
    assert counts["alone"] / counts["shared"] == pytest.approx(2, rel=0.15)
    assert counts["alone"] / 24000 == pytest.approx(1 / 12, rel=0.1)  # one key of four, one of three key counts


def test_the_retrieval_ceiling_by_hand():
    a = [obj("star", "red", "small", "left")]
    d = [obj("star", "red", "small", "left")]  # the same objects as a: the same full caption
    f = [obj("star", "red", "small", "top"), obj("circle", "blue", "large", "right")]
    g = [obj("circle", "blue", "large", "middle")]
    scenes = [a, f, g, d]
    specs = [[full(a), detailed(shape="star", size="small")], [full(f), detailed(shape="circle", colour="blue")],
             [full(g), detailed(shape="circle", position="middle")], [full(d), detailed(shape="star", colour="red")]]
    ceiling = retrieval_ceiling(scenes, specs)
    # Text to image, the best posterior per caption: full(a) and full(d) 1/2 each (a and d alike), full(f)
    # and full(g) 1; "small star" and "red star" 1 / (1 + 1/2 + 1) for a, f (one star of two), d;
    # "blue circle" 1 / (1/2 + 1); "circle in the middle" 1.
    assert ceiling["image_retrieval_recall@1"] == pytest.approx((0.5 + 1 + 1 + 0.5 + 0.4 + 2 / 3 + 1 + 0.4) / 8)
    # Image to text: a and d are each at best 1/2 sure of a caption; f and g have their own full caption.
    assert ceiling["text_retrieval_recall@1"] == pytest.approx((0.5 + 1 + 1 + 0.5) / 4)
    assert ceiling["mean_recall@1"] == pytest.approx((ceiling["image_retrieval_recall@1"] + 0.75) / 2)


def test_a_retrieval_set_of_distinct_full_captions_alone_has_a_ceiling_of_one():
    rng = random.Random(1)
    scenes = [w.sample_scene(rng, count=3) for _ in range(40)]
    assert len({str(sorted(map(str, full(s)["mentions"]))) for s in scenes}) == 40
    assert retrieval_ceiling(scenes, [[full(s)] for s in scenes])["mean_recall@1"] == 1


def test_the_generated_worlds_retrieval_ceiling_is_read_from_its_files(world):
    from euclip_cli.data.world_files import task_ceiling

    eval_dir = world / "eval"
    assert task_ceiling(eval_dir, "shapes") == 1
    ceiling = task_ceiling(eval_dir, "retrieval")
    assert 0.5 < ceiling < 1
