"""Image traversals (the paper's appendix B): walk from an image embedding to [ROOT], name each step.

50 equally spaced points from the image to [ROOT] are interpolated in the geometry's own
coordinates and projected back (CLIP: normalize, interpolate, re-normalize; Euclidean:
interpolate; hyperbolic: interpolate the tangent vectors, the exponential map happens inside
``similarity``). Each point is named by its nearest caption in the model's geometry,
optionally only among captions whose entailment cone contains the point (radius K).
Repeated captions are dropped, first occurrence kept.
"""

from __future__ import annotations

from typing import Optional

import torch

from euclip_cli.geometry import Geometry


def traversal_points(geometry: Geometry, z: torch.Tensor, root: torch.Tensor, steps: int) -> torch.Tensor:
    """``(D,), (D,) -> (steps, D)``: from ``z`` (t = 0) to [ROOT] (t = 1)."""
    t = torch.linspace(0, 1, steps, dtype=z.dtype, device=z.device)[:, None]
    return geometry.project((1 - t) * z + t * root)


def nearest_captions(geometry: Geometry, points: torch.Tensor, captions: torch.Tensor,
                     curv: Optional[torch.Tensor] = None, entail_k: Optional[float] = None) -> list[Optional[int]]:
    """For each point ``(S, D)`` the index of its nearest caption ``(C, D)``; None where the filter leaves none.

    With ``entail_k``, only captions x whose cone (radius K) contains the point y are candidates.
    """
    scores = geometry.similarity(points, captions, curv)  # (S, C)
    if entail_k is not None:
        inside = geometry.entails(captions[None], points[:, None], entail_k, curv)  # (S, C)
        scores = scores.masked_fill(~inside, float("-inf"))
    best = scores.argmax(dim=1)
    finite = torch.isfinite(scores.gather(1, best[:, None]).squeeze(1))
    return [int(i) if ok else None for i, ok in zip(best.tolist(), finite.tolist())]


def dedupe(indices: list[Optional[int]]) -> list[int]:
    """Captions in order of first appearance, without repeats or empty steps."""
    seen: list[int] = []
    for i in indices:
        if i is not None and i not in seen:
            seen.append(i)
    return seen


def traverse(geometry: Geometry, z: torch.Tensor, root: torch.Tensor, captions: torch.Tensor,
             curv: Optional[torch.Tensor] = None, steps: int = 50, entail_k: Optional[float] = None) -> list[int]:
    """The de-duplicated caption indices met on the way from ``z`` to [ROOT]."""
    return dedupe(nearest_captions(geometry, traversal_points(geometry, z, root, steps), captions, curv, entail_k))
