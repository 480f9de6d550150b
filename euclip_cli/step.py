"""One optimizer step's forward and backward, with exact gradient accumulation.

OpenCLIP's scheme: embed every micro-batch once without gradients, then for each
micro-batch j recompute its embeddings with gradients, splice them into the cached ones
and back-propagate the loss of the whole accumulated batch. Each sample's embeddings carry
gradients in exactly one pass, so encoder weights and the embedding scales get the
full-batch gradient. The logit scale and curvature appear in every pass, though, and the
EuCLIP fork back-propagates them k times (k x their gradient); here they are live in the
first pass only, which gives them exactly the full-batch gradient too.

Across ranks, ``gather`` turns the rank's batch into the global one (see
``euclip_cli.train.distributed``) and ``owns_scalars`` is true on rank 0 only.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from euclip_cli.loss import objective
from euclip_cli.model import EuclipModel


def _plain_backward(loss: torch.Tensor) -> None:
    loss.backward()


def _no_gather(x: torch.Tensor) -> torch.Tensor:
    return x


def forward_backward(model: EuclipModel, images: torch.Tensor, tokens: torch.Tensor, accum_steps: int,
                     entail_weight: float, min_radius: float,
                     autocast: Callable[[], contextlib.AbstractContextManager],
                     gather: Callable[[torch.Tensor], torch.Tensor] = _no_gather, owns_scalars: bool = True,
                     backward: Callable[[torch.Tensor], None] = _plain_backward,
                     before_last_backward: Callable[[], None] = lambda: None) -> dict[str, torch.Tensor]:
    """Accumulate the gradient of the loss on the whole (global) batch; return the detached loss terms.

    ``backward`` lets a gradient scaler scale the loss first; ``before_last_backward`` runs before
    the pass after which the gradients are final (a reducer arms its hooks there).
    """
    def loss(image_emb, text_emb, live_scalars: bool):
        scale, curv = model.logit_scale(), model.curvature()
        if not (live_scalars and owns_scalars):
            scale = scale.detach()
            curv = curv.detach() if curv is not None else None
        return objective(model.geometry, gather(image_emb), gather(text_emb), scale, curv, entail_weight, min_radius)

    if accum_steps == 1:
        with autocast():
            out = loss(model.encode_image(images), model.encode_text(tokens), live_scalars=True)
        before_last_backward()
        backward(out["loss"])
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
        if j == accum_steps - 1:
            before_last_backward()
        backward(out["loss"])
    return {k: v.detach() for k, v in out.items()}
