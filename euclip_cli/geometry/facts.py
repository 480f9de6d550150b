"""What each geometry *is*, without its math: the one description config, CLI, model, analyses and
reports read. Standard library only, so ``euclip recipes validate`` and ``euclip report`` know
every geometry without importing torch.

The math lives in ``registry.py`` (one class per geometry, each pointing at its facts); a geometry
registered there with new facts is known here too, so adding a geometry takes its math file, its
registry entry and a recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from euclip_cli.errors import UsageError


@dataclass(frozen=True)
class GeometryFacts:
    name: str
    # Similarity logits it accepts; the first is its default.
    logits: tuple[str, ...]
    # [ROOT]: "origin" (the origin of the space) or "mean" (the mean of the embeddings).
    root: str
    # Has an entailment loss (cones), so ``loss.entail_weight`` and traversal filters apply.
    has_entailment: bool = False
    # Learnable per-modality embedding scales alpha (log-space) and a learnable curvature c.
    learned_scales: bool = False
    has_curvature: bool = False
    # Splits the embedding into ``geometry.blocks`` factors, which must divide the embedding dimension.
    uses_blocks: bool = False
    # The logit whose initial log-scale is 0 rather than ln(1/0.07) (the paper, section 4.4).
    squared_logits: tuple[str, ...] = ()

    def logit(self, requested: str) -> str:
        """``requested`` resolved: "default" is the geometry's first logit."""
        return self.logits[0] if requested == "default" else requested


_FACTS: dict[str, GeometryFacts] = {}


def declare(facts: GeometryFacts) -> GeometryFacts:
    _FACTS[facts.name] = facts
    return facts


def names() -> list[str]:
    return sorted(_FACTS)


def describe(name: str) -> GeometryFacts:
    if name not in _FACTS:
        raise UsageError(f"unknown geometry '{name}' (known: {', '.join(names())})")
    return _FACTS[name]


CLIP = declare(GeometryFacts("clip", ("cos",), root="mean"))
ELLIPTIC = declare(GeometryFacts("elliptic", ("arccos",), root="mean"))
PRODUCT_SPHERE = declare(GeometryFacts("product-sphere", ("inner", "geodesic"), root="mean", uses_blocks=True))
EUCLIDEAN = declare(GeometryFacts("euclidean", ("d", "d2"), root="origin", has_entailment=True, squared_logits=("d2",)))
HYPERBOLIC = declare(GeometryFacts("hyperbolic", ("d", "d2"), root="origin", has_entailment=True,
                                   learned_scales=True, has_curvature=True, squared_logits=("d2",)))
