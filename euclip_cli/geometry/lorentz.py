"""The Lorentz hyperboloid L^n = {x : <x, x>_L = -1/c} (MERU and the EuCLIP study's hyperbolic models).

Points are stored by their space components x_s in R^n; the time component
x_t = sqrt(1/c + ||x_s||^2) is recomputed where needed. ``curv`` is the positive
curvature parameter c, a 0-dim tensor (it is learned).
"""

from __future__ import annotations

import math

import torch

# Floor under ||v|| sqrt(c) before dividing by it: v = 0 would give 0/0.
NORM_EPS = 1e-8
# Cap on the sinh argument: sinh(asinh(2^15)) = 2^15 keeps every later product far from
# fp32 overflow (sinh itself overflows near 89); MERU uses the same cap.
SINH_MAX = math.asinh(2**15)
# acosh' is infinite at 1, which -c<x, y>_L reaches for identical points; fp32 resolves 1 + 1e-6.
ACOSH_EPS = 1e-6
# Keeps acos/asin arguments off +-1 and the sqrt in the exterior angle off 0.
TRIG_EPS = 1e-7


def exp_map0(v: torch.Tensor, curv: torch.Tensor) -> torch.Tensor:
    """Exponential map at the origin: space components sinh(sqrt(c)||v||)/(sqrt(c)||v||) v. ``(..., D) -> (..., D)``."""
    r = curv.sqrt() * v.norm(dim=-1, keepdim=True)
    # clamps: the floor avoids 0/0 at v = 0 (where sinh(r)/r -> 1); the cap avoids overflow.
    return torch.sinh(r.clamp(NORM_EPS, SINH_MAX)) / r.clamp_min(NORM_EPS) * v


def time_component(x: torch.Tensor, curv: torch.Tensor) -> torch.Tensor:
    """x_t = sqrt(1/c + ||x_s||^2) (positive: always well inside sqrt's domain). ``(..., D) -> (...)``."""
    return (1 / curv + x.square().sum(-1)).sqrt()


def pairwise_inner(x: torch.Tensor, y: torch.Tensor, curv: torch.Tensor) -> torch.Tensor:
    """Lorentzian inner product x_s . y_s - x_t y_t of hyperboloid points. ``(B1, D), (B2, D) -> (B1, B2)``, <= -1/c."""
    return x @ y.T - time_component(x, curv)[:, None] * time_component(y, curv)[None, :]


def pairwise_dist(x: torch.Tensor, y: torch.Tensor, curv: torch.Tensor) -> torch.Tensor:
    """Geodesic distance acosh(-c <x, y>_L) / sqrt(c) between hyperboloid points. ``(B1, D), (B2, D) -> (B1, B2)``."""
    # clamp: rounding puts -c<x, y>_L slightly below 1 for close points (acosh NaN), and acosh' is infinite at 1.
    return torch.acosh((-curv * pairwise_inner(x, y, curv)).clamp_min(1 + ACOSH_EPS)) / curv.sqrt()


def half_aperture(x: torch.Tensor, curv: torch.Tensor, min_radius: float) -> torch.Tensor:
    """asin(min(1, 2K / (sqrt(c) ||x_s||))): the cone's half-aperture at apex x. ``(..., D) -> (...)``."""
    # clamp: x_s = 0 would divide by zero; the ratio is then huge and the aperture pi/2.
    ratio = 2 * min_radius / (curv.sqrt() * x.norm(dim=-1)).clamp_min(NORM_EPS)
    inside = ratio < 1 - TRIG_EPS
    # where, twice: keeps asin (infinite derivative at 1) off the clamped branch, as in euclidean.half_aperture.
    safe = torch.where(inside, ratio, torch.zeros_like(ratio))
    return torch.where(inside, torch.asin(safe), torch.full_like(ratio, math.pi / 2))


def exterior_angle(x: torch.Tensor, y: torch.Tensor, curv: torch.Tensor) -> torch.Tensor:
    """pi - angle(O, x, y) on the hyperboloid (MERU's formula). ``(..., D), (..., D) -> (...)``, in [0, pi].

    With l = c <x, y>_L: cos(ext) = (y_t + l x_t) / (||x_s|| sqrt(l^2 - 1)). Broadcasts.
    """
    x_t, y_t = time_component(x, curv), time_component(y, curv)
    l = curv * ((x * y).sum(-1) - x_t * y_t)
    # clamp: l^2 - 1 is 0 for y = x (and slightly negative after rounding); sqrt' is infinite at 0.
    den = x.norm(dim=-1) * (l.square() - 1).clamp_min(TRIG_EPS).sqrt()
    # clamps: the denominator vanishes at x_s = 0; acos needs its argument inside (-1, 1).
    cos = (y_t + l * x_t) / den.clamp_min(NORM_EPS)
    return torch.acos(cos.clamp(-1 + TRIG_EPS, 1 - TRIG_EPS))


def cone_violation(x: torch.Tensor, y: torch.Tensor, curv: torch.Tensor, min_radius: float,
                   aperture_factor: float = 1.0) -> torch.Tensor:
    """ext(x, y) - f aper(x) for hyperboloid points x (apex) and y, negative inside the cone; the aperture
    factor f widens (> 1) or narrows (< 1) it, as HyCoCLIP's loss does. ``(..., D), (..., D) -> (...)``."""
    return exterior_angle(x, y, curv) - aperture_factor * half_aperture(x, curv, min_radius)


def entailment(x: torch.Tensor, y: torch.Tensor, curv: torch.Tensor, min_radius: float) -> torch.Tensor:
    """max(0, ext(x, y) - aper(x)) for hyperboloid points x (apex) and y. ``(..., D), (..., D) -> (...)``."""
    return cone_violation(x, y, curv, min_radius).clamp_min(0)
