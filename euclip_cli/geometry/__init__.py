"""Embedding geometries for contrastive language-image pre-training, usable on their own.

    >>> from euclip_cli import geometry
    >>> geometry.list_geometries()
    ['clip', 'elliptic', 'euclidean', 'hyperbolic', 'product-sphere']
    >>> g = geometry.get_geometry("euclidean", logit="d2")
    >>> z_img, z_txt = g.embed(image_features), g.embed(text_features)   # (B, D) each
    >>> logits = beta * g.similarity(z_img, z_txt)                        # (B, B), higher = closer

Every geometry answers the same questions (see ``Geometry``): how encoder features become
embeddings in its output space, their pairwise similarity, the zero-shot class-prototype
rule, the root [ROOT] and the distance to it, and, for the Euclidean and hyperbolic
geometries, the entailment loss. The formulas live as small pure functions in
``sphere``, ``euclidean`` and ``lorentz``; what each geometry is (its logits, its [ROOT], whether it
has entailment cones) is in ``facts``, which imports no torch; ``lookup``, ``describe`` and
``names`` read those facts for every geometry, importing the registry (torch, and the plugins
named under the ``euclip.geometries`` entry point) only for a name not declared yet.
"""

from typing import Optional

from euclip_cli.errors import UsageError
from euclip_cli.geometry import facts as _facts

__all__ = ["Geometry", "get_geometry", "list_geometries"]


def _registered() -> None:
    """Import the registry, whose classes (the plugins' included) declare their facts."""
    from euclip_cli.geometry import registry  # noqa: F401  (imported for its registrations)


def names() -> list[str]:
    """Every geometry: the built-in ones, the registry's and its plugins'."""
    _registered()
    return _facts.declared_names()


def lookup(name: str) -> Optional["_facts.GeometryFacts"]:
    """The facts of geometry ``name``, or None when there is none (a built-in name needs no torch)."""
    if _facts.declared(name) is None:
        _registered()
    return _facts.declared(name)


def describe(name: str) -> "_facts.GeometryFacts":
    found = lookup(name)
    if found is None:
        raise UsageError(f"unknown geometry '{name}' (known: {', '.join(names())})")
    return found


def __getattr__(name: str):
    # Lazy: ``euclip_cli.geometry.facts`` is read by torch-free code (config, reports), and importing
    # this package must not import torch for it.
    if name in __all__:
        from euclip_cli.geometry import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
