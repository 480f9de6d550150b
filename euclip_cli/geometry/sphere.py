"""The unit sphere S^{n-1} (CLIP, elliptic) and the product sphere PS(n/m, m).

Every function takes embeddings that the caller has already normalized, except
``normalize`` and ``block_normalize`` themselves.
"""

from __future__ import annotations

import torch

# Keeps acos away from +-1, where its derivative is infinite; 1 - 1e-7 is still
# representable in fp32 (its spacing below 1 is 6e-8), and acos'(1 - 1e-7) ~ -2236.
ACOS_EPS = 1e-7
# Guards the division by the norm of a zero vector.
NORM_EPS = 1e-12


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Project onto the unit sphere. ``(..., D) -> (..., D)``."""
    # clamp: a zero vector would divide by zero; it maps to zero instead.
    return x / x.norm(dim=-1, keepdim=True).clamp_min(NORM_EPS)


def cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine of unit vectors. ``(B1, D), (B2, D) -> (B1, B2)``, in [-1, 1]."""
    return x @ y.T


def arc_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise geodesic distance on the sphere. ``(B1, D), (B2, D) -> (B1, B2)``, in [0, pi]."""
    # clamp: rounding can push a cosine of unit vectors past +-1 (acos NaN), and acos' is infinite at +-1.
    return torch.acos(cosine(x, y).clamp(-1 + ACOS_EPS, 1 - ACOS_EPS))


def block_normalize(x: torch.Tensor, blocks: int) -> torch.Tensor:
    """Split the last dim into ``blocks`` equal parts and normalize each. ``(..., D) -> (..., D)``."""
    shape = x.shape
    return normalize(x.reshape(*shape[:-1], blocks, shape[-1] // blocks)).reshape(shape)


def product_inner(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum of the block cosines of block-normalized embeddings. ``(B1, D), (B2, D) -> (B1, B2)``, in [-m, m].

    The sum over blocks of x_b . y_b is the plain dot product of the concatenations,
    so one matrix product computes it.
    """
    return x @ y.T


def product_geodesic(x: torch.Tensor, y: torch.Tensor, blocks: int) -> torch.Tensor:
    """Geodesic distance on PS(n/m, m): sqrt(sum_b acos(x_b . y_b)^2). ``(B1, D), (B2, D) -> (B1, B2)``."""
    xb = x.reshape(x.shape[0], blocks, -1)
    yb = y.reshape(y.shape[0], blocks, -1)
    cos = torch.einsum("ibd,jbd->ijb", xb, yb)
    # clamp: as in arc_distance, keeps acos finite with a finite derivative.
    angles = torch.acos(cos.clamp(-1 + ACOS_EPS, 1 - ACOS_EPS))
    # clamp: sqrt' is infinite at 0, reached when every block angle is at its floor.
    return angles.square().sum(-1).clamp_min(NORM_EPS).sqrt()
