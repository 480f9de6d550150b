"""The embedded world: a procedurally generated, hierarchical image-caption dataset.

Scenes hold 1-3 objects. Each object has a shape from a three-level taxonomy
(shape -> family -> the root "shape"), a colour, a size, a fill and a position.
Captions are sampled at five levels of specificity, from "a polygon" (true of many
images) to a full description of every object, and each caption carries a structured
*spec* from which ``entails(spec, scene)`` decides, exactly, whether the caption is
true of an image: the ground truth the entailment losses are about.

Everything is deterministic from a seed. Rendering is plain PIL polygons at 64x64.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import asdict, dataclass
from typing import NamedTuple, Optional, Sequence

from PIL import Image, ImageDraw

IMAGE_SIZE = 64

TAXONOMY: dict[str, list[str]] = {
    "polygon": ["triangle", "square", "pentagon", "hexagon"],
    "round shape": ["circle", "oval", "semicircle", "crescent"],
    "symbol": ["star", "cross", "arrow", "heart"],
}
FAMILY_OF = {shape: family for family, shapes in TAXONOMY.items() for shape in shapes}
SHAPES = [shape for shapes in TAXONOMY.values() for shape in shapes]
FAMILIES = list(TAXONOMY)

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 40, 40), "green": (40, 165, 60), "blue": (40, 80, 220), "yellow": (235, 200, 30),
    "purple": (135, 55, 190), "orange": (245, 130, 20), "pink": (240, 120, 185), "cyan": (30, 190, 205),
}
# Never used in training: the palette shift renders shapes in these.
UNSEEN_COLOURS: dict[str, tuple[int, int, int]] = {
    "brown": (125, 75, 35), "teal": (0, 115, 115), "olive": (120, 120, 20), "navy": (20, 30, 110), "black": (25, 25, 25),
}
SIZES = {"small": (9.0, 11.0), "large": (13.5, 16.0)}
FILLS = ["solid", "outlined"]
POSITIONS: dict[str, tuple[int, int]] = {
    "left": (16, 32), "right": (48, 32), "top": (32, 16), "bottom": (32, 48), "middle": (32, 32),
}
POSITION_PHRASE = {"left": "on the left", "right": "on the right", "top": "at the top",
                   "bottom": "at the bottom", "middle": "in the middle"}
COUNT_WORDS = {1: "one", 2: "two", 3: "three"}
# Caption levels from generic to specific, with their share of training captions.
LEVELS = {"family": 0.10, "attribute": 0.10, "shape": 0.25, "detailed": 0.30, "full": 0.25}
# Sentence frames around a noun phrase; also the zero-shot templates of the world's tasks.
FRAMES = ["{c}", "a picture of {c}", "a drawing of {c}", "an image of {c}"]


def _regular(n: int, phase: float) -> list[tuple[float, float]]:
    return [(math.cos(phase + 2 * math.pi * k / n), math.sin(phase + 2 * math.pi * k / n)) for k in range(n)]


def _outline(shape: str) -> list[tuple[float, float]]:
    """The shape's boundary as a polygon in unit coordinates (y down), radius about 1."""
    up = -math.pi / 2
    if shape in ("triangle", "pentagon", "hexagon"):
        return _regular({"triangle": 3, "pentagon": 5, "hexagon": 6}[shape], up)
    if shape == "square":
        return [(x * 0.8, y * 0.8) for x, y in [(-1, -1), (1, -1), (1, 1), (-1, 1)]]
    if shape == "circle":
        return _regular(40, 0)
    if shape == "oval":
        return [(x, 0.55 * y) for x, y in _regular(40, 0)]
    if shape == "semicircle":
        return [(math.cos(a), -math.sin(a) + 0.4) for a in (math.pi * k / 20 for k in range(21))]
    if shape == "crescent":
        outer = [(math.cos(a), math.sin(a)) for a in (math.radians(d) for d in range(40, 321, 10))]
        inner = [(0.45 + 0.8 * math.cos(a), 0.8 * math.sin(a)) for a in (math.radians(d) for d in range(300, 59, -10))]
        return outer + inner
    if shape == "star":
        return [(r * x, r * y) for k, (x, y) in enumerate(_regular(10, up)) for r in [1.0 if k % 2 == 0 else 0.42]]
    if shape == "cross":
        a, b = 0.33, 1.0
        return [(-a, -b), (a, -b), (a, -a), (b, -a), (b, a), (a, a), (a, b), (-a, b), (-a, a), (-b, a), (-b, -a), (-a, -a)]
    if shape == "arrow":
        return [(-1, -0.25), (0.2, -0.25), (0.2, -0.7), (1, 0), (0.2, 0.7), (0.2, 0.25), (-1, 0.25)]
    if shape == "heart":
        pts = [(16 * math.sin(t) ** 3, -(13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)))
               for t in (2 * math.pi * k / 40 for k in range(40))]
        return [(x / 17, (y + 2) / 17) for x, y in pts]
    raise ValueError(shape)


OUTLINES = {shape: _outline(shape) for shape in SHAPES}


@dataclass
class Obj:
    shape: str
    colour: str
    size: str
    fill: str
    position: str

    @property
    def family(self) -> str:
        return FAMILY_OF[self.shape]


# ---------------------------------------------------------------- scenes

def sample_scene(rng: random.Random, count: Optional[int] = None, palette: Optional[list[str]] = None,
                 fill: Optional[str] = None, positions: Optional[list[str]] = None) -> list[Obj]:
    """1-3 objects in distinct positions; arguments pin what a task controls."""
    count = count or rng.choices([1, 2, 3], weights=[0.7, 0.2, 0.1])[0]
    cells = rng.sample(positions or list(POSITIONS), count)
    return [Obj(shape=rng.choice(SHAPES), colour=rng.choice(palette or list(COLOURS)), size=rng.choice(list(SIZES)),
                fill=fill or rng.choices(FILLS, weights=[0.8, 0.2])[0], position=cell) for cell in cells]


# A box: (left, top, right, bottom) in pixels, right and bottom exclusive (PIL's crop box).
Box = tuple[int, int, int, int]


def render(scene: list[Obj], rng: random.Random, clutter: bool = False, line_width: int = 2,
           scale: float = 1.0) -> Image.Image:
    """Draw a scene, each object's radius ``scale`` times its size's; colours and positions get a little
    jitter so no two renderings are identical. The random draws do not depend on ``scale``."""
    return render_with_boxes(scene, rng, clutter, line_width, scale)[0]


def render_with_boxes(scene: list[Obj], rng: random.Random, clutter: bool = False, line_width: int = 2,
                      scale: float = 1.0) -> tuple[Image.Image, list[Box]]:
    """``render``, and each object's box as drawn: the extent of its outline, widened by the line's width
    (an outlined shape's stroke straddles it) and clipped to the image. The same random draws as ``render``."""
    boxes: list[Box] = []
    shade = rng.randint(205, 245)
    img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (shade, shade + rng.randint(-6, 6), shade + rng.randint(-6, 6)))
    draw = ImageDraw.Draw(img)
    if clutter:
        for _ in range(8):
            grey = rng.randint(90, 200)
            draw.line([(rng.uniform(0, 64), rng.uniform(0, 64)), (rng.uniform(0, 64), rng.uniform(0, 64))],
                      fill=(grey, grey, grey), width=1)
        pixels = img.load()
        for _ in range(500):
            x, y, v = rng.randrange(64), rng.randrange(64), rng.randint(0, 255)
            pixels[x, y] = (v, v, v)
    for obj in scene:
        base = COLOURS.get(obj.colour) or UNSEEN_COLOURS[obj.colour]
        colour = tuple(min(255, max(0, c + rng.randint(-12, 12))) for c in base)
        cx, cy = POSITIONS[obj.position]
        cx, cy = cx + rng.uniform(-3, 3), cy + rng.uniform(-3, 3)
        radius = rng.uniform(*SIZES[obj.size]) * scale
        pts = [(cx + radius * x, cy + radius * y) for x, y in OUTLINES[obj.shape]]
        if obj.fill == "solid":
            draw.polygon(pts, fill=colour)
        else:
            draw.polygon(pts, outline=colour, width=line_width)
        xs, ys = [x for x, _ in pts], [y for _, y in pts]
        boxes.append((max(0, math.floor(min(xs)) - line_width), max(0, math.floor(min(ys)) - line_width),
                      min(IMAGE_SIZE, math.ceil(max(xs)) + line_width), min(IMAGE_SIZE, math.ceil(max(ys)) + line_width)))
    return img, boxes


def box_image(image: Image.Image, box: Box) -> Image.Image:
    """The box's crop as HyCoCLIP's data preparation makes it (``utils/prepare_GRIT_webdataset.py``, resize mode
    "border"), padded with white to a square, the crop in the middle; at its own size, where HyCoCLIP also
    scales it to its training size (224): the loader's transform scales it as it scales every image, and a
    small crop is a small file."""
    crop = image.crop(box)
    side = max(crop.size)
    square = Image.new("RGB", (side, side), (255, 255, 255))
    square.paste(crop, ((side - crop.width) // 2, (side - crop.height) // 2))
    return square


def grounded_boxes(spec: dict, scene: list[Obj], boxes: list[Box]) -> list[tuple[Box, str]]:
    """The caption's phrases that name an object of the scene, each with that object's box: what a grounding
    model gives GRIT (a phrase of the caption, its box). A phrase is a mention as the caption words it
    ("a small red triangle on the left"), boxed on the first object it describes; a mention of no object in
    the scene (a mismatched caption's, or a count's) has no box. Phrases are kept once each, as HyCoCLIP
    keeps each noun chunk's text once."""
    found: list[tuple[Box, str]] = []
    for mention in spec["mentions"]:
        text = article(describe(mention))
        match = next((box for obj, box in zip(scene, boxes) if mention_matches(mention, obj)), None)
        if match is not None and text not in [t for _, t in found]:
            found.append((match, text))
    return found


def encode_jpeg(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95)  # img2dataset's default encode_quality
    return buf.getvalue()


# ---------------------------------------------------------------- captions

def article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("s", "x")) else "s")


def describe(mention: dict) -> str:
    """Noun phrase without article for a mention such as {colour: red, shape: star}."""
    words = [mention[k] for k in ("size", "colour", "fill") if k in mention]
    noun = mention.get("shape") or mention.get("family") or "shape"
    phrase = " ".join(words + [noun])
    if "position" in mention:
        phrase += " " + POSITION_PHRASE[mention["position"]]
    return phrase


def caption_text(spec: dict) -> str:
    """The noun phrase of a caption spec, with article or count word."""
    mentions = spec["mentions"]
    if spec.get("count") and not mentions:
        n = spec["count"]
        return f"{COUNT_WORDS[n]} {'shape' if n == 1 else 'shapes'}"
    if spec.get("count", 1) > 1 or len(mentions) > 1:
        parts = [article(describe(m)) for m in mentions]
        listing = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        return f"{COUNT_WORDS[spec['count']]} shapes: {listing}"
    return article(describe(mentions[0]))


def sample_spec(scene: list[Obj], rng: random.Random, level: str) -> dict:
    """A caption spec true of ``scene`` at the given level of specificity."""
    obj = rng.choice(scene)
    if level == "family":
        return {"level": level, "mentions": [{"family": obj.family}]}
    if level == "attribute":
        key = rng.choice(["colour", "size", "fill", "position", "count"])
        if key == "count":
            return {"level": level, "count": len(scene), "mentions": []}
        return {"level": level, "mentions": [{key: getattr(obj, key)}]}
    if level == "shape":
        return {"level": level, "mentions": [{"shape": obj.shape}]}
    if level == "detailed":
        keys = rng.sample(["colour", "size", "fill", "position"], rng.randint(1, 3))
        return {"level": level, "mentions": [{"shape": obj.shape, **{k: getattr(obj, k) for k in keys}}]}
    mentions = [{"shape": o.shape, "colour": o.colour, "size": o.size, "fill": o.fill, "position": o.position}
                for o in scene]
    return {"level": "full", "count": len(scene), "mentions": mentions}


def frame_caption(spec: dict, rng: random.Random) -> str:
    text = caption_text(spec)
    return text if spec["level"] == "full" else rng.choice(FRAMES).format(c=text)


def mention_matches(mention: dict, obj: Obj) -> bool:
    return all(getattr(obj, key) == value for key, value in mention.items())


def entails(spec: dict, scene: list[Obj]) -> bool:
    """True when the caption of ``spec`` is a true description of the scene."""
    if spec.get("count") and spec["count"] != len(scene):
        return False
    return all(any(mention_matches(m, o) for o in scene) for m in spec["mentions"])


def scene_json(scene: list[Obj]) -> list[dict]:
    return [asdict(o) for o in scene]


def scene_from_json(objects: list[dict]) -> list[Obj]:
    return [Obj(**o) for o in objects]


# ---------------------------------------------------------------- training pairs

class TrainingPair(NamedTuple):
    image: Image.Image
    caption: str
    spec: dict
    scene: list[Obj]
    mismatched: bool
    boxes: list[Box]  # each object's, in the scene's order


def training_pair(rng: random.Random, mismatch: float, count: Optional[int] = None,
                  levels: Sequence[str] = tuple(LEVELS), scale: float = 1.0) -> TrainingPair:
    """One (image, caption) pair; with probability ``mismatch`` the caption describes another scene.
    Objects are drawn at ``scale`` times their size (``render``).

    ``count`` pins the objects per scene and ``levels`` narrows the caption levels (at their relative
    weights in ``LEVELS``); the world itself uses neither, the tower probe in examples/ does.
    """
    scene = sample_scene(rng, count=count)
    image, boxes = render_with_boxes(scene, rng, scale=scale)
    level = rng.choices(list(levels), weights=[LEVELS[name] for name in levels])[0]
    mismatched = rng.random() < mismatch
    spec = sample_spec(sample_scene(rng, count=count) if mismatched else scene, rng, level)
    return TrainingPair(image, frame_caption(spec, rng), spec, scene, mismatched, boxes)


# ---------------------------------------------------------------- traversal vocabulary

# Specificity of a single-object caption: how many properties it pins down.
SPECIFICITY = {"family": 1, "attribute": 1, "shape": 2, "detailed": 3, "detailed2": 4}


def traversal_vocabulary() -> list[dict]:
    """Every single-object caption spec from generic to specific, each with its ``rank`` (SPECIFICITY).

    Families and single attributes (rank 1), shapes (2), a shape with one property (3) and a
    shape with colour and size (4): the hierarchy a traversal towards [ROOT] should climb.
    """
    specs: list[dict] = [{"level": "family", "mentions": [{"family": f}]} for f in FAMILIES]
    attributes = [("colour", c) for c in COLOURS] + [("size", s) for s in SIZES] + \
                 [("fill", f) for f in FILLS] + [("position", p) for p in POSITIONS]
    specs += [{"level": "attribute", "mentions": [{k: v}]} for k, v in attributes]
    specs += [{"level": "attribute", "count": n, "mentions": []} for n in COUNT_WORDS]
    specs += [{"level": "shape", "mentions": [{"shape": s}]} for s in SHAPES]
    specs += [{"level": "detailed", "mentions": [{"shape": s, k: v}]} for s in SHAPES for k, v in attributes]
    specs += [{"level": "detailed2", "mentions": [{"shape": s, "size": z, "colour": c}]}
              for s in SHAPES for z in SIZES for c in COLOURS]
    for spec in specs:
        spec["rank"] = SPECIFICITY[spec["level"]]
    return specs


def _implies(specific: dict, generic: dict) -> bool:
    """Whether the one object ``specific`` describes is always one ``generic`` describes: each property the
    generic caption names is the specific one's (a family is named by any of its shapes)."""
    (s,), (g,) = specific["mentions"], generic["mentions"]
    for key, value in g.items():
        if key == "family":
            if FAMILY_OF.get(s.get("shape")) != value:
                return False
        elif s.get(key) != value:
            return False
    return True


def caption_order_pairs() -> tuple[list[dict], list[tuple[int, int]]]:
    """``(specs, pairs)``: the single-object captions of ``traversal_vocabulary`` that name a property (the
    object counts name none), and every ``(generic, specific)`` pair of indices into them where the
    specific caption is of higher rank and its object is always the generic one's ("a polygon" above "a
    triangle" above "a red triangle" above "a small red triangle"; "red" above "a red triangle"): the
    partial order entailment is trained to keep, at every level of the world's captions."""
    specs = [spec for spec in traversal_vocabulary() if spec["mentions"]]
    pairs = [(i, j) for i, g in enumerate(specs) for j, s in enumerate(specs)
             if s["rank"] > g["rank"] and _implies(s, g)]
    return specs, pairs
