"""One optimizer step's forward and backward, with exact gradient accumulation.

OpenCLIP's scheme: embed every micro-batch once without gradients, then for each
micro-batch j recompute its embeddings with gradients, splice them into the cached ones
and back-propagate the loss of the whole accumulated batch. Each sample's embeddings carry
gradients in exactly one pass, so encoder weights and the embedding scales get the
full-batch gradient. The logit scale and curvature (and SigLIP's bias) appear in every pass,
though, and the EuCLIP fork back-propagates them k times (k x their gradient); here they are
live in the first pass only, which gives them exactly the full-batch gradient too.

Across ranks, ``gather`` turns the rank's batch into the global one (see
``euclip_cli.train.distributed``) and ``owns_scalars`` is true on rank 0 only.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch

from euclip_cli.loss import at_least_fp32, hycoclip_objective, local_hycoclip_objective, local_objective, objective
from euclip_cli.model import EuclipModel
from euclip_cli.towers.text import TextPlan


def _plain_backward(loss: torch.Tensor) -> None:
    loss.backward()


def _no_gather(x: torch.Tensor) -> torch.Tensor:
    return x


def forward_backward(model: EuclipModel, images: torch.Tensor, tokens: torch.Tensor, accum_steps: int,
                     entail_weight: float, min_radius: float,
                     autocast: Callable[[], contextlib.AbstractContextManager],
                     gather: Callable[[torch.Tensor], torch.Tensor] = _no_gather, owns_scalars: bool = True,
                     backward: Callable[[torch.Tensor], None] = _plain_backward,
                     before_last_backward: Callable[[], None] = lambda: None,
                     plans: Optional[list[Optional[TextPlan]]] = None,
                     local: Optional["LocalLoss"] = None, boxes: bool = False) -> dict[str, torch.Tensor]:
    """Accumulate the gradient of the loss on the whole (global) batch; return the detached loss terms.

    ``backward`` lets a gradient scaler scale the loss first; ``before_last_backward`` runs before
    the pass after which the gradients are final (a reducer arms its hooks there). ``plans``: the
    text tower's plan of each micro-batch (``EuclipModel.text_plans``), made on the host, so that
    ``tokens`` may sit on the device and nothing is read back; without them each pass makes its own.
    ``local``: the rank's share of the global loss instead of the whole of it (``LocalLoss``); the terms
    returned are then summed over ranks, the global batch's.
    ``boxes``: ``images (2B, ...)`` and ``tokens (2B, L)`` hold the B samples and then their B boxes (a box
    loader's batch, ``data.loader``), and the loss is HyCoCLIP's on the quadruples. ``plans`` then has one
    plan per micro-batch of each half, the samples' first (``text_plans(tokens, 2 * accum_steps)``).
    """
    halves = 2 if boxes else 1
    pieces = accum_steps * halves
    plans = plans or [None] * pieces

    def loss(embedded: list[tuple[torch.Tensor, torch.Tensor]], live_scalars: bool):
        """``embedded``: each half's (images, texts) embeddings, ``(B, D)`` each (the rank's, before a gather)."""
        scale, curv, bias = model.logit_scale(), model.curvature(), model.logit_bias
        bias = at_least_fp32(bias) if bias is not None else None
        if not (live_scalars and (owns_scalars or local is not None)):
            scale = scale.detach()
            curv = curv.detach() if curv is not None else None
            bias = bias.detach() if bias is not None else None
        (image_emb, text_emb), *box = embedded
        if box:
            (box_image, box_text), = box
            if local is not None:
                return local_hycoclip_objective(model.geometry, image_emb, text_emb, box_image, box_text,
                                                local.gather(image_emb), local.gather(text_emb),
                                                local.offset(image_emb.shape[0]), scale, curv, entail_weight, min_radius)
            return hycoclip_objective(model.geometry, gather(image_emb), gather(text_emb), gather(box_image),
                                      gather(box_text), scale, curv, entail_weight, min_radius)
        if local is not None:
            return local_objective(model.geometry, image_emb, text_emb, local.gather(image_emb), local.gather(text_emb),
                                   local.offset(image_emb.shape[0]), scale, curv, entail_weight, min_radius, bias)
        return objective(model.geometry, gather(image_emb), gather(text_emb), scale, curv, entail_weight, min_radius,
                         bias)

    def finished(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        terms = {k: v.detach() for k, v in out.items()}
        return terms if local is None else {k: local.sum(v) for k, v in terms.items()}

    # Piece h * accum_steps + j: micro-batch j of half h (the samples, then their boxes).
    image_chunks, token_chunks = images.chunk(pieces), tokens.chunk(pieces)

    def encoded(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return model.encode_image(image_chunks[i]), model.encode_text(token_chunks[i], plans[i])

    if accum_steps == 1:
        with autocast():
            out = loss([encoded(h) for h in range(halves)], live_scalars=True)
        before_last_backward()
        backward(out["loss"])
        return finished(out)

    with torch.no_grad(), autocast():
        cached = [encoded(i) for i in range(pieces)]
    for j in range(accum_steps):
        with autocast():
            embedded = []
            for h in range(halves):
                mine = h * accum_steps + j
                live = encoded(mine)
                parts = [live if i == mine else cached[i] for i in range(h * accum_steps, (h + 1) * accum_steps)]
                embedded.append((torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])))
            out = loss(embedded, live_scalars=(j == 0))
        if j == accum_steps - 1:
            before_last_backward()
        backward(out["loss"])
    return finished(out)


class LocalLoss:
    """What a rank needs for its share of the global loss (``loss.local_loss``): a gather whose backward
    hands every rank the gradients of its own features from every rank's share (``gather``), where its
    pairs start in the global batch (``offset``), and a sum over ranks for the terms it reports (``sum``).
    Every rank's share holds the learnable scalars, so they are live on every rank and their gradients
    add up like the encoders' (where the whole-loss scheme keeps them on rank 0 alone)."""

    def __init__(self, gather: Callable[[torch.Tensor], torch.Tensor], offset: Callable[[int], int],
                 sum: Callable[[torch.Tensor], torch.Tensor]):
        self.gather, self.offset, self.sum = gather, offset, sum


class NonfiniteGuard:
    """Non-finite steps, found and counted on the device: a step never waits for the device to say.

    ``check`` turns the step's loss and gradients into a 0-dim flag that the optimizer reads on the
    device (``apply_update``), as a gradient scaler hands its found-infinity flag to a fused
    optimizer; the counts stay on the device until a logging or checkpoint step ``read``s them.
    """

    def __init__(self, device: torch.device):
        def counter() -> torch.Tensor:
            return torch.zeros((), dtype=torch.int64, device=device)

        self.streak, self.longest, self.total = counter(), counter(), counter()

    def check(self, loss: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
        """1.0 (float, 0-dim, on the device) where the loss or a gradient element is not finite, else 0.0."""
        bad = nonfinite(loss, grads)
        self.streak.add_(1).mul_(bad)  # one more in a row, or none
        torch.maximum(self.longest, self.streak, out=self.longest)
        self.total.add_(bad)
        return bad.float()

    def read(self) -> tuple[int, int]:
        """``(non-finite steps so far, the longest run of them in a row since the last read)``: waits for the device."""
        total, longest = int(self.total), int(self.longest)
        self.longest.copy_(self.streak)
        return total, longest


def nonfinite(loss: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    """Whether the loss or any gradient element is not finite, as a 0-dim bool tensor on their device:
    each tensor's largest magnitude (one fused kernel over all of them) is finite exactly when all
    its elements are (max propagates NaN, and a max of finite numbers cannot overflow)."""
    largest = torch._foreach_norm(grads, float("inf")) if grads else []
    return ~torch.isfinite(torch.stack([loss.detach().float().reshape(()), *[m.float() for m in largest]])).all()


def apply_update(model: EuclipModel, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                 params: list[torch.nn.Parameter], grad_clip: Optional[float], skip: torch.Tensor) -> None:
    """The optimizer step from unscaled gradients, skipped on the device where ``skip`` (0-dim float) is 1.

    ``optimizer`` must be fused: its kernel leaves parameters, moments and step count untouched where
    ``found_inf`` is set (``torch.optim.AdamW(fused=True)``; ``optim.build_optimizer`` makes it so).
    """
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.found_inf = skip
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf
    scaler.update()  # fp16: halves the scale after an overflow (its own flag, from unscale_), else grows it
    model.clamp_scalars_()
