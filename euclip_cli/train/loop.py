"""``run(config, run_dir)``: the one trainer, linear, in sections.

Start-up order: resume from the run directory's own latest checkpoint if there is one,
else start from scratch; the branch taken is returned and logged by the caller.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import signal
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional

import torch

from euclip_cli import config as C
from euclip_cli.data.feed import DeviceFeed
from euclip_cli.data.loader import (STOP_SIGNALS, WAIT_BOUND, RepeatBatches, TrainBatches, list_shards,
                                    segment_steps_for)
from euclip_cli.data.openclip_pipeline import OpenCLIPBatches
from euclip_cli.data.downloads import training_record
from euclip_cli.data.world_files import check_shared_world
from euclip_cli.worlddir import WorldDir, fingerprint, recorded_settings
from euclip_cli.workers import stop_dying_with_parent, usable_cores
from euclip_cli.device import (autocast_factory, cpu_name, git_state, host_memory_bytes, is_out_of_memory,
                                resolve_device, resolve_precision)
from euclip_cli.errors import Failure, UsageError
from euclip_cli.model import EuclipModel, check_buildable, init_source, initial_model, load_run_weights
from euclip_cli.optim import build_optimizer, cosine_lr
from euclip_cli.rundir import RunDir, checkpoint_meta, load_checkpoint
from euclip_cli.step import LocalLoss, NonfiniteGuard, apply_update, forward_backward
from euclip_cli.towers import archs, batchnorm_statistics, tokenizer_for, transforms_for
from euclip_cli.towers.checkpointing import enable_grad_checkpointing
from euclip_cli.train import distributed
from euclip_cli.train.metrics import MetricsWriters

# Consecutive skipped (non-finite) steps after which the run stops (seen at the next logging or
# checkpoint step: the steps between do not wait for the device to count them).
MAX_NONFINITE = 5
# On a GPU the training process launches kernels and copies batches; more compute threads than this
# would only spin beside the loader workers (train.host_threads).
HOST_THREADS_ON_GPU = 4


class RunError(Failure):
    """The run cannot proceed; the message says why and what to do."""


def waits_for_data(record: dict) -> bool:
    """Whether a training record's steps waited for data long enough that the loaders bound the trainer
    (``loader.WAIT_BOUND``); its progress line then says so."""
    return record["data_wait_share"] >= WAIT_BOUND


def run_meta(cfg: C.Config, argv: list[str], precision: str) -> dict:
    rev, dirty = git_state()
    packages = {}
    for name in ("euclip", "torch", "torchvision", "open_clip_torch", "clip-benchmark", "webdataset", "numpy"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    # ``precision``: what train.precision resolved to on this machine (``auto`` depends on its CPU or GPU).
    return {"git_revision": rev, "git_dirty": dirty, "packages": packages, "seed": cfg.train.seed, "precision": precision,
            "argv": argv, "python": platform.python_version(), "host": platform.node(), "cpu": cpu_name(),
            "recipe": cfg.recipe,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def resume_state(run: RunDir, ranks: distributed.Dist) -> tuple[Optional[Path], Optional[dict]]:
    """``(checkpoint, its state)`` every rank resumes from. Rank 0 chooses (the one ``latest`` names, verified:
    ``RunDir.readable_checkpoint``) and tells the others; whatever goes wrong, on rank 0 or on another rank, stops every
    rank with one message instead of leaving the others waiting in a collective."""
    if not ranks.enabled:
        return run.readable_checkpoint()
    path = state = None
    name, problem = None, None
    if ranks.main:
        try:
            path, state = run.readable_checkpoint()
            name = path.name if path else None
        except Failure as err:
            problem = str(err)
    name, problem = ranks.broadcast_object((name, problem))
    if problem:
        raise RunError(problem)
    readable = True
    if name is not None and not ranks.main:
        path = run.checkpoints_dir / name
        try:
            state = load_checkpoint(path)
        except Exception:  # unreadable here: every rank must learn it before anyone waits on a collective
            readable = False
    if not ranks.all(readable):
        raise RunError(f"rank 0 resumes from {run.checkpoints_dir / name}, which another rank cannot read: the run "
                       f"directory must be on a filesystem every node shares")
    return path, state


def run(cfg: C.Config, run_dir: Path, argv: Optional[list[str]] = None,
        on_step: Optional[Callable[[int, int, dict], None]] = None) -> dict:
    """Train ``cfg`` into ``run_dir``; returns a summary. Resumes automatically from ``run_dir``.

    Under torchrun every rank calls this; rank 0 writes the run directory and the logs.
    """
    # ---- set-up
    ranks = distributed.from_environment(resolve_device(cfg.train.device).type)
    device = resolve_device(cfg.train.device, ranks.local_rank, ranks.world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    precision = resolve_precision(cfg.train.precision, device)
    if cfg.data.batch_size % (ranks.world * cfg.optim.accum_steps):
        raise RunError(f"data.batch_size {cfg.data.batch_size} (the global batch) must divide evenly into "
                       f"{ranks.world} processes x {cfg.optim.accum_steps} accumulation steps")
    # The configuration first: what the model cannot be built from (an unknown model.arch) is the
    # user's first problem to hear about, before whatever the data folder lacks; the towers are built
    # only once the data is there (a large arch takes a while).
    check_buildable(cfg)
    check_batch_fits(cfg, ranks.world)
    runs_dir = Path(run_dir).parent
    # The data and the model are checked before the run directory exists (this object only names it): a
    # corrected command must not be refused as "another configuration" by a directory its failed first
    # try left behind. A resumed run loads its own towers: the run it started from need not be there any more.
    directory = RunDir(run_dir)
    fresh = directory.latest_checkpoint() is None
    if cfg.model.init_from and fresh:
        init_source(cfg, runs_dir)  # a run to start from that is not there: before any data is read
    hint = f"euclip download --recipe {cfg.recipe}" if cfg.recipe else "euclip download world"
    downloaded = training_record(C.train_dir(cfg)) or world_record(cfg, hint)
    if not fresh:
        check_same_world(directory, downloaded, C.train_dir(cfg))
    shards = list_shards(C.train_dir(cfg), hint)
    model = initial_model(cfg, runs_dir, towers=fresh).to(device)
    with contextlib.ExitStack() as guard:
        if ranks.main:
            guard.enter_context(directory.lock())
            # ``data``: the download's manifest (subset, success rate, bytes) when the shards came from one.
            directory.claim(C.to_dict(cfg), run_meta(cfg, argv or sys.argv, precision) | {"data": downloaded,
                                                                           "init_from": model.started_from},
                            complete=lambda stored: C.to_dict(C.from_dict(stored, str(directory.config_file))))
        try:
            return _train(cfg, model, directory, shards, ranks, device, precision, on_step)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            raise RunError(f"out of memory on {device} with data.batch_size={cfg.data.batch_size} over {ranks.world} "
                           f"process(es) and optim.accum_steps={cfg.optim.accum_steps}: in a new run (--name NEW), raise "
                           f"optim.accum_steps, set train.grad_checkpointing=true or lower data.batch_size") from None


def check_batch_fits(cfg: C.Config, processes: int) -> None:
    """Refuse a batch whose images alone (uint8, at the tower's resolution, on one process) exceed the machine's
    memory: the loader would grow until the machine runs out. Its activations need far more; this bound only
    catches the impossible before a worker starts."""
    size = archs.lookup(cfg.model.arch).image_size
    need = cfg.data.batch_size // processes * 3 * size * size
    have = host_memory_bytes()
    if need > have:
        raise UsageError(f"data.batch_size={cfg.data.batch_size}: one batch of {size}-px images alone needs "
                         f"{need / 2 ** 30:,.0f} GiB per process, more than this machine's {have / 2 ** 30:,.0f} GiB; "
                         f"lower it (or spread it over more processes)")


def world_record(cfg: C.Config, download: str) -> Optional[dict]:
    """The settings of the embedded world a run trains on, for its metadata; None for other data.
    Raises UsageError when the shared world folder holds a world of other settings than the run's
    (``download`` is the command that writes the run's own)."""
    if cfg.data.dataset != "world":
        return None
    world = C.train_dir(cfg).parent
    found = WorldDir(world).manifest()
    if found is None:
        if not cfg.data.train_dir and world.exists():
            # The shared folder is euclip's: without a manifest its world was cut short (or is not euclip's).
            raise UsageError(f"{world} holds no finished embedded world (no manifest.json: its generation was cut "
                           f"short, or something else wrote it): delete {world} and run '{download}'")
        return None
    check_shared_world(cfg.data, world, found, f"delete {world} and run '{download}', or set those keys to its values")
    WorldDir(world).check_files(found, "train/")
    return {"source": "world", "fingerprint": fingerprint(found), **recorded_settings(found)}


def check_same_world(run: RunDir, data: Optional[dict], train_dir: Path) -> None:
    """Refuse to resume ``run`` on another embedded world than the one its ``meta.json`` records (``data``:
    the one ``train_dir`` holds now, ``world_record``'s): the steps to come would train on other data than
    the steps its checkpoint holds, under the same name, with nothing to tell them apart."""
    recorded = run.meta().get("data") or {}
    if not (data and "fingerprint" in data and "fingerprint" in recorded) or recorded["fingerprint"] == data["fingerprint"]:
        return
    changed = [f"{key} {recorded.get(key)!r} then, {data[key]!r} now" for key in data
               if key != "fingerprint" and recorded.get(key) != data[key]]
    raise UsageError(f"{run.path} trained on another embedded world than {train_dir.parent} now holds "
                     f"({'; '.join(changed) or 'another generator'}): resuming would train its remaining steps on "
                     f"other data. Regenerate that world with the run's settings (its meta.json, 'data'), or pass "
                     f"--name NEW to train a new run on this one")


def rank_mean(statistics: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The elementwise mean over ranks of each floating-point statistic; integer counters (BatchNorm's
    ``num_batches_tracked``, equal on every rank) are rank 0's."""
    return {name: torch.stack([s[name] for s in statistics]).mean(0) if value.is_floating_point() else value
            for name, value in statistics[0].items()}


def training_batches(cfg: C.Config, clip: torch.nn.Module, shards: list[str], ranks: distributed.Dist, step: int,
                     data_state: Optional[dict]):
    """This rank's batches from ``step`` on: euclip's loader at the checkpoint's position, or OpenCLIP's
    pipeline (``data.pipeline``), with the model's training transforms and tokenizer."""
    transform, _ = transforms_for(clip, cfg.data.crop_scale)
    tokenizer = tokenizer_for(cfg.model.arch)
    per_rank = cfg.data.batch_size // ranks.world
    if cfg.data.pipeline == "openclip":
        left = max(cfg.data.batch_size, cfg.optim.samples - step * cfg.data.batch_size)
        return OpenCLIPBatches(shards, per_rank, transform, tokenizer, seed=C.order_seed(cfg),
                               workers=cfg.data.workers, rank=ranks.rank, world=ranks.world, samples=left)
    batches = TrainBatches(shards, per_rank, transform, tokenizer, seed=C.order_seed(cfg),
                           shuffle_buffer=cfg.data.shuffle_buffer,
                           segment_steps=segment_steps_for(per_rank, cfg.data.shuffle_buffer, cfg.data.workers),
                           workers=cfg.data.workers, rank=ranks.rank, world=ranks.world, start=step, state=data_state,
                           sharing=cfg.data.sharing, decoder=cfg.data.decoder, decode_on=cfg.data.decode,
                           boxes=C.trains_on_boxes(cfg), **caption_augmentation(cfg))
    return RepeatBatches(batches) if cfg.data.pipeline == "repeat" else batches


def caption_augmentation(cfg: C.Config) -> dict:
    """The loader's ``caption`` argument: MERU's subreddit prefix where the recipe asks for it."""
    if not cfg.data.subreddit_prefix:
        return {}
    from euclip_cli.data.redcaps import SubredditPrefix

    return {"caption": SubredditPrefix(cfg.data.subreddit_prefix)}


def host_threads(setting: int, device: torch.device, workers: int) -> Optional[int]:
    """The training process's compute threads for ``train.host_threads``, or None to keep torch's choice:
    every core on a CPU, and wherever OMP_NUM_THREADS says otherwise (torchrun sets it to 1 for
    several processes a node). On a GPU, the cores the loader workers leave, at most
    ``HOST_THREADS_ON_GPU``: idle OpenMP threads spin for a while after each parallel region,
    taking the cores the workers decode on."""
    if setting:
        return setting
    if device.type != "cuda" or "OMP_NUM_THREADS" in os.environ:
        return None
    cores = usable_cores() // distributed.environment_int("LOCAL_WORLD_SIZE", 1, 1, distributed.MAX_RANKS)
    return max(1, min(HOST_THREADS_ON_GPU, cores - workers))


def skipped_share(skipped: int, step: int, batch_size: int) -> float:
    """The share of the samples read that could not be decoded, after ``step`` full global batches."""
    return skipped / max(1, skipped + step * batch_size)


def _train(cfg: C.Config, model: EuclipModel, directory: RunDir, shards: list[str], ranks, device: torch.device,
           precision: str, on_step: Optional[Callable[[int, int, dict], None]]) -> dict:
    """The training proper, under the run's lock: resume, then the loop."""
    run_dir = directory.path
    ranks.barrier()
    autocast = autocast_factory(precision, device)
    # fp16's narrow range needs loss scaling; with bf16 or fp32 the scaler is a no-op.
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    optimizer = build_optimizer(model, cfg.optim)
    params = [p for p in model.parameters() if p.requires_grad]
    reducer = distributed.GradientReducer(ranks, params, last=tuple(model.loss_scalars()))
    # Each rank's share of the global loss rather than the whole of it (loss.local_loss; one process: the whole).
    local = (LocalLoss(ranks.gather_with_grad, ranks.offset, ranks.sum_tensor)
             if cfg.loss.local_loss and ranks.enabled else None)
    total = C.total_steps(cfg)
    interval = max(1, math.ceil(total / cfg.train.checkpoints))

    # ---- resume
    step, branch, data_state = 0, "scratch", None
    # Read onto the CPU: load_state_dict copies each tensor to its parameter's device, and the RNG
    # state must stay a CPU ByteTensor (on a GPU, set_rng_state refuses it).
    found, state = resume_state(directory, ranks)
    if found is not None:
        load_run_weights(model, state, found)
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as err:  # torch's words for parameter groups that do not match
            raise RunError(f"{found}: its optimizer state does not fit this model ({err}); it was written by "
                           f"another euclip version or copied from another run") from None
        scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng_torch"])
        step, branch = state["step"], f"resumed from {found.name}"
        data_states = state["data"]
        data_state = data_states[ranks.rank] if len(data_states) == ranks.world else None
    ranks.broadcast_parameters(model)
    if found is not None and len(state.get("batchnorm_ranks", [])) == ranks.world:
        # Each rank's BatchNorm statistics drift on its own data; it continues from its own, as an
        # uninterrupted run would (a different number of ranks starts every rank from their mean).
        with torch.no_grad():
            own = state["batchnorm_ranks"][ranks.rank]
            for name, buffer in batchnorm_statistics(model).items():
                buffer.copy_(own[name])
    if cfg.train.grad_checkpointing:
        enable_grad_checkpointing(model.clip)
    if cfg.train.compile:
        model.compile_encoders()

    def summary(branch: str, ckpt: Optional[Path], interrupted: bool, skipped: int, nonfinite: int) -> dict:
        return {"branch": branch, "steps": step, "total_steps": total, "checkpoint": str(ckpt),
                "run_dir": str(run_dir), "interrupted": interrupted, "skipped_samples": skipped,
                "skipped_fraction": skipped_share(skipped, step, cfg.data.batch_size),
                "nonfinite_steps": nonfinite, "processes": ranks.world, "precision": precision}

    if step >= total:
        return summary("already complete", found, interrupted=False, skipped=0, nonfinite=0)

    # ---- data: this rank's share of the global batch, from the exact position the checkpoint holds
    batches = training_batches(cfg, model.clip, shards, ranks, step, data_state)
    if found is not None and not batches.resumed_exactly:
        branch += (" (data stream restarted: the checkpoint came from another number of processes or workers)"
                   if cfg.data.pipeline == "euclip" else
                   f" (data stream restarted: data.pipeline={cfg.data.pipeline} has no position to resume from)")
    feed = DeviceFeed(device, staging=cfg.data.staging, normalization=batches.normalization,
                      device_crops=batches.device_crops)

    saved = {"step": step if found is not None else -1}

    def save() -> Optional[Path]:
        """Collective: every rank contributes its data position and BatchNorm statistics; rank 0 writes."""
        saved["step"] = step
        own = (batches.state(), {name: b.detach().cpu() for name, b in batchnorm_statistics(model).items()})
        gathered = [own]
        if ranks.enabled:
            gathered = [None] * ranks.world
            torch.distributed.all_gather_object(gathered, own)
        if not ranks.main:
            return None
        data, statistics = [g[0] for g in gathered], [g[1] for g in gathered]
        weights = model.state_dict()
        extra = {}
        if ranks.enabled and statistics[0]:
            # The model's statistics are the ranks' mean (running variances averaged, as timm's
            # distribute_bn does); each rank's own are kept for resuming it exactly.
            weights.update(rank_mean(statistics))
            extra["batchnorm_ranks"] = statistics
        state = {"model": weights, "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                 "step": step, "data": data, "config": C.to_dict(cfg), **extra,
                 "meta": checkpoint_meta(C.to_dict(cfg), model.geometry.logit, model.embed_dim),
                 "rng_torch": torch.get_rng_state()}
        return directory.save_checkpoint(state, step, cfg.train.keep_checkpoints)

    stop = {"signal": None}

    def request_stop(signum, _frame):
        stop["signal"] = signum
        stop_dying_with_parent()  # stopping already: the agent's death, sent again, would only cut the stop short

    # The stop signals (preemption, Ctrl-C, a time limit's warning) finish the step, checkpoint, and
    # return. Handlers can only be installed from the main thread; elsewhere the caller owns signals.
    in_main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, request_stop) for s in STOP_SIGNALS} if in_main else {}
    writers = None
    if ranks.main:
        writers = MetricsWriters(directory, step, cfg.train.tensorboard, cfg.train.wandb_project if cfg.train.wandb else None,
                                 C.to_dict(cfg))
    sdpa = contextlib.nullcontext()
    if cfg.train.sdpa_math and device.type == "cpu":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa = sdpa_kernel([SDPBackend.MATH])
    # fp16: the scaler may halve its scale up to 16 times (from 2**16) before a step is finite.
    max_nonfinite = MAX_NONFINITE + (16 if scaler.is_enabled() else 0)
    guard = NonfiniteGuard(device)

    def check_guard() -> int:
        """Read the device's non-finite counts (a wait for the device: logging and checkpoint steps only);
        stop the run after ``max_nonfinite`` in a row. Returns the count so far."""
        total, longest = guard.read()
        if longest >= max_nonfinite:
            # Measured: torch 2.14.1's compiled bf16 ViT backward is non-finite on some CPUs.
            compiled = (" or train.compile=false (the compiled bf16 backward is not finite on some CPUs)"
                        if cfg.train.compile else "")
            raise RunError(f"{longest} non-finite steps in a row by step {step} (their updates were skipped); "
                           f"stopped. The last checkpoint is {last_ckpt or 'none (no checkpoint yet)'}; try a "
                           f"lower optim.lr or geometry.logit_scale_init{compiled}")
        return total

    # ---- loop: a step that neither logs nor checkpoints queues its work and never waits for the device
    last_ckpt, stopping = found, False
    window_start, window_samples, window_wait = time.perf_counter(), 0, 0.0
    sliced = cfg.train.bench_step_samples // ranks.world
    # A batch of boxes holds its samples and then one box of each (data.loader.TrainStream).
    halves = 2 if C.trains_on_boxes(cfg) else 1
    threads, callers_threads = host_threads(cfg.train.host_threads, device, cfg.data.workers), torch.get_num_threads()
    model.train()
    try:
        if threads:
            torch.set_num_threads(threads)  # for the run only: the caller's count comes back at its end
        with sdpa:
            while step < total and not stopping:
                lr = cosine_lr(step, cfg.optim.lr, cfg.optim.warmup_steps, total)
                for group in optimizer.param_groups:
                    # A checkpoint written before groups carried lr_scale restores groups without it.
                    group["lr"] = lr * group.get("lr_scale", 1.0)
                waited = time.perf_counter()
                batch = next(batches)
                window_wait += time.perf_counter() - waited
                window_samples += batch.size // halves * ranks.world
                images, tokens, host_tokens = feed(batch)
                if sliced:
                    images, tokens, host_tokens = (torch.cat([half[:sliced] for half in x.chunk(halves)])
                                                   for x in (images, tokens, host_tokens))
                # The text tower's groups, planned from the host's copy of the tokens.
                plans = model.text_plans(host_tokens, cfg.optim.accum_steps * halves)
                optimizer.zero_grad(set_to_none=True)
                reducer.attach()
                terms = forward_backward(model, images, tokens, cfg.optim.accum_steps, cfg.loss.entail_weight,
                                         cfg.loss.entail_min_radius, autocast, gather=ranks.gather,
                                         owns_scalars=ranks.main, backward=lambda loss: scaler.scale(loss).backward(),
                                         before_last_backward=reducer.arm, plans=plans, local=local,
                                         boxes=halves == 2)
                reducer.finish()
                scaler.unscale_(optimizer)
                # Every rank holds the same summed gradients and global loss, so all skip alike.
                skip = guard.check(terms["loss"], [p.grad for p in params if p.grad is not None])
                apply_update(model, optimizer, scaler, params, cfg.optim.grad_clip, skip)
                step += 1
                checkpointing = step % interval == 0 or step == total
                if step % cfg.train.log_every == 0 or step == 1 or step == total:
                    nonfinite_steps = check_guard()
                    skipped = ranks.sum(batches.skipped)
                    elapsed = time.perf_counter() - window_start
                    record = {"step": step, "samples": step * cfg.data.batch_size, "lr": lr,
                              **{k: v.item() for k, v in terms.items()}, **model.scalars(),
                              "samples_per_s": window_samples / max(elapsed, 1e-9),
                              # The share of the window the trainer spent waiting for its next batch
                              # (OpenCLIP logs the same as data time): near 1, the loader is the bottleneck.
                              "data_wait_share": min(1.0, window_wait / max(elapsed, 1e-9)),
                              # What the window's batches cost their loaders (every rank's taken as alike).
                              **batches.take_work().record(max(1, cfg.data.workers), cfg.data.batch_size),
                              "skipped_samples": skipped, "nonfinite_steps": nonfinite_steps}
                    if scaler.is_enabled():
                        record["loss_scale"] = scaler.get_scale()
                    if device.type == "cuda":
                        record["gpu_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
                    if ranks.main:
                        writers.write(record, step)
                        if on_step:
                            on_step(step, total, record)
                    window_start, window_samples, window_wait = time.perf_counter(), 0, 0.0
                    share = skipped_share(skipped, step, cfg.data.batch_size)
                    if share > cfg.data.max_skipped_fraction:  # every rank holds the same count
                        save()
                        raise RunError(f"{skipped:,} samples ({share:.0%} of those read) could not be decoded, more "
                                       f"than data.max_skipped_fraction={cfg.data.max_skipped_fraction}; stopped at "
                                       f"step {step} with a checkpoint. Check the shards in {batches.folder}, "
                                       f"or raise the limit and rerun to continue")
                elif checkpointing:
                    check_guard()  # a checkpoint waits for the device anyway
                stopping = ranks.any(stop["signal"] is not None)
                if checkpointing:
                    last_ckpt = save()
        if stopping and saved["step"] != step:
            last_ckpt = save()
    finally:
        batches.close()
        torch.set_num_threads(callers_threads)
        if writers:
            writers.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return summary(branch, last_ckpt, stopping, batches.skipped, guard.read()[0])
