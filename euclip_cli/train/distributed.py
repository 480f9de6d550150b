"""Data parallelism across processes started by torchrun: NCCL on GPUs, gloo on CPUs.

Every rank computes the contrastive loss of the *global* batch: features are all-gathered,
and the rank's own slice is put back with its autograd graph, so gradients reach each
encoder through the samples of its own rank only. Summing gradients over ranks then gives
exactly the gradient of the global loss. The learnable scalars (logit scale, curvature)
enter every rank's copy of the same loss; they are live on rank 0 only, so the sum counts
them once.

Gradients are summed by hand (one flattened all-reduce) rather than by DDP's hooks: the
accumulation passes back-propagate k times per step and the scalars must be reduced
differently from the encoders, which DDP cannot express without ``no_sync`` juggling and
``find_unused_parameters``.
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

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Replace every gradient by its sum over ranks (missing gradients count as zero)."""
        if not self.enabled:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()

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
