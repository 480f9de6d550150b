"""Data parallelism across processes started by torchrun: NCCL on GPUs, gloo on CPUs.

Every rank computes the contrastive loss of the *global* batch: features are all-gathered,
and the rank's own slice is put back with its autograd graph, so gradients reach each
encoder through the samples of its own rank only. Summing gradients over ranks then gives
exactly the gradient of the global loss. The learnable scalars (logit scale, curvature)
enter every rank's copy of the same loss; they are live on rank 0 only, so the sum counts
them once.

Gradients are summed by ``GradientReducer`` rather than by DDP: the accumulation passes
back-propagate k times per step and the scalars have gradients on rank 0 only, which DDP cannot
express without ``no_sync`` juggling and ``find_unused_parameters``. Like DDP it overlaps the
all-reduces with the last backward pass and launches them in one fixed order on every rank.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(B, ...) per rank -> (world * B, ...) in rank order; only this rank's slice carries gradients."""
        if not self.enabled:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.detach().contiguous())
        parts[self.rank] = x
        return torch.cat(parts)

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank when ``flag`` is true on one (stop requests must be collective)."""
        return self._agree(flag, device, dist.ReduceOp.MAX)

    def all(self, flag: bool, device: torch.device) -> bool:
        """True on every rank when ``flag`` is true on all of them."""
        return self._agree(flag, device, dist.ReduceOp.MIN)

    def _agree(self, flag: bool, device: torch.device, op) -> bool:
        if not self.enabled:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(value, op=op)
        return bool(value.item())

    def broadcast_object(self, value):
        """Rank 0's ``value`` on every rank (a small picklable object)."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        if self.enabled:
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


class GradientReducer:
    """Sums every gradient over ranks while the last backward pass of a step is still running.

    Each parameter's all-reduce is launched (asynchronously, in place: no flat copy of the
    gradients) as soon as its gradient is final, but only in one fixed order, the same on every
    rank: NCCL and gloo pair collectives by their order, so a rank that produced gradients in
    another order would otherwise sum one tensor with another. A gradient that is ready before its
    predecessors waits for them. ``last`` (the loss's scalars, which get gradients on rank 0 only)
    come after every encoder parameter and are reduced by ``finish``, with zeros where a rank has
    no gradient.

    Use: ``arm()`` before the step's last backward, ``finish()`` after it.
    """

    def __init__(self, ranks: Dist, params: list[torch.nn.Parameter], last: tuple = ()):
        last_ids = {id(p) for p in last}
        # Reverse registration order is about the order backward produces gradients in (outputs
        # first), so most launches are not held back by a predecessor.
        self.order = [p for p in reversed(params) if id(p) not in last_ids] + [p for p in params if id(p) in last_ids]
        self.position = {id(p): i for i, p in enumerate(self.order)}
        self.enabled = ranks.enabled
        self.armed = False
        self.ready = [False] * len(self.order)
        self.launched = 0
        self.handles: list = []
        if self.enabled:  # the hooks live as long as the parameters: one reducer per model
            for p in self.order:
                if id(p) not in last_ids:
                    p.register_post_accumulate_grad_hook(self._on_gradient)

    def arm(self) -> None:
        self.armed = self.enabled
        self.ready = [False] * len(self.order)
        self.launched = 0
        self.handles = []

    def _on_gradient(self, param: torch.nn.Parameter) -> None:
        if not self.armed:
            return
        self.ready[self.position[id(param)]] = True
        while self.launched < len(self.order) and self.ready[self.launched]:
            self._launch(self.order[self.launched])

    def _launch(self, param: torch.nn.Parameter) -> None:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        self.handles.append(dist.all_reduce(param.grad, async_op=True))
        self.launched += 1

    def finish(self) -> None:
        """Launch what is left in order, then wait for every reduction of the step."""
        if not self.enabled:
            return
        while self.launched < len(self.order):
            self._launch(self.order[self.launched])
        for handle in self.handles:
            handle.wait()
        self.armed = False
        self.handles = []


def from_environment(device_type: str) -> Dist:
    """Join the process group torchrun describes in the environment, or run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    return Dist(rank=rank, world=world, local_rank=local_rank)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
