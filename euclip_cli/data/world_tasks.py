"""The embedded world's evaluation tasks: what each one renders and how it is labelled.

Groups mirror DataComp's: a main shape task (ImageNet's role), shifted renderings of it
(ImageNet distribution shifts), attribute tasks (VTAB) and image-caption retrieval.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from PIL import Image

from euclip_cli.data import world as w

Sample = tuple[Image.Image, object, list[w.Obj]]  # image, label (class index or caption list), scene
# A task's sampler: (generator, the world's object scale) -> one sample.
Sampler = Callable[[random.Random, float], Sample]


@dataclass(frozen=True)
class WorldTask:
    name: str  # folder name under data/world/eval/, and the task key "world/<name>"
    title: str
    group: Optional[str]  # "main", "shifts", "attributes", "retrieval"; None: in no group and no average
    classes: Optional[list[str]]  # class names with article; None for retrieval and selection
    sample: Sampler
    # Image-caption selection (each image's caption and a hard negative; ``hard_negative``), not retrieval.
    selection: bool = False


def _classify(count=1, palette=None, fill=None, clutter=False, line_width=2, label: Callable = None):
    def sample(rng: random.Random, scale: float = 1.0) -> Sample:
        scene = w.sample_scene(rng, count=count or rng.choice([1, 2, 3]), palette=palette, fill=fill)
        return w.render(scene, rng, clutter=clutter, line_width=line_width, scale=scale), label(scene), scene
    return sample


def _shape_label(scene):
    return w.SHAPES.index(scene[0].shape)


# The caption levels of each retrieval image, one caption per level.
RETRIEVAL_LEVELS = ("full", "detailed")


def _retrieval(rng: random.Random, scale: float = 1.0) -> Sample:
    scene = w.sample_scene(rng)
    captions = [w.frame_caption(w.sample_spec(scene, rng, level), rng) for level in RETRIEVAL_LEVELS]
    return w.render(scene, rng, scale=scale), captions, scene


# ---------------------------------------------------------------- hard negatives

# SugarCrepe's seven kinds of negative caption (Hsieh et al., NeurIPS 2023), as clip-benchmark names its splits.
NEGATIVE_KINDS = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
SIZE_SWAP = {"small": "large", "large": "small"}


def listing(mentions: list[dict]) -> str:
    """"a red circle on the left and a blue star at the top": the mentions joined, each with its article."""
    return " and ".join(w.article(w.describe(m)) for m in mentions)


def hard_negative(scene: list[w.Obj], kind: str, rng: random.Random) -> tuple[str, str]:
    """A caption true of a two-object ``scene`` (two colours, two shapes) and a negative of ``kind`` that is false
    of it, as close to the caption as the kind allows: a replaced word is, where the world has one, a word the
    image also shows (the other object's colour) or a near one (a shape of the same family); a swap moves
    words and adds none, so a bag of words cannot tell the two apart. Raises ValueError for a scene the kinds
    cannot use, and if the negative came out true (a bug)."""
    a, b = scene
    if len(scene) != 2 or a.colour == b.colour or a.shape == b.shape:
        raise ValueError("a hard negative needs two objects of different colours and shapes")
    ma, mb = ({"colour": o.colour, "shape": o.shape, "position": o.position} for o in (a, b))
    caption = [ma, mb]
    if kind == "replace_att":
        negative = [dict(ma, colour=b.colour), mb]
    elif kind == "replace_obj":
        negative = [dict(ma, shape=rng.choice([s for s in w.TAXONOMY[a.family] if s != a.shape])), mb]
    elif kind == "replace_rel":  # the world's relation is where an object stands: moved to a free place
        negative = [dict(ma, position=rng.choice([p for p in w.POSITIONS if p not in (a.position, b.position)])), mb]
    elif kind == "swap_att":
        negative = [dict(ma, colour=b.colour), dict(mb, colour=a.colour)]
    elif kind == "swap_obj":
        negative = [dict(ma, shape=b.shape), dict(mb, shape=a.shape)]
    elif kind == "add_att":  # a size the object does not have (the other's, where theirs differ)
        negative = [dict(ma, size=SIZE_SWAP[a.size]), mb]
    elif kind == "add_obj":  # the caption names one object; the negative adds one the scene does not hold
        caption = [ma]
        negative = [ma, dict(mb, shape=rng.choice([s for s in w.SHAPES if s not in (a.shape, b.shape)]))]
    else:
        raise ValueError(f"unknown kind of negative {kind!r}: one of {', '.join(NEGATIVE_KINDS)}")
    if not w.entails({"mentions": caption}, scene) or w.entails({"mentions": negative}, scene):
        raise ValueError(f"the {kind} pair of this scene is not (true, false): {listing(caption)!r}, {listing(negative)!r}")
    return listing(caption), listing(negative)


def _hard_negatives(rng: random.Random, scale: float = 1.0) -> Sample:
    """A two-object scene (two colours, two shapes) and ``{"kind", "captions": [caption, negative]}``."""
    while True:
        scene = w.sample_scene(rng, count=2)
        if scene[0].colour != scene[1].colour and scene[0].shape != scene[1].shape:
            break
    kind = rng.choice(NEGATIVE_KINDS)
    return w.render(scene, rng, scale=scale), {"kind": kind, "captions": list(hard_negative(scene, kind, rng))}, scene


def tokens(caption: str) -> list[str]:
    return caption.lower().replace(",", " ").replace(":", " ").split()


class BigramScorer:
    """A text-only baseline that never sees an image: a bigram language model of the world's training
    captions (add-one smoothing over their vocabulary and one unknown word), scoring a caption by its total
    log-probability, as a grammar model would: so a longer caption scores lower, the artefact SugarCrepe's
    authors found in add-negatives, and a swap that reads as the training captions read scores higher."""

    def __init__(self, captions: list[str]):
        self.pairs, self.firsts, self.captions = Counter(), Counter(), len(captions)
        for caption in captions:
            words = ["<s>", *tokens(caption), "</s>"]
            self.pairs.update(zip(words, words[1:]))
            self.firsts.update(words[:-1])
        self.vocabulary = len({w for pair in self.pairs for w in pair}) + 1  # + the unknown word

    def score(self, caption: str) -> float:
        words = ["<s>", *tokens(caption), "</s>"]
        return sum(np.log((self.pairs[(x, y)] + 1) / (self.firsts[x] + self.vocabulary)) for x, y in zip(words, words[1:]))

    def picks_caption(self, caption: str, negative: str) -> float:
        """1 where the caption scores above its negative, 0 below, 0.5 on a tie (a coin)."""
        mine, theirs = self.score(caption), self.score(negative)
        return 0.5 if mine == theirs else float(mine > theirs)


SHAPE_CLASSES = [w.article(s) for s in w.SHAPES]

WORLD_TASKS: list[WorldTask] = [
    WorldTask("shapes", "Shapes", "main", SHAPE_CLASSES, _classify(label=_shape_label)),
    WorldTask("shapes-outline", "Shapes, thin outlines", "shifts", SHAPE_CLASSES,
              _classify(fill="outlined", line_width=1, label=_shape_label)),
    WorldTask("shapes-palette", "Shapes, unseen colours", "shifts", SHAPE_CLASSES,
              _classify(palette=list(w.UNSEEN_COLOURS), label=_shape_label)),
    WorldTask("shapes-clutter", "Shapes, clutter and noise", "shifts", SHAPE_CLASSES,
              _classify(clutter=True, label=_shape_label)),
    WorldTask("colour", "Colour", "attributes", [w.article(f"{c} shape") for c in w.COLOURS],
              _classify(label=lambda s: list(w.COLOURS).index(s[0].colour))),
    WorldTask("count", "Count", "attributes", ["one shape", "two shapes", "three shapes"],
              _classify(count=None, label=lambda s: len(s) - 1)),
    WorldTask("size", "Size", "attributes", [w.article(f"{s} shape") for s in w.SIZES],
              _classify(label=lambda s: list(w.SIZES).index(s[0].size))),
    WorldTask("position", "Position", "attributes", [w.article("shape " + w.POSITION_PHRASE[p]) for p in w.POSITIONS],
              _classify(label=lambda s: list(w.POSITIONS).index(s[0].position))),
    WorldTask("family", "Shape family", "attributes", [w.article(f) for f in w.FAMILIES],
              _classify(label=lambda s: w.FAMILIES.index(s[0].family))),
    WorldTask("retrieval", "Image-caption retrieval", "retrieval", None, _retrieval),
    WorldTask("hard-negatives", "Hard negatives, SugarCrepe's seven kinds", None, None, _hard_negatives,
              selection=True),
]


# ---------------------------------------------------------------- ceilings

# The retrieval sampler's "detailed" captions pin 1 to 3 of these besides the shape (world.sample_spec).
_DETAIL_KEYS = ("colour", "size", "fill", "position")


def retrieval_specs(scene: list[w.Obj], captions: list[str]) -> list[dict]:
    """The caption specs ``_retrieval`` drew ``captions`` (one per ``RETRIEVAL_LEVELS``) from, recovered
    from their text: every spec of that level true of the scene is written out until one reads the same.
    Raises ValueError where none does (captions of another sampler)."""
    full = {"level": "full", "count": len(scene),
            "mentions": [{"shape": o.shape, "colour": o.colour, "size": o.size, "fill": o.fill,
                          "position": o.position} for o in scene]}
    detailed = [{"level": "detailed", "mentions": [{"shape": o.shape, **{k: getattr(o, k) for k in keys}}]}
                for o in scene for n in (1, 2, 3) for keys in itertools.combinations(_DETAIL_KEYS, n)]
    candidates = {"full": [full], "detailed": detailed}
    specs = []
    for level, text in zip(RETRIEVAL_LEVELS, captions):
        found = next((s for s in candidates[level] for frame in (["{c}"] if level == "full" else w.FRAMES)
                      if frame.format(c=w.caption_text(s)) == text), None)
        if found is None:
            raise ValueError(f"no {level} caption of this scene reads {text!r}")
        specs.append(found)
    return specs


def caption_likelihood(spec: dict, scene: list[w.Obj]) -> float:
    """P(the retrieval sampler writes ``spec``'s caption | the scene), up to a factor every scene shares.

    A full caption lists every object in the scene's order, which the image does not show: each scene
    holding the same objects writes it with the same probability, others never. A detailed caption
    describes one object drawn uniformly from the scene, with a key set and a frame drawn independently
    of the scene: (objects it is true of) / (objects in the scene).
    """
    if spec["level"] == "full":
        return float(len(scene) == len(spec["mentions"])
                     and all(sum(w.mention_matches(m, o) for o in scene) == 1 for m in spec["mentions"]))
    (mention,) = spec["mentions"]
    return sum(w.mention_matches(mention, o) for o in scene) / len(scene)


def retrieval_ceiling(scenes: list[list[w.Obj]], specs: list[list[dict]]) -> dict[str, float]:
    """The best recall@1 any model can expect on a retrieval set (image ``i`` with captions ``specs[i]``),
    each way and their mean (DataComp's ``mean_recall@1``), as fractions.

    Many captions are true of several images ("a picture of a small crescent"), so a perfect model is
    still unsure which one a caption came from: the posterior of image j is its ``caption_likelihood``
    over the sum of all images' (each caption's source is one image, a priori any). The best guess is
    the most probable image (text to image), or for an image the caption most probably its own (image
    to text); the ceiling is the mean of those posteriors. Shapes and colours are assumed readable from
    every image: this is the limit the captions set, not the pixels.
    """
    likelihood = np.array([[caption_likelihood(s, scene) for scene in scenes] for own in specs for s in own])
    posterior = likelihood / likelihood.sum(axis=1, keepdims=True)  # every caption is true of its own image
    text_to_image = posterior.max(axis=1).mean()
    image_to_text = posterior.max(axis=0).mean()
    return {"image_retrieval_recall@1": float(text_to_image), "text_retrieval_recall@1": float(image_to_text),
            "mean_recall@1": float((text_to_image + image_to_text) / 2)}
