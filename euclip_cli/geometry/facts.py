"""What each geometry *is*, without its math: the facts config, CLI, model, analyses and reports
read. Standard library only, so ``euclip recipes validate`` and ``euclip report`` know the
built-in geometries without importing torch.

Each geometry's facts are written once: here for the built-in ones, beside its class for any
other (a class registered in ``registry.py`` or in a plugin package, which declares its facts when
the registry is imported). Read them through ``euclip_cli.geometry.lookup`` / ``describe`` /
``names``, which consult the registry when a name is not declared yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


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


def declared(name: str) -> Optional[GeometryFacts]:
    """The facts declared so far under ``name`` (the built-in ones, and those of geometries
    registered in this process); ``euclip_cli.geometry.lookup`` also asks the registry."""
    return _FACTS.get(name)


def declared_names() -> list[str]:
    return sorted(_FACTS)


CLIP = declare(GeometryFacts("clip", ("cos",), root="mean"))
ELLIPTIC = declare(GeometryFacts("elliptic", ("arccos",), root="mean"))
PRODUCT_SPHERE = declare(GeometryFacts("product-sphere", ("inner", "geodesic"), root="mean", uses_blocks=True))
EUCLIDEAN = declare(GeometryFacts("euclidean", ("d", "d2"), root="origin", has_entailment=True, squared_logits=("d2",)))
HYPERBOLIC = declare(GeometryFacts("hyperbolic", ("d", "d2"), root="origin", has_entailment=True,
                                   learned_scales=True, has_curvature=True, squared_logits=("d2",)))
