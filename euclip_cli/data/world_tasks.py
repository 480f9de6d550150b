"""The embedded world's evaluation tasks: what each one renders and how it is labelled.

Groups mirror DataComp's: a main shape task (ImageNet's role), shifted renderings of it
(ImageNet distribution shifts), attribute tasks (VTAB) and image-caption retrieval.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Optional

from PIL import Image

from euclip_cli.data import world as w

Sample = tuple[Image.Image, object, list[w.Obj]]  # image, label (class index or caption list), scene


@dataclass(frozen=True)
class WorldTask:
    name: str  # folder name under data/world/eval/, and the task key "world/<name>"
    title: str
    group: str  # "main", "shifts", "attributes", "retrieval"
    classes: Optional[list[str]]  # class names with article; None for retrieval
    sample: Callable[[random.Random], Sample]


def _classify(count=1, palette=None, fill=None, clutter=False, line_width=2, label: Callable = None):
    def sample(rng: random.Random) -> Sample:
        scene = w.sample_scene(rng, count=count or rng.choice([1, 2, 3]), palette=palette, fill=fill)
        return w.render(scene, rng, clutter=clutter, line_width=line_width), label(scene), scene
    return sample


def _shape_label(scene):
    return w.SHAPES.index(scene[0].shape)


# The caption levels of each retrieval image, one caption per level.
RETRIEVAL_LEVELS = ("full", "detailed")


def _retrieval(rng: random.Random) -> Sample:
    scene = w.sample_scene(rng)
    captions = [w.frame_caption(w.sample_spec(scene, rng, level), rng) for level in RETRIEVAL_LEVELS]
    return w.render(scene, rng), captions, scene


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
]
