"""Operations one training step dispatches, counted on the CPU: a predictor of a launch-bound GPU's time.

A GPU that computes a step faster than the host can queue it waits on the host, and the host's
time is then about proportional to the operations it launches (each passes through the dispatcher
and becomes at least one kernel). ``OpCounter`` counts them with torch's dispatch mode, leaving
out views (they only describe memory), and counts apart the operations after which a GPU's host
would have to wait for the device (``HOST_READS``).

``step_ops`` counts one step of euclip's trainer as its loop runs it (the text tower's plan made on
the host, the step on the device, the update behind the non-finite guard) and one of OpenCLIP's
trainer (``open_clip.CLIP`` forward, ``ClipLoss``, backward, AdamW as OpenCLIP builds it, the logit
scale's clamp), on the same model, batch and captions, under bf16 autocast. CPU autocast casts
a few operations other than CUDA's does, so the counts are a GPU's within a few percent, alike for both.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operations whose result's size or value the host needs: on a GPU each waits for the device.
HOST_READS = frozenset({"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique2",
                        "aten.unique_dim", "aten.unique_consecutive", "aten.equal", "aten.is_nonzero",
                        "aten.repeat_interleave"})


def _boolean_mask(args: tuple) -> bool:
    """Whether an ``aten.index`` call indexes by a boolean mask (its result's size depends on the mask)."""
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


class OpCounter(TorchDispatchMode):
    """Counts, by name, the operations dispatched while active: ``ops`` those that launch work (no views),
    ``reads`` those after which a GPU's host would wait for the device (``HOST_READS``, boolean indexing)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if not func.is_view:
            self.ops[name] += 1
        if name in HOST_READS or name == "aten.index" and _boolean_mask(args):
            self.reads[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def counted(phase: Callable[[], object]) -> OpCounter:
    """Run ``phase`` once under an ``OpCounter``; return the counter."""
    with OpCounter() as counter:
        phase()
    return counter


def euclip_phases(arch: str, tokens: torch.Tensor, text_groups: int, accum_steps: int = 1) -> dict[str, Callable]:
    """The phases of one step of euclip's trainer, as its loop runs them (``train.loop``): ``plan`` (the
    text tower's groups, on the host), ``step`` (forward and backward) and ``update`` (the non-finite
    guard, the fused AdamW, the scalars' clamp). ``text_groups`` is ``model.text_groups``."""
    from euclip_cli import config as C
    from euclip_cli.config import STUDY_RUN_RECIPE
    from euclip_cli.device import autocast_factory
    from euclip_cli.model import EuclipModel
    from euclip_cli.optim import build_optimizer
    from euclip_cli.step import NonfiniteGuard, apply_update, forward_backward
    from euclip_cli.towers import image_size

    cfg = C.load_config(STUDY_RUN_RECIPE, [f"model.arch={arch}", f"data.batch_size={len(tokens)}",
                                       f"optim.accum_steps={accum_steps}", f"model.text_groups={text_groups}"])
    torch.manual_seed(0)
    model = EuclipModel(cfg)
    optimizer = build_optimizer(model, cfg.optim)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    params = [p for p in model.parameters() if p.requires_grad]
    guard = NonfiniteGuard(torch.device("cpu"))
    size = image_size(model.clip)
    images = torch.randn(len(tokens), 3, size, size)
    autocast = autocast_factory("bf16", torch.device("cpu"))
    box: dict = {}

    def plan():
        box["plans"] = model.text_plans(tokens, accum_steps)

    def step():
        optimizer.zero_grad(set_to_none=True)
        box["terms"] = forward_backward(model, images, tokens, accum_steps, cfg.loss.entail_weight,
                                        cfg.loss.entail_min_radius, autocast, plans=box["plans"])

    def update():
        skip = guard.check(box["terms"]["loss"], [p.grad for p in params if p.grad is not None])
        apply_update(model, optimizer, scaler, params, cfg.optim.grad_clip, skip)

    return {"plan": plan, "step": step, "update": update}


def openclip_phases(arch: str, tokens: torch.Tensor) -> dict[str, Callable]:
    """One step of OpenCLIP's trainer (``open_clip_train.train.train_one_epoch`` at bf16, no scaler):
    ``step`` (its model's forward on the full context, ``ClipLoss``, backward) and ``update`` (AdamW
    with OpenCLIP's two groups, on the multi-tensor path a GPU takes by default, and the clamp)."""
    import open_clip
    from open_clip.loss import ClipLoss

    from euclip_cli.towers import image_size
    from euclip_cli.towers.archs import ARCHS, open_clip_model

    torch.manual_seed(0)
    clip = open_clip.CLIP(**ARCHS[arch].open_clip_config()) if arch in ARCHS else open_clip_model(arch)
    exempt = [p for n, p in clip.named_parameters() if p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n
              or "logit_scale" in n]
    ids = {id(p) for p in exempt}
    optimizer = torch.optim.AdamW([{"params": exempt, "weight_decay": 0.0},
                                   {"params": [p for p in clip.parameters() if id(p) not in ids], "weight_decay": 0.2}],
                                  lr=5e-4, betas=(0.9, 0.98), eps=1e-6, foreach=True)
    loss = ClipLoss()
    size = image_size(clip)
    images = torch.randn(len(tokens), 3, size, size)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            image_features, text_features, scale = clip(images, tokens)
            total = loss(image_features, text_features, scale)
        total.backward()

    def update():
        optimizer.step()
        with torch.no_grad():
            clip.logit_scale.clamp_(0, math.log(100))

    return {"step": step, "update": update}


def step_ops(phases: dict[str, Callable]) -> dict:
    """Each phase's operation and host-read counts, on the second of two steps (the first sets up the
    optimizer's state and the allocator)."""
    for phase in phases.values():
        phase()
    counts = {name: counted(phase) for name, phase in phases.items()}
    return {name: {"ops": c.total, "reads": sum(c.reads.values()), "largest": dict(c.ops.most_common(6))}
            for name, c in counts.items()}


def text_flops(clip: torch.nn.Module, tokens: torch.Tensor, text_groups: int) -> tuple[float, float]:
    """``(trimmed, full)``: the text tower's forward and backward FLOPs for ``tokens``, in ``text_groups``
    groups (0: every length its own) and on the full context, counted by torch."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from euclip_cli.towers.text import text_features

    counts = []
    for run in (lambda: text_features(clip, tokens, max_groups=text_groups), lambda: clip.encode_text(tokens)):
        # The math kernel: the counter has no formula for the CPU's fused attention kernel.
        with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
            run().sum().backward()
        counts.append(counter.get_total_flops())
    return counts[0], counts[1]


# The text_groups settings the bench compares: one group (the batch cut to its longest caption), the
# GPU's default, three, and every length its own group (the CPU's default).
GROUPINGS = (1, 2, 3, 0)


def bench_ops(arch: str, captions: list[str], batch_size: int) -> dict:
    """Operations per step of euclip (at each of ``GROUPINGS``) and of OpenCLIP on one batch of ``captions``."""
    from euclip_cli.towers import build_clip, tokenizer_for
    from euclip_cli.towers.text import text_plan

    tokens = tokenizer_for(arch)(captions[:batch_size])
    openclip = step_ops(openclip_phases(arch, tokens))
    clip = build_clip(arch)
    rows = []
    for groups in GROUPINGS:
        trimmed, full = text_flops(clip, tokens, groups)
        plan = text_plan(clip, tokens, groups)
        rows.append({"text_groups": groups, "groups_in_batch": len(plan.sizes) if plan else 1,
                     "phases": step_ops(euclip_phases(arch, tokens, groups)),
                     "text_flops": trimmed, "full_text_flops": full})
    every = next(r for r in rows if r["text_groups"] == 0)
    saving = every["full_text_flops"] - every["text_flops"]
    for row in rows:
        row["step_vs_openclip"] = row["phases"]["step"]["ops"] / openclip["step"]["ops"]
        row["saving_kept"] = (row["full_text_flops"] - row["text_flops"]) / saving if saving else None
    return {"arch": arch, "batch_size": len(tokens), "context": tokens.shape[1], "openclip": openclip, "euclip": rows}
