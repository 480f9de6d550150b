"""One optimizer step's forward and backward, with exact gradient accumulation.

OpenCLIP's scheme: embed every micro-batch once without gradients, then for each
micro-batch j recompute its embeddings with gradients, splice them into the cached ones
and back-propagate the loss of the whole accumulated batch. Each sample's embeddings carry
gradients in exactly one pass, so encoder weights and the embedding scales get the
full-batch gradient. The logit scale and curvature appear in every pass, though, and the
EuCLIP fork back-propagates them k times (k x their gradient); here they are live in the
first pass only, which gives them exactly the full-batch gradient too.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from euclip_cli.loss import objective
from euclip_cli.model import EuclipModel


def forward_backward(model: EuclipModel, images: torch.Tensor, tokens: torch.Tensor, accum_steps: int,
                     entail_weight: float, min_radius: float,
                     autocast: Callable[[], contextlib.AbstractContextManager]) -> dict[str, torch.Tensor]:
    """Accumulate the gradient of the loss on the whole batch; return the detached loss terms."""
    def loss(image_emb, text_emb, live_scalars: bool):
        scale, curv = model.logit_scale(), model.curvature()
        if not live_scalars:
            scale = scale.detach()
            curv = curv.detach() if curv is not None else None
        return objective(model.geometry, image_emb, text_emb, scale, curv, entail_weight, min_radius)

    if accum_steps == 1:
        with autocast():
            out = loss(model.encode_image(images), model.encode_text(tokens), live_scalars=True)
        out["loss"].backward()
        return {k: v.detach() for k, v in out.items()}

    image_chunks, token_chunks = images.chunk(accum_steps), tokens.chunk(accum_steps)
    with torch.no_grad(), autocast():
        cached_images = [model.encode_image(x) for x in image_chunks]
        cached_texts = [model.encode_text(t) for t in token_chunks]
    for j in range(accum_steps):
        with autocast():
            image_j, text_j = model.encode_image(image_chunks[j]), model.encode_text(token_chunks[j])
            all_images = torch.cat(cached_images[:j] + [image_j] + cached_images[j + 1:])
            all_texts = torch.cat(cached_texts[:j] + [text_j] + cached_texts[j + 1:])
            out = loss(all_images, all_texts, live_scalars=(j == 0))
        out["loss"].backward()
    return {k: v.detach() for k, v in out.items()}
