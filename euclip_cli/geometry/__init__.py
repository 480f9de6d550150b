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
has entailment cones) is in ``facts``, which imports no torch.
"""

__all__ = ["Geometry", "get_geometry", "list_geometries"]


def __getattr__(name: str):
    # Lazy: ``euclip_cli.geometry.facts`` is read by torch-free code (config, reports), and importing
    # this package must not import torch for it.
    if name in __all__:
        from euclip_cli.geometry import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
