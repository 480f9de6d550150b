"""Image traversals (the paper's appendix B): walk from an image embedding to [ROOT], name each step.

50 equally spaced points from the image to [ROOT] are interpolated in the geometry's own
coordinates and projected back (CLIP: normalize, interpolate, re-normalize; Euclidean:
interpolate; hyperbolic: interpolate the tangent vectors, the exponential map happens inside
``similarity``). Each point is named by its nearest caption in the model's geometry,
optionally only among captions whose entailment cone contains the point (radius K).
Repeated captions are dropped, first occurrence kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from euclip_cli.errors import UsageError
from euclip_cli.geometry import Geometry
from euclip_cli.readers import read_text


def traversal_points(geometry: Geometry, z: torch.Tensor, root: torch.Tensor, steps: int) -> torch.Tensor:
    """``(D,), (D,) -> (steps, D)``: from ``z`` (t = 0) to [ROOT] (t = 1)."""
    t = torch.linspace(0, 1, steps, dtype=z.dtype, device=z.device)[:, None]
    return geometry.project((1 - t) * z + t * root)


ROOT = -1  # a traversal's index for [ROOT] itself, when [ROOT] is a candidate caption


def nearest_captions(geometry: Geometry, points: torch.Tensor, captions: torch.Tensor,
                     curv: Optional[torch.Tensor] = None, entail_k: Optional[float] = None,
                     root: Optional[torch.Tensor] = None) -> list[Optional[int]]:
    """For each point ``(S, D)`` the index of its nearest caption ``(C, D)``; None where the filter leaves none.

    With ``entail_k``, only captions x whose cone (radius K) contains the point y are candidates.
    With ``root (D,)``, [ROOT] is a candidate too (index ``ROOT``), and passes every entailment
    filter: the root entails everything (MERU's and the EuCLIP authors' traversal scripts).
    """
    pool = captions if root is None else torch.cat([captions, root[None]])
    scores = geometry.similarity(points, pool, curv)  # (S, C) or (S, C + 1)
    if entail_k is not None:
        inside = geometry.entails(pool[None], points[:, None], entail_k, curv)  # (S, C) or (S, C + 1)
        if root is not None:
            inside[:, -1] = True
        scores = scores.masked_fill(~inside, float("-inf"))
    best = scores.argmax(dim=1)
    finite = torch.isfinite(scores.gather(1, best[:, None]).squeeze(1))
    return [None if not ok else ROOT if i == len(captions) else int(i) for i, ok in zip(best.tolist(), finite.tolist())]


def dedupe(indices: list[Optional[int]]) -> list[int]:
    """Captions in order of first appearance, without repeats or empty steps."""
    seen: list[int] = []
    for i in indices:
        if i is not None and i not in seen:
            seen.append(i)
    return seen


def caption_count(sequence: list[int]) -> int:
    """Captions retrieved along a traversal, [ROOT] itself excluded (EuCLIP's Table 6)."""
    return sum(i != ROOT for i in sequence)


def traverse(geometry: Geometry, z: torch.Tensor, root: torch.Tensor, captions: torch.Tensor,
             curv: Optional[torch.Tensor] = None, steps: int = 50, entail_k: Optional[float] = None,
             root_in_pool: bool = False) -> list[int]:
    """The de-duplicated caption indices met on the way from ``z`` to [ROOT] (``ROOT`` for the root itself)."""
    points = traversal_points(geometry, z, root, steps)
    return dedupe(nearest_captions(geometry, points, captions, curv, entail_k, root if root_in_pool else None))


# MERU's prompt formats (scripts/image_traversals.py): nouns with the article even for plurals;
# raw captions verbatim.
NOUN_PROMPT = "a photo of a {}."
ADJECTIVE_PROMPT = "this photo is {}."
POOL_KEYS = ("captions", "nouns", "adjectives")


def text_pool(pool: Optional[Path] = None, captions: Optional[Path] = None, nouns: Optional[Path] = None,
              adjectives: Optional[Path] = None) -> list[str]:
    """The traversal's candidate captions from MERU's text-pool layout, prompts applied.

    Either one JSON file with the keys ``captions``, ``nouns`` and ``adjectives`` (MERU's
    ``assets/pexels_text.json``, each a list of strings; any may be absent), or up to three text
    files with one entry per line. Raw captions come first, then nouns, then adjectives.
    """
    if pool is not None and any(p is not None for p in (captions, nouns, adjectives)):
        raise UsageError("--text-pool replaces --captions/--nouns/--adjectives: give one or the other")
    if pool is not None:
        lists = _json_pool(pool)
    else:
        lists = {key: _lines(path, f"--{key}") for key, path in zip(POOL_KEYS, (captions, nouns, adjectives))
                 if path is not None}
    texts = (list(lists.get("captions", [])) + [NOUN_PROMPT.format(w) for w in lists.get("nouns", [])]
             + [ADJECTIVE_PROMPT.format(w) for w in lists.get("adjectives", [])])
    if not texts:
        raise UsageError("a traversal of your images needs candidate captions: --text-pool FILE.json (MERU's "
                         "pexels_text.json layout) or --captions/--nouns/--adjectives FILE, one entry per line")
    return texts


def _lines(path: Path, option: str) -> list[str]:
    # No comment syntax: captions may start with '#' (hashtags).
    return [line.strip() for line in read_text(path, option).splitlines() if line.strip()]


def _json_pool(path: Path) -> dict[str, list[str]]:
    try:
        data = json.loads(read_text(path, "--text-pool"))
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected an object with the keys {', '.join(POOL_KEYS)}")
    for key, value in data.items():
        if key not in POOL_KEYS:
            raise UsageError(f"{path}: unknown key '{key}' (the text pool has {', '.join(POOL_KEYS)})")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UsageError(f"{path}: '{key}' must be a list of strings")
    return data
