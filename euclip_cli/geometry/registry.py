"""The geometry registry: one class per geometry, each a thin composition of the pure functions.

Conventions shared by every geometry:
- ``embed`` maps raw encoder features ``(B, D)`` to the geometry's *output space*, the space
  in which the authors average prompts and interpolate traversals: unit vectors (clip,
  elliptic), block-unit vectors (product-sphere), features / sqrt(D) (euclidean), or
  tangent vectors at the origin alpha * f, before the exponential map (hyperbolic).
- ``similarity(x, y)`` is higher for closer pairs; logits are beta * similarity.
- ``curv`` is the hyperbolic curvature c (a 0-dim tensor) and ignored elsewhere.
Callers run these in fp32 with autocast disabled (``euclip_cli.model`` and ``loss`` do).
"""

from __future__ import annotations

import math
from typing import ClassVar, Optional

import torch

from euclip_cli.geometry import euclidean, lorentz, sphere
from euclip_cli.errors import UsageError
from euclip_cli.geometry import facts as F

_REGISTRY: dict[str, type["Geometry"]] = {}


def register(cls: type["Geometry"]) -> type["Geometry"]:
    """Make ``cls`` the math of the geometry its ``facts`` describe (and declare those facts)."""
    F.declare(cls.facts)
    _REGISTRY[cls.facts.name] = cls
    return cls


def list_geometries() -> list[str]:
    return sorted(_REGISTRY)


def get_geometry(name: str, logit: str = "default", blocks: int = 8) -> "Geometry":
    """The geometry ``name`` with the given logit ("default" = its first) and, for product-sphere, m blocks."""
    if name not in _REGISTRY:
        raise UsageError(f"unknown geometry '{name}' (known: {', '.join(list_geometries())})")
    return _REGISTRY[name](logit=logit, blocks=blocks)


class Geometry:
    facts: ClassVar[F.GeometryFacts]

    def __init__(self, logit: str = "default", blocks: int = 8):
        logit = self.facts.logit(logit)
        if logit not in self.logits:
            raise UsageError(f"geometry '{self.name}' has no logit '{logit}' (allowed: {', '.join(self.logits)})")
        self.logit = logit
        self.blocks = blocks

    @property
    def name(self) -> str:
        return self.facts.name

    @property
    def logits(self) -> tuple[str, ...]:
        return self.facts.logits

    @property
    def has_entailment(self) -> bool:
        return self.facts.has_entailment

    @property
    def learned_scales(self) -> bool:
        return self.facts.learned_scales

    @property
    def has_curvature(self) -> bool:
        return self.facts.has_curvature

    def __repr__(self) -> str:
        return f"{type(self).__name__}(logit={self.logit!r})"

    def embed(self, features: torch.Tensor, log_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Encoder features to output-space embeddings. ``(B, D) -> (B, D)``."""
        raise NotImplementedError

    def project(self, z: torch.Tensor) -> torch.Tensor:
        """Back into the output space after averaging or interpolating (identity where it is a vector space)."""
        return z

    def similarity(self, x: torch.Tensor, y: torch.Tensor, curv: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Pairwise similarity of output-space embeddings, higher = closer. ``(B1, D), (B2, D) -> (B1, B2)``."""
        raise NotImplementedError

    def prototypes(self, text: torch.Tensor) -> torch.Tensor:
        """Zero-shot class prototypes: the authors' rule, the template mean in output space, projected back.

        ``(C, T, D) -> (C, D)``. For clip/elliptic: normalize, average, re-normalize; for hyperbolic
        the mean of tangent vectors (the exponential map happens inside ``similarity``).
        """
        return self.project(text.mean(dim=-2))

    def root(self, embeddings: torch.Tensor) -> torch.Tensor:
        """[ROOT] as ``facts.root`` says: the origin, or the mean embedding. ``(N, D) -> (D,)``."""
        if self.facts.root == "mean":
            # The mean of the embeddings, not projected back: its norm ||[ROOT]|| is itself a
            # finding (paper, appendix D).
            return embeddings.mean(dim=0)
        return torch.zeros(embeddings.shape[-1], dtype=embeddings.dtype, device=embeddings.device)

    def distance_to_root(self, z: torch.Tensor, root: torch.Tensor, curv: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Geodesic distance of each embedding from [ROOT]. ``(N, D), (D,) -> (N,)``."""
        raise NotImplementedError

    plotted_axis = "geodesic distance from [ROOT]"  # the axis label of plotted_distance_to_root

    def plotted_distance_to_root(self, z: torch.Tensor, root: torch.Tensor,
                                 curv: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The distance from [ROOT] on the papers' axes (EuCLIP Figure 2, MERU Figure 4). ``(N, D), (D,) -> (N,)``.

        The geodesic where the papers plot it (Euclidean); geometries whose papers use another
        scale override this.
        """
        return self.distance_to_root(z, root, curv)

    def cone_violation(self, x: torch.Tensor, y: torch.Tensor, min_radius: float,
                       curv: Optional[torch.Tensor] = None, aperture_factor: float = 1.0) -> torch.Tensor:
        """How far y (specific, image) lies outside the cone at x (generic, text), negative inside it: the
        entailment loss before its clamp, and the entailment score's negative. ``aperture_factor`` scales the
        cone's half-aperture (HyCoCLIP's 0.7 and 1.2). ``(..., D) -> (...)``."""
        raise ValueError(f"geometry '{self.name}' has no entailment loss")

    def entailment(self, x: torch.Tensor, y: torch.Tensor, min_radius: float,
                   curv: Optional[torch.Tensor] = None, aperture_factor: float = 1.0) -> torch.Tensor:
        """Entailment loss of y (specific, image) against the cone at x (generic, text). ``(..., D) -> (...)``."""
        return self.cone_violation(x, y, min_radius, curv, aperture_factor).clamp_min(0)

    def entails(self, x: torch.Tensor, y: torch.Tensor, min_radius: float,
                curv: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The entailment test (for traversal filtering): y lies inside the cone at x. ``(..., D) -> (...)`` bool.

        Broadcasts, so ``x[:, None], y[None]`` tests every (text, image) pair.
        """
        return self.entailment(x, y, min_radius, curv) == 0


@register
class Clip(Geometry):
    """Cosine similarity of L2-normalized embeddings (CLIP)."""

    facts = F.CLIP

    def embed(self, features, log_scale=None):
        return sphere.normalize(features)

    def project(self, z):
        return sphere.normalize(z)

    def similarity(self, x, y, curv=None):
        return sphere.cosine(x, y)

    plotted_axis = "0.5 (1 - cos(z, [ROOT]))"

    def plotted_distance_to_root(self, z, root, curv=None):
        # The papers' scaled cosine distance 0.5 (1 - <z, [ROOT]>), in [0, 1] for unit vectors.
        return 0.5 * (1 - sphere.cosine(z, sphere.normalize(root)[None]).squeeze(-1))

    def distance_to_root(self, z, root, curv=None):
        return sphere.arc_distance(z, sphere.normalize(root)[None]).squeeze(-1)


@register
class Elliptic(Clip):
    """Negative geodesic (arc) distance on the unit sphere: -acos(cosine)."""

    facts = F.ELLIPTIC

    def similarity(self, x, y, curv=None):
        return -sphere.arc_distance(x, y)


@register
class ProductSphere(Geometry):
    """PS(n/m, m): m blocks, each L2-normalized; sum of block cosines ("inner") or minus the geodesic distance."""

    facts = F.PRODUCT_SPHERE

    def embed(self, features, log_scale=None):
        return sphere.block_normalize(features, self.blocks)

    def project(self, z):
        return sphere.block_normalize(z, self.blocks)

    def similarity(self, x, y, curv=None):
        if self.logit == "inner":
            return sphere.product_inner(x, y)
        return -sphere.product_geodesic(x, y, self.blocks)

    def distance_to_root(self, z, root, curv=None):
        return sphere.product_geodesic(z, self.project(root)[None], self.blocks).squeeze(-1)

    plotted_axis = "0.5 (1 - mean block cos(z, [ROOT]))"

    def plotted_distance_to_root(self, z, root, curv=None):
        # No paper plots this geometry: CLIP's scaled cosine distance with the mean block cosine,
        # so that it lies in [0, 1] like CLIP's.
        inner = sphere.product_inner(z, self.project(root)[None]).squeeze(-1)
        return 0.5 * (1 - inner / self.blocks)


@register
class Euclidean(Geometry):
    """Embeddings scaled by 1/sqrt(n); similarity -||x - y|| (d) or -||x - y||^2 (d2)."""

    facts = F.EUCLIDEAN

    def embed(self, features, log_scale=None):
        # 1/sqrt(n) makes ||f|| ~ sqrt(n) at initialization an embedding of norm ~1 (paper, section 3.1).
        return features / math.sqrt(features.shape[-1])

    def similarity(self, x, y, curv=None):
        if self.logit == "d":
            return -euclidean.pairwise_dist(x, y)
        return -euclidean.pairwise_sq_dist(x, y)

    def distance_to_root(self, z, root, curv=None):
        return (z - root).norm(dim=-1)

    def cone_violation(self, x, y, min_radius, curv=None, aperture_factor=1.0):
        return euclidean.cone_violation(x, y, min_radius, aperture_factor)


@register
class Hyperbolic(Geometry):
    """MERU: alpha-scaled tangent vectors, exponential map onto the Lorentz hyperboloid, -d_L (d) or -d_L^2 (d2)."""

    facts = F.HYPERBOLIC

    def embed(self, features, log_scale=None):
        if log_scale is None:
            raise ValueError("the hyperbolic geometry needs its learned embedding scale (log alpha)")
        return features * log_scale.exp()

    def similarity(self, x, y, curv=None):
        dist = lorentz.pairwise_dist(lorentz.exp_map0(x, curv), lorentz.exp_map0(y, curv), curv)
        return -dist if self.logit == "d" else -dist.square()

    def distance_to_root(self, z, root, curv=None):
        if root.abs().sum() == 0:
            # d_L(O, exp0(v)) = ||v|| exactly: no acosh, and no NaN at the origin itself.
            return z.norm(dim=-1)
        return lorentz.pairwise_dist(lorentz.exp_map0(z, curv), lorentz.exp_map0(root[None], curv), curv).squeeze(-1)

    plotted_axis = "||x_space|| (space components of the lifted point)"

    def plotted_distance_to_root(self, z, root, curv=None):
        # MERU's Figure 4 plots ||x_space|| of the lifted point, sinh(sqrt(c)||v||)/sqrt(c), not the
        # geodesic ||v||; [ROOT] is the hyperboloid's vertex, whose space components are 0.
        return (lorentz.exp_map0(z, curv) - lorentz.exp_map0(root[None], curv)).norm(dim=-1)

    def cone_violation(self, x, y, min_radius, curv=None, aperture_factor=1.0):
        return lorentz.cone_violation(lorentz.exp_map0(x, curv), lorentz.exp_map0(y, curv), curv, min_radius,
                                      aperture_factor)


# The entry point group under which a package names the modules that register its geometries.
PLUGINS = "euclip.geometries"


def _load_plugins() -> None:
    """Import every module a package names under ``euclip.geometries``: their ``@register``
    classes join the registry in every process, as the built-in ones do."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGINS):
        entry.load()


_load_plugins()
