"""Activation checkpointing of both towers (``train.grad_checkpointing``), for every architecture
euclip builds: DataComp trains at batch 4,096, and its flags for few GPUs include
``--grad-checkpointing``.

A checkpointed block keeps only its input for backward and computes its forward again during the
backward pass (``torch.utils.checkpoint``, non-reentrant), so the loss and every gradient are the
same as without it: the recomputation runs the same operations on the same inputs.

- Transformers (the text tower; open_clip's and euclip's multi-token ViTs): open_clip's own switch,
  one checkpoint per residual block.
- timm towers (MERU's ViTs): timm's own switch, one checkpoint per block.
- open_clip's ResNet (``ModifiedResNet``; its own switch does nothing): one checkpoint per bottleneck
  block, here. BatchNorm updates its running statistics on every training forward, and the
  recomputation is a second forward: each block's statistics are put back as they were after it, so
  a checkpointed run's statistics are those of a run without checkpointing.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from euclip_cli.errors import UsageError


@contextlib.contextmanager
def _statistics_kept(norms: list[nn.modules.batchnorm._BatchNorm]):
    """Put the BatchNorm buffers back as they were when the recomputation started."""
    saved = [[b.clone() for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]
             for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for module, buffers in zip(norms, saved):
                live = [b for b in (module.running_mean, module.running_var, module.num_batches_tracked) if b is not None]
                for target, value in zip(live, buffers):
                    target.copy_(value)


def _contexts(norms: list[nn.modules.batchnorm._BatchNorm]):
    """``checkpoint``'s ``context_fn``: nothing around the first forward, the statistics kept around the
    recomputation."""
    return contextlib.nullcontext(), _statistics_kept(norms)


class _Checkpointed:
    """A block's forward, checkpointed: stands in for the block's ``forward`` (its state dict unchanged)."""

    def __init__(self, block: nn.Module):
        self.forward = block.forward
        norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.context_fn = functools.partial(_contexts, norms)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.forward(x)
        return checkpoint(self.forward, x, use_reentrant=False, context_fn=self.context_fn)


def _checkpoint_resnet(visual: nn.Module) -> None:
    for stage in (visual.layer1, visual.layer2, visual.layer3, visual.layer4):
        for block in stage:
            if not isinstance(block.forward, _Checkpointed):
                block.forward = _Checkpointed(block)


def enable_grad_checkpointing(clip: nn.Module) -> None:
    """Checkpoint both towers of ``clip`` (an open_clip ``CLIP`` as ``towers.build_clip`` builds it)."""
    from open_clip.modified_resnet import ModifiedResNet
    from open_clip.timm_model import TimmModel
    from open_clip.transformer import VisionTransformer

    visual = clip.visual
    if isinstance(visual, (VisionTransformer, TimmModel)):
        visual.set_grad_checkpointing(True)
    elif isinstance(visual, ModifiedResNet):
        _checkpoint_resnet(visual)
    else:
        raise UsageError(f"train.grad_checkpointing: euclip cannot checkpoint a {type(visual).__name__} image tower; "
                         f"set train.grad_checkpointing=false")
    clip.transformer.grad_checkpointing = True
