"""Euclidean distances and the Euclidean entailment cone (Ganea et al. 2018, as modified by EuCLIP)."""

from __future__ import annotations

import math

import torch

# Floor under squared distances before sqrt: sqrt' is infinite at 0 (identical inputs).
SQ_EPS = 1e-12
# Floor under norms used as divisors (zero vectors).
NORM_EPS = 1e-12
# Keeps acos/asin arguments off +-1, where their derivatives are infinite (see sphere.ACOS_EPS).
TRIG_EPS = 1e-7


def pairwise_sq_dist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||x_i - y_j||^2 by the expansion ||x||^2 - 2 x.y + ||y||^2. ``(B1, D), (B2, D) -> (B1, B2)``, >= 0.

    The expansion avoids a (B1, B2, D) tensor, as the authors' code does.
    """
    sq = x.square().sum(-1, keepdim=True) - 2 * x @ y.T + y.square().sum(-1)
    # clamp: cancellation in the expansion can give tiny negative values.
    return sq.clamp_min(0)


def pairwise_dist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||x_i - y_j||. ``(B1, D), (B2, D) -> (B1, B2)``, >= 0 (exactly 1e-6 at identical inputs)."""
    # clamp: sqrt' is infinite at 0; the floor keeps the gradient finite at identical inputs.
    return pairwise_sq_dist(x, y).clamp_min(SQ_EPS).sqrt()


def half_aperture(x: torch.Tensor, min_radius: float) -> torch.Tensor:
    """asin(min(1, K / ||x||)): the cone's half-aperture at apex x. ``(..., D) -> (...)``, in (0, pi/2]."""
    # clamp: ||x|| = 0 would divide by zero; the ratio is then huge and the aperture pi/2.
    ratio = min_radius / x.norm(dim=-1).clamp_min(NORM_EPS)
    inside = ratio < 1 - TRIG_EPS
    # where, twice: asin' is infinite at 1, so the clamped branch must not see asin at all,
    # or its zero gradient times asin's infinite one would be NaN. The aperture there is pi/2.
    safe = torch.where(inside, ratio, torch.zeros_like(ratio))
    return torch.where(inside, torch.asin(safe), torch.full_like(ratio, math.pi / 2))


def exterior_angle(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """pi - angle(O, x, y) = acos((y - x).x / (||y - x|| ||x||)). ``(..., D), (..., D) -> (...)``, in [0, pi].

    x is the apex (the generic concept, text), y the specific one (image). Broadcasts,
    so ``x[:, None], y[None]`` gives every pair.
    """
    diff = y - x
    num = (diff * x).sum(-1)
    # clamp: y = x or x = 0 make the denominator zero.
    den = (diff.norm(dim=-1) * x.norm(dim=-1)).clamp_min(NORM_EPS)
    # clamp: rounding can push the cosine past +-1, and acos' is infinite there.
    return torch.acos((num / den).clamp(-1 + TRIG_EPS, 1 - TRIG_EPS))


def cone_violation(x: torch.Tensor, y: torch.Tensor, min_radius: float, aperture_factor: float = 1.0) -> torch.Tensor:
    """ext(x, y) - f aper(x): how far y lies outside the cone at x, negative inside it; the aperture factor f
    widens (> 1) or narrows (< 1) the cone, as HyCoCLIP's loss does. ``(..., D), (..., D) -> (...)``."""
    return exterior_angle(x, y) - aperture_factor * half_aperture(x, min_radius)


def entailment(x: torch.Tensor, y: torch.Tensor, min_radius: float) -> torch.Tensor:
    """max(0, ext(x, y) - aper(x)): how far y lies outside the cone at x. ``(..., D), (..., D) -> (...)``."""
    return cone_violation(x, y, min_radius).clamp_min(0)
