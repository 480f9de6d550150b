"""Training speed: euclip's trainer against OpenCLIP's reference trainer, measured in one invocation.

Both run as child processes on the same model (``LOCAL_ARCHS["bench-vit"]``, written out as an
open_clip model config for OpenCLIP), the same batch size, precision, device and thread count.
euclip's trainer reads img2dataset-format shards of the embedded world through its real loader;
OpenCLIP's reads its ``--dataset-type synthetic`` images. Throughput is the median of the
per-step rates each trainer logs itself, after ``warmup`` steps; peak memory is each child's
maximum resident set (and on a GPU, euclip's peak allocated memory).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from euclip_cli.errors import Failure
from euclip_cli.rundir import RunDir

BENCH_ARCH = "bench-vit"
OPENCLIP_PRECISION = {"fp32": "fp32", "bf16": "amp_bf16", "fp16": "amp"}
# OpenCLIP logs "... Batch (t): 2.345, 109.2/s, 109.2/s/gpu LR: ..." once per step here.
OPENCLIP_RATE = re.compile(r"([0-9.]+)/s/gpu")

# Targets of the trainer issue, for the verdict column.
TARGET_SPEEDUP = 2.0
TARGET_ACCUM_OVERHEAD = 1.40


class BenchError(Failure):
    """A benchmark child failed; the message carries the end of its output."""


@dataclass
class Measurement:
    name: str
    samples_per_s: float
    steps_timed: int
    peak_rss_mib: float
    peak_gpu_mib: Optional[float] = None


@dataclass
class Settings:
    arch: str = BENCH_ARCH  # a key of LOCAL_ARCHS
    batch_size: int = 256
    steps: int = 10
    warmup: int = 2
    threads: int = 2
    precision: str = "bf16"
    device: str = "cpu"
    workers: int = 0
    compile: bool = True  # euclip's train.compile; OpenCLIP runs as its users run it by default


def run_child(command: list[str], env: dict, cwd: Path) -> tuple[str, float]:
    """Run to completion; return (output, peak resident set in MiB) or raise BenchError."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(command[:4])} ... exited with {proc.returncode}:\n{output[-3000:]}")
    return output, usage.ru_maxrss / 1024  # Linux reports KiB


def child_env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONUNBUFFERED": "1"}


def ensure_world(work: Path) -> Path:
    from euclip_cli.data.world_files import WorldSettings, generate

    out = work / "world"
    generate(out, WorldSettings(seed=0, samples=4096, eval_size=16), workers=2)
    return out / "train"


def euclip_run(work: Path, world_train: Path, s: Settings, accum_steps: int) -> Measurement:
    name = f"euclip-accum{accum_steps}"
    runs = work / "runs"
    shutil.rmtree(runs / name, ignore_errors=True)  # the bench's own scratch run: always from scratch
    command = [sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--runs-dir", str(runs),
               "--name", name, f"model.arch={s.arch}", f"data.batch_size={s.batch_size}",
               f"optim.samples={s.batch_size * (s.steps + s.warmup)}", f"optim.accum_steps={accum_steps}",
               f"data.train_dir={world_train}", f"data.workers={s.workers}", "train.log_every=1",
               "train.checkpoints=1", "train.keep_checkpoints=1", "train.tensorboard=false",
               f"train.precision={s.precision}", f"train.device={s.device}", "optim.warmup_steps=2",
               f"train.compile={str(s.compile).lower()}"]
    _, rss = run_child(command, child_env(s.threads), work)
    records = RunDir(runs / name).training_records()
    rates = [r["samples_per_s"] for r in records if r["step"] > s.warmup]
    gpu = max((r.get("gpu_peak_mib", 0.0) for r in records), default=0.0) or None
    return Measurement(name, statistics.median(rates), len(rates), rss, gpu)


OPENCLIP_SCRIPT = """
import sys
import open_clip
open_clip.add_model_config(sys.argv[1])
from open_clip_train.main import main
main(sys.argv[2:])
"""


def openclip_run(work: Path, s: Settings) -> Measurement:
    from euclip_cli.model import LOCAL_ARCHS

    model_name = f"euclip-{s.arch}"
    model_config = work / f"{model_name}.json"
    model_config.write_text(json.dumps(LOCAL_ARCHS[s.arch]))
    command = [sys.executable, "-c", OPENCLIP_SCRIPT, str(model_config), "--model", model_name,
               "--dataset-type", "synthetic", "--train-num-samples", str(s.batch_size * (s.steps + s.warmup)),
               "--batch-size", str(s.batch_size), "--epochs", "1", "--workers", str(s.workers),
               "--precision", OPENCLIP_PRECISION[s.precision], "--lr", "1e-3", "--warmup", "2", "--wd", "0.2",
               "--logs", str(work / "openclip"), "--name", f"bench-{os.getpid()}", "--log-every-n-steps", "1",
               "--save-frequency", "0", "--seed", "0"]
    if s.device == "cpu":
        command += ["--device", "cpu"]
    shutil.rmtree(work / "openclip", ignore_errors=True)
    output, rss = run_child(command, child_env(s.threads), work)
    rates = [float(m) for m in OPENCLIP_RATE.findall(output)][s.warmup:]
    if not rates:
        raise BenchError(f"no throughput lines in OpenCLIP's output:\n{output[-3000:]}")
    return Measurement("openclip", statistics.median(rates), len(rates), rss)


def flops_per_sample(arch: str = BENCH_ARCH) -> float:
    """Forward + backward FLOPs of one training sample (the encoders), counted by torch."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from euclip_cli.model import LOCAL_ARCHS, build_clip

    clip = build_clip(arch)
    size = LOCAL_ARCHS[arch]["vision_cfg"]["image_size"]
    ctx = LOCAL_ARCHS[arch]["text_cfg"]["context_length"]
    batch = 2
    with FlopCounterMode(display=False) as counter:
        image = clip.encode_image(torch.randn(batch, 3, size, size))
        text = clip.encode_text(torch.randint(1, 1000, (batch, ctx)))
        (image.sum() + text.sum()).backward()
    return counter.get_total_flops() / batch


def bench_train(work: Path, s: Settings, openclip: bool = True, accumulation: bool = True,
                on_stage: Callable[[str], None] = lambda stage: None) -> dict:
    work = work.resolve()  # the children run inside it
    work.mkdir(parents=True, exist_ok=True)
    with (work / ".lock").open("w") as lock:
        try:
            # Two benches in one scratch folder would delete each other's runs; the lock dies with its process.
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BenchError(f"another euclip bench is running in {work}; wait for it or pass --out DIR") from None
        return _bench_train(work, s, openclip, accumulation, on_stage)


def _bench_train(work: Path, s: Settings, openclip: bool, accumulation: bool,
                 on_stage: Callable[[str], None]) -> dict:
    on_stage("embedded world for the loader")
    world_train = ensure_world(work)
    measurements = {}
    on_stage("euclip, accumulation 1")
    measurements["euclip"] = euclip_run(work, world_train, s, 1)
    if accumulation:
        on_stage("euclip, accumulation 2")
        measurements["euclip_accum2"] = euclip_run(work, world_train, s, 2)
    if openclip:
        on_stage("OpenCLIP's trainer")
        measurements["openclip"] = openclip_run(work, s)
    flops = flops_per_sample(s.arch)
    result = {"settings": asdict(s), "flops_per_sample": flops,
              "measurements": {k: asdict(v) for k, v in measurements.items()}}
    if openclip:
        result["speedup_vs_openclip"] = measurements["euclip"].samples_per_s / measurements["openclip"].samples_per_s
    if accumulation:
        result["accumulation_overhead"] = (measurements["euclip"].samples_per_s /
                                           measurements["euclip_accum2"].samples_per_s)
    result["euclip_tflops"] = flops * measurements["euclip"].samples_per_s / 1e12
    return result


def world_captions(world_train: Path, count: int) -> list[str]:
    """The first ``count`` captions of the world's training shards, in shard order."""
    import tarfile

    captions: list[str] = []
    for shard in sorted(world_train.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.name.endswith(".txt"):
                    captions.append(tar.extractfile(member).read().decode("utf-8"))
                    if len(captions) == count:
                        return captions
    return captions


def bench_text(captions: list[str], arch: str, batch_size: int, rounds: int, precision: str) -> dict:
    """The text tower's forward and backward, open_clip's full context against euclip's exact trimming.

    Interleaved in one process: each round times every batch once with the full context, then once
    trimmed, so drift of the machine hits both alike; the ratio is taken per round.
    """
    import time

    import torch

    from euclip_cli.model import build_clip, context_groups, text_features, tokenizer_for

    torch.manual_seed(0)
    clip = build_clip(arch)
    tokenize = tokenizer_for(arch)
    batches = [tokenize(captions[i:i + batch_size]) for i in range(0, len(captions) - batch_size + 1, batch_size)]
    if not batches:
        raise BenchError(f"{len(captions)} captions make no batch of {batch_size}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def run(encode) -> float:
        start = time.perf_counter()
        for tokens in batches:
            clip.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                features = encode(tokens)
            features.float().square().sum().backward()
        return (time.perf_counter() - start) / len(batches)

    full, trimmed = (lambda t: clip.encode_text(t)), (lambda t: text_features(clip, t))
    run(full), run(trimmed)  # warm-up: allocator and kernel choices
    times = {"full": [], "trimmed": []}
    for _ in range(rounds):
        times["full"].append(run(full))
        times["trimmed"].append(run(trimmed))
    ratios = [f / t for f, t in zip(times["full"], times["trimmed"])]
    lengths = [length for tokens in batches for rows, length in (context_groups(clip, tokens) or [])
               for _ in range(len(rows))]
    return {"arch": arch, "batch_size": batch_size, "batches": len(batches), "rounds": rounds,
            "precision": precision, "context": batches[0].shape[1],
            "mean_trimmed_context": sum(lengths) / len(lengths) if lengths else None,
            "seconds_per_batch": {k: statistics.median(v) for k, v in times.items()},
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
