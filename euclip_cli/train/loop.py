"""``run(config, run_dir)``: the one trainer, linear, in sections.

Start-up order: resume from the run directory's own latest checkpoint if there is one,
else start from scratch; the branch taken is returned and logged by the caller.
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import random
import signal
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional

import torch

from euclip_cli import config as C
from euclip_cli.data.loader import SkipCounter, list_shards, train_batches
from euclip_cli.model import EuclipModel, tokenizer_for, transforms_for
from euclip_cli.train import checkpoint
from euclip_cli.train.optim import build_optimizer, cosine_lr
from euclip_cli.train.step import forward_backward

# Consecutive skipped (non-finite) steps after which the run stops.
MAX_NONFINITE = 5


class RunError(Exception):
    """The run cannot proceed; the message says why and what to do."""


class RunConflict(RunError):
    """The run directory holds a run with another configuration."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_factory(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    if precision == "fp32":
        return contextlib.nullcontext
    if precision == "fp16" and device.type != "cuda":
        raise RunError("train.precision=fp16 needs a GPU (it relies on a gradient scaler); use bf16 or fp32 on the CPU")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)


def run_meta(cfg: C.Config, argv: list[str]) -> dict:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip() or "unknown"
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        rev, dirty = "unknown", False
    packages = {}
    for name in ("euclip", "torch", "torchvision", "open_clip_torch", "clip-benchmark", "webdataset", "numpy"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {"git_revision": rev, "git_dirty": dirty, "packages": packages, "seed": cfg.train.seed,
            "argv": argv, "python": platform.python_version(), "host": platform.node(), "recipe": cfg.recipe,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def prepare_run_dir(cfg: C.Config, run_dir: Path, argv: list[str]) -> None:
    """Create the run directory, or check that an existing one holds this same configuration."""
    config_path = run_dir / "config.json"
    if config_path.exists():
        stored = json.loads(config_path.read_text())
        if stored != json.loads(C.dumps(cfg)):
            changed = sorted(f"{s}.{k}" for s, v in stored.items() if isinstance(v, dict)
                             for k in v if v[k] != C.to_dict(cfg).get(s, {}).get(k))
            raise RunConflict(f"{run_dir} holds a run with another configuration (differs in: "
                              f"{', '.join(changed) or 'recipe'}); pass --name NEW to start a separate run")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path.write_text(C.dumps(cfg))
    (run_dir / "meta.json").write_text(json.dumps(run_meta(cfg, argv), indent=2))


def checkpoint_meta(cfg: C.Config, model: EuclipModel) -> dict:
    """What a checkpoint is: evaluation reads this, never a directory name."""
    return {"arch": cfg.model.arch, "final_ln": cfg.model.final_ln, "geometry": cfg.geometry.name,
            "logit": model.geometry.logit, "blocks": cfg.geometry.blocks, "embed_dim": model.embed_dim}


def run(cfg: C.Config, run_dir: Path, argv: Optional[list[str]] = None,
        on_step: Optional[Callable[[int, int, dict], None]] = None) -> dict:
    """Train ``cfg`` into ``run_dir``; returns a summary. Resumes automatically from ``run_dir``."""
    # ---- set-up
    prepare_run_dir(cfg, run_dir, argv or sys.argv)
    device = resolve_device(cfg.train.device)
    autocast = autocast_factory(cfg.train.precision, device)
    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    model = EuclipModel(cfg).to(device)
    optimizer = build_optimizer(model, cfg.optim)
    total = C.total_steps(cfg)
    interval = max(1, math.ceil(total / cfg.train.checkpoints))
    ckpt_dir = run_dir / "checkpoints"

    # ---- resume
    step, branch = 0, "scratch"
    found = checkpoint.latest(ckpt_dir)
    if found is not None:
        state = checkpoint.load(found, map_location=str(device))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng_torch"])
        step, branch = state["step"], f"resumed from {found.name}"
    def summary(branch: str, ckpt: Optional[Path], interrupted: bool, skipped: int, nonfinite: int) -> dict:
        return {"branch": branch, "steps": step, "total_steps": total, "checkpoint": str(ckpt),
                "run_dir": str(run_dir), "interrupted": interrupted, "skipped_samples": skipped,
                "nonfinite_steps": nonfinite}

    if step >= total:
        return summary("already complete", found, interrupted=False, skipped=0, nonfinite=0)

    # ---- data
    hint = "euclip download world" if cfg.data.dataset == "world" else f"euclip download --recipe {cfg.recipe}"
    shards = list_shards(C.train_dir(cfg), hint)
    train_tf, _ = transforms_for(model.clip)
    skips = SkipCounter()
    # Seeded by the step so a resumed run draws fresh shards instead of replaying the first ones.
    batches = train_batches(shards, cfg.data.batch_size, train_tf, tokenizer_for(cfg.model.arch),
                            seed=cfg.train.seed * 1_000_003 + step, shuffle_buffer=cfg.data.shuffle_buffer, skips=skips,
                            workers=cfg.data.workers)

    def save() -> Path:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                 "config": C.to_dict(cfg), "meta": checkpoint_meta(cfg, model), "rng_torch": torch.get_rng_state()}
        return checkpoint.save(state, ckpt_dir, step, cfg.train.keep_checkpoints)

    stop = {"signal": None}

    def request_stop(signum, _frame):
        stop["signal"] = signum

    # SIGTERM (preemption) and SIGINT finish the step, checkpoint, and return. Handlers can only
    # be installed from the main thread; elsewhere the caller owns signals.
    in_main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)} if in_main else {}
    writer = None
    if cfg.train.tensorboard:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(str(run_dir / "tensorboard"))
    sdpa = contextlib.nullcontext()
    if cfg.train.sdpa_math:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa = sdpa_kernel([SDPBackend.MATH])

    # ---- loop
    nonfinite_run, nonfinite_total, last_ckpt = 0, 0, found
    metrics = (run_dir / "metrics.jsonl").open("a")
    window_start, window_samples = time.time(), 0
    model.train()
    try:
        with sdpa:
            while step < total and stop["signal"] is None:
                lr = cosine_lr(step, cfg.optim.lr, cfg.optim.warmup_steps, total)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                images, tokens = next(batches)
                images, tokens = images.to(device, non_blocking=True), tokens.to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                terms = forward_backward(model, images, tokens, cfg.optim.accum_steps, cfg.loss.entail_weight,
                                         cfg.loss.entail_min_radius, autocast)
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                finite = bool(torch.isfinite(terms["loss"])) and all(bool(torch.isfinite(g).all()) for g in grads)
                if not finite:
                    nonfinite_run += 1
                    nonfinite_total += 1
                    if nonfinite_run >= MAX_NONFINITE:
                        raise RunError(f"{nonfinite_run} non-finite steps in a row at step {step}; stopped. "
                                       f"The last good checkpoint is {last_ckpt or 'none (no checkpoint yet)'}; "
                                       f"try a lower optim.lr or geometry.logit_scale_init")
                    continue
                nonfinite_run = 0
                if cfg.optim.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
                optimizer.step()
                model.clamp_scalars_()
                step += 1
                window_samples += images.shape[0]
                if step % cfg.train.log_every == 0 or step == 1 or step == total:
                    elapsed = time.time() - window_start
                    record = {"step": step, "samples": step * cfg.data.batch_size, "lr": lr,
                              **{k: v.item() for k, v in terms.items()}, **model.scalars(),
                              "samples_per_s": window_samples / max(elapsed, 1e-9),
                              "skipped_samples": skips.skipped, "nonfinite_steps": nonfinite_total}
                    metrics.write(json.dumps(record) + "\n")
                    metrics.flush()
                    if writer:
                        for key, value in record.items():
                            writer.add_scalar(f"train/{key}", value, step)
                    if on_step:
                        on_step(step, total, record)
                    window_start, window_samples = time.time(), 0
                if step % interval == 0 or step == total:
                    last_ckpt = save()
        if stop["signal"] is not None and (last_ckpt is None or not last_ckpt.name.endswith(f"_{step}.pt")):
            last_ckpt = save()
    finally:
        metrics.close()
        if writer:
            writer.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return summary(branch, last_ckpt, stop["signal"] is not None, skips.skipped, nonfinite_total)
