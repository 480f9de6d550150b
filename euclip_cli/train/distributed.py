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
from typing import Any, Optional

import torch
import torch.distributed as dist

from euclip_cli.errors import UsageError
from euclip_cli.workers import die_with_parent


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    # The process group for the ranks' decisions (stop now? can every rank read the checkpoint?) and
    # counters: gloo, on host tensors, so that agreeing on them never waits for a GPU (under NCCL a
    # collective on a device tensor read back with .item() would wait for every queued kernel).
    # None: the default group, when that is gloo already.
    control: Optional[Any] = None

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

    def gather_with_grad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, ...) per rank -> (world * B, ...) in rank order, every slice carrying gradients: the backward
        pass sums each slice's gradients over ranks and hands them to the rank it came from (torch's
        differentiable all_gather, as OpenCLIP's ``--gather-with-grad``)."""
        if not self.enabled:
            return x
        from torch.distributed.nn.functional import all_gather

        return torch.cat(all_gather(x.contiguous()))

    def offset(self, local_batch: int) -> int:
        """Where this rank's samples start in the global batch (its slice of ``gather``'s output)."""
        return self.rank * local_batch

    def sum_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """A tensor summed over ranks, on its device (no host read: the loss terms a local loss reports)."""
        if not self.enabled:
            return x
        total = x.clone()
        dist.all_reduce(total)
        return total

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on one (stop requests must be collective)."""
        return bool(self._reduce(int(flag), dist.ReduceOp.MAX))

    def all(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on all of them."""
        return bool(self._reduce(int(flag), dist.ReduceOp.MIN))

    def sum(self, count: int) -> int:
        """The sum of ``count`` over the ranks, on every rank."""
        return self._reduce(count, dist.ReduceOp.SUM)

    def _reduce(self, value: int, op) -> int:
        if not self.enabled:
            return value
        box = torch.tensor([value], dtype=torch.int64)  # on the host: see ``control``
        dist.all_reduce(box, op=op, group=self.control)
        return int(box.item())

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


# DDP's default bucket size: large enough that NCCL's per-call latency is paid a few times per
# step rather than once per parameter tensor, small enough that the first buckets' all-reduces
# start while most of the backward pass is still to run.
BUCKET_BYTES = 25 * 2**20


class GradientReducer:
    """Sums every gradient over ranks while the last backward pass of a step is still running.

    As DDP does, gradients live in flat buckets (``attach`` makes each ``param.grad`` a view of
    its bucket, so backward accumulates into the bucket and nothing is copied), and a bucket's
    all-reduce is launched, asynchronously and in place, as soon as all its gradients are final:
    one collective per ~25 MB instead of one per parameter tensor. Buckets launch in one fixed
    order, the same on every rank: NCCL and gloo pair collectives by their order, so a rank that
    finished its buckets in another order would otherwise sum one bucket with another. A bucket
    that is ready before its predecessors waits for them. ``last`` (the loss's scalars, which get
    gradients on rank 0 only) come after every bucket and are reduced by ``finish``, with zeros
    where a rank has no gradient.

    Use: ``attach()`` after the optimizer's ``zero_grad`` at the start of a step, ``arm()`` before
    the step's last backward, ``finish()`` after it.
    """

    def __init__(self, ranks: Dist, params: list[torch.nn.Parameter], last: tuple = (),
                 bucket_bytes: int = BUCKET_BYTES):
        last_ids = {id(p) for p in last}
        # Reverse registration order is about the order backward produces gradients in (outputs
        # first), so most launches are not held back by a predecessor.
        encoders = [p for p in reversed(params) if id(p) not in last_ids]
        self.last = [p for p in params if id(p) in last_ids]
        self.enabled = ranks.enabled
        self.buckets: list[list[torch.nn.Parameter]] = []
        filled = 0  # bytes in the last bucket
        for p in encoders:
            current = self.buckets[-1] if self.buckets else None
            size = p.numel() * p.element_size()
            # A bucket holds one dtype on one device; a gradient view must have its parameter's
            # (contiguous) layout, so a non-contiguous parameter gets a bucket of its own.
            if (current is not None and p.is_contiguous() and current[0].is_contiguous()
                    and (p.dtype, p.device) == (current[0].dtype, current[0].device) and filled + size <= bucket_bytes):
                current.append(p)
                filled += size
            else:
                self.buckets.append([p])
                filled = size
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.flat: list[torch.Tensor] = []
        self.armed = False
        self.waiting: list[int] = []
        self.launched = 0
        self.handles: list = []
        if self.enabled:  # the hooks live as long as the parameters: one reducer per model
            for p in encoders:
                p.register_post_accumulate_grad_hook(self._on_gradient)

    def attach(self) -> None:
        """Zero the buckets and make every bucketed gradient a view of its bucket (after ``zero_grad``)."""
        if not self.enabled:
            return
        if not self.flat:
            self.flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)
                         if b[0].is_contiguous() else torch.zeros_like(b[0]) for b in self.buckets]
        for bucket, flat in zip(self.buckets, self.flat):
            flat.zero_()
            offset = 0
            for p in bucket:
                p.grad = flat[offset:offset + p.numel()].view_as(p) if p.is_contiguous() else flat
                offset += p.numel()

    def arm(self) -> None:
        self.armed = self.enabled
        self.waiting = [len(b) for b in self.buckets]
        self.launched = 0
        self.handles = []

    def _on_gradient(self, param: torch.nn.Parameter) -> None:
        if not self.armed:
            return
        self.waiting[self.bucket_of[id(param)]] -= 1
        while self.launched < len(self.buckets) and self.waiting[self.launched] == 0:
            self._launch_bucket()

    def _launch_bucket(self) -> None:
        flat = self.flat[self.launched] if self.flat else None
        # A gradient autograd allocated itself (no attach() since zero_grad) would miss the sum.
        if flat is None or any(p.grad is None or (p.grad is not flat and p.grad._base is not flat)
                               for p in self.buckets[self.launched]):
            raise RuntimeError("GradientReducer: a gradient is not a view of its bucket; call attach() after "
                               "the optimizer's zero_grad at the start of every step")
        self.handles.append(dist.all_reduce(flat, async_op=True))
        self.launched += 1

    def finish(self) -> None:
        """Launch what is left in order, then wait for every reduction of the step."""
        if not self.enabled:
            return
        while self.launched < len(self.buckets):
            self._launch_bucket()
        for p in self.last:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.handles.append(dist.all_reduce(p.grad, async_op=True))
        for handle in self.handles:
            handle.wait()
        self.armed = False
        self.handles = []


def environment_int(name: str, default: Optional[int], low: int, high: int) -> int:
    """The integer environment variable ``name`` (``default`` when unset; None: it must be set), within
    [low, high]; a usage error naming the variable and its value otherwise."""
    text = os.environ.get(name)
    if text is None:
        if default is None:
            raise UsageError(f"environment variable {name} is not set, but WORLD_SIZE is above 1: start the run "
                             f"with torchrun (euclip train --nproc-per-node N), or unset WORLD_SIZE to run alone")
        return default
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise UsageError(f"environment variable {name}={text!r} is not an integer in [{low}, {high}]: torchrun sets it; "
                         f"unset it (with WORLD_SIZE, RANK, LOCAL_RANK) to run alone")
    return value


# More ranks than any job runs; the bound keeps a variable's value a number a process group can take.
MAX_RANKS = 1 << 20


def launched_rank() -> int:
    """This process's rank as torchrun sets it (RANK), 0 when run alone."""
    return environment_int("RANK", 0, 0, MAX_RANKS - 1)


def from_environment(device_type: str) -> Dist:
    """Join the process group torchrun describes in the environment, or run alone. Its variables are
    checked first (a malformed one is named, not a traceback or a wait for peers that never come)."""
    world = environment_int("WORLD_SIZE", 1, 1, MAX_RANKS)
    if world == 1:
        return Dist()
    rank = environment_int("RANK", None, 0, world - 1)
    local_rank = environment_int("LOCAL_RANK", 0, 0, world - 1)
    environment_int("MASTER_PORT", None, 1, 65535)
    if not os.environ.get("MASTER_ADDR", "").strip():
        raise UsageError("environment variable MASTER_ADDR is not set, but WORLD_SIZE is above 1: start the run with "
                         "torchrun, or unset WORLD_SIZE to run alone")
    if "TORCHELASTIC_RUN_ID" in os.environ:
        # A rank dies with its torchrun agent, taking that SIGTERM as a preemption's (a checkpoint, then exit):
        # an agent killed outright left its ranks training to their run's end, unsupervised. torchrun starts
        # them from its main thread, which lives as long as it does (the signal follows the parent thread).
        die_with_parent()
    timeout = datetime.timedelta(minutes=30)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if dist.get_backend() != "gloo" else None
    return Dist(rank=rank, world=world, local_rank=local_rank, control=control)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
