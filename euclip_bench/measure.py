"""Training speed: euclip's trainer against OpenCLIP's reference trainer, measured in one invocation.

Both run as child processes on the same model (``bench-vit`` of ``towers.archs``, written out as an
open_clip model config for OpenCLIP), the same batch size, precision, device, thread count and
loader workers, and both read the same img2dataset-format shards of the embedded world (euclip
through its loader, OpenCLIP through its webdataset pipeline): a ratio of two trainers, not of a
trainer that decodes JPEGs against one that does not. OpenCLIP is also run on its own
``--dataset-type synthetic`` images, shown apart as the rate its trainer reaches when data cost
(almost) nothing. A child's throughput is the median of
the per-step rates it logs itself, after ``warmup`` steps; peak memory is its maximum resident set
(and on a GPU, euclip's peak allocated memory).

The trainers run interleaved (A, B, C, A, B, C, ...) for several rounds, and every ratio is taken
within a round, so a machine that drifts or is busy for a while hits both sides of a ratio alike;
the result is the median ratio over rounds with its spread. Each round also measures the device's
own matrix-product peak at the bench's precision, so the fraction of peak is a ratio of two
numbers from the same run, whatever the CPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
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

from euclip_cli.config import STUDY_RUN_RECIPE
from euclip_cli.errors import Failure
from euclip_cli.rundir import RunDir

BENCH_ARCH = "bench-vit"
OPENCLIP_PRECISION = {"fp32": "fp32", "bf16": "amp_bf16", "fp16": "amp"}
# OpenCLIP logs "... Data (t): 0.012 Batch (t): 2.345, 109.2/s, 109.2/s/gpu LR: ..." once per step here
# (its timers reset at every log line, so each line is one step's).
OPENCLIP_RATE = re.compile(r"([0-9.]+)/s/gpu")
OPENCLIP_TIMES = re.compile(r"Data \(t\): ([0-9.]+) Batch \(t\): ([0-9.]+)")

# Targets of the trainer issue, for the verdict column.
TARGET_SPEEDUP = 2.0
TARGET_ACCUM_OVERHEAD = 1.40
# The ceiling on a sample with its box against one without, per core: two images and two
# captions a sample, the box's small, plus the tar's extra files.
TARGET_BOXES_COST = 2.2
# And on a HyCoCLIP step against a plain one: both towers run on the samples and on their boxes.
TARGET_HYCOCLIP_STEP = 2.2
TARGET_FRACTION_OF_PEAK = 0.60
# Captions of the bench's shards over which euclip's trimmed text FLOPs are averaged.
CAPTIONS_COUNTED = 256


class BenchError(Failure):
    """A benchmark child failed; the message carries the end of its output."""


@dataclass
class Measurement:
    name: str
    samples_per_s: float  # the median over rounds
    per_round: list[float]
    steps_timed: int
    peak_rss_mib: float
    peak_gpu_mib: Optional[float] = None
    # The median share of a step spent waiting for the next batch: near 1, the loader is the bottleneck.
    data_wait_share: Optional[float] = None
    # euclip's own loaders (the trainer's records): what they could deliver, and their CPU share.
    loader_samples_per_s: Optional[float] = None
    loader_cpu_share: Optional[float] = None
    # The timed steps' samples over their time (the harmonic mean of per-step rates): where batches
    # arrive in clumps, one per worker, the median step says little about the whole.
    overall_samples_per_s: Optional[float] = None


def over_rounds(rounds: list[Measurement]) -> Measurement:
    """One trainer's measurements of every round as one: median rate, every round's rate, largest memory."""
    rates = [m.samples_per_s for m in rounds]
    gpu = max((m.peak_gpu_mib or 0.0 for m in rounds), default=0.0) or None
    return Measurement(rounds[0].name, statistics.median(rates), rates, sum(m.steps_timed for m in rounds),
                       max(m.peak_rss_mib for m in rounds), gpu, _median_of([m.data_wait_share for m in rounds]),
                       _median_of([m.loader_samples_per_s for m in rounds]), _median_of([m.loader_cpu_share for m in rounds]),
                       _median_of([m.overall_samples_per_s for m in rounds]))


def _median_of(values: list[Optional[float]]) -> Optional[float]:
    """The median of the values that are not None; None where none is."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio_over_rounds(numerator: list[float], denominator: list[float]) -> dict:
    """``{"median", "min", "max", "per_round"}`` of the per-round ratios numerator[r] / denominator[r]."""
    ratios = [a / b for a, b in zip(numerator, denominator)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "per_round": ratios}


@dataclass
class Settings:
    arch: str = BENCH_ARCH  # one of euclip's archs (towers.archs), or an open_clip model
    batch_size: int = 256
    steps: int = 10
    warmup: int = 2
    threads: int = 2
    precision: str = "bf16"
    device: str = "cpu"
    workers: int = 0
    compile: bool = False  # euclip's train.compile; OpenCLIP runs as its users run it by default
    rounds: int = 3


def run_child(command: list[str], env: dict, cwd: Path) -> tuple[str, float]:
    """Run to completion; return (output, peak resident set in MiB) or raise BenchError."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(command[:4])} ... exited with {proc.returncode}:", [output[-3000:]])
    return output, usage.ru_maxrss / 1024  # Linux reports KiB


def child_env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONUNBUFFERED": "1"}


# The bench's world: one shard of this many samples.
BENCH_WORLD_SAMPLES = 10_000


def ensure_world(work: Path) -> Path:
    from euclip_cli.data.world_files import generate
    from euclip_cli.worlddir import WorldSettings

    out = work / f"world-{BENCH_WORLD_SAMPLES}"
    generate(out, WorldSettings(seed=0, samples=BENCH_WORLD_SAMPLES, eval_size=16), workers=2)
    return out / "train"


def euclip_run(work: Path, world_train: Path, s: Settings, accum_steps: int, loss: str = "infonce") -> Measurement:
    """euclip's trainer with ``accum_steps`` and ``loss`` (``loss.kind``; "hycoclip" trains on a box per sample)."""
    return timed_training(work, f"euclip-accum{accum_steps}-{loss}", world_train, s, s.batch_size,
                           [f"model.arch={s.arch}", f"data.batch_size={s.batch_size}",
                            f"optim.accum_steps={accum_steps}", f"data.workers={s.workers}",
                            f"train.precision={s.precision}", "optim.warmup_steps=2",
                            f"train.compile={str(s.compile).lower()}", f"loss.kind={loss}"])


def timed_training(work: Path, name: str, world_train: Path, s: Settings, batch: int,
                    overrides: list[str]) -> Measurement:
    """``euclip train`` of the study's recipe with ``overrides``, for ``warmup + steps`` steps of
    ``batch``, as a child; its own per-step log gives the rate."""
    runs = work / "runs"
    shutil.rmtree(runs / name, ignore_errors=True)  # the bench's own scratch run: always from scratch
    command = [sys.executable, "-m", "euclip_cli", "train", "--recipe", STUDY_RUN_RECIPE, "--runs-dir", str(runs),
               "--name", name, f"optim.samples={batch * (s.steps + s.warmup)}", f"data.train_dir={world_train}",
               "train.log_every=1", "train.checkpoints=1", "train.keep_checkpoints=1", "train.tensorboard=false",
               f"train.device={s.device}", *overrides]
    _, rss = run_child(command, child_env(s.threads), work)
    return _from_records(name, runs / name, s.warmup, rss)


def _from_records(name: str, run: Path, warmup: int, rss: float) -> Measurement:
    records = [r for r in RunDir(run).training_records() if r["step"] > warmup]
    if not records:
        raise BenchError(f"{name}: no training records after the {warmup} warm-up steps in {run}")
    rate = statistics.median(r["samples_per_s"] for r in records)
    gpu = max((r.get("gpu_peak_mib", 0.0) for r in records), default=0.0) or None
    return Measurement(name, rate, [rate], len(records), rss, gpu, _median_of([r.get("data_wait_share") for r in records]),
                       _median_of([r.get("loader_samples_per_s") for r in records]), _median_of([r.get("loader_cpu_share") for r in records]),
                       statistics.harmonic_mean([r["samples_per_s"] for r in records]))


def tiny_recipe_run(work: Path, world_train: Path, s: Settings) -> Measurement:
    """Samples/s of the embedded study's run recipe exactly as shipped (only its length and logging
    changed): the number the study's wall time is made of."""
    from euclip_cli import config as C

    batch = C.load_config(STUDY_RUN_RECIPE).data.batch_size
    return timed_training(work, f"{STUDY_RUN_RECIPE}-recipe", world_train, s, batch, [])


# OpenCLIP's trainer, run as its users run it, with two changes: the end-of-shard fix its pipeline
# needs with the pinned webdataset (``openclip_pipeline.openclip_compatible``), and, for the data-path
# bench only (a slice size > 0), its model's forward on the first samples of each batch.
OPENCLIP_SCRIPT = """
import contextlib
import sys
import open_clip
from torch.nn.attention import SDPBackend, sdpa_kernel
from euclip_cli.data.openclip_pipeline import openclip_compatible
openclip_compatible()
if sys.argv[1] != "-":
    open_clip.add_model_config(sys.argv[1])
keep = int(sys.argv[3])
if keep:
    forward = open_clip.model.CLIP.forward
    open_clip.model.CLIP.forward = lambda self, image=None, text=None: forward(self, image[:keep], text[:keep])
from open_clip_train.main import main
with sdpa_kernel([SDPBackend.MATH]) if sys.argv[2] == "math" else contextlib.nullcontext():
    main(sys.argv[4:])
"""


def openclip_run(work: Path, s: Settings, world_train: Optional[Path], math_attention: bool = False,
                 step_samples: int = 0) -> Measurement:
    """OpenCLIP's trainer as its users run it on ``world_train``'s shards (``None``: on its synthetic
    images), or (``math_attention``) with the attention kernel euclip uses on a CPU
    (``train.sdpa_math``): a setting anyone could flip, shown apart from euclip's own gains.
    ``step_samples`` > 0: its model computes on that many samples of each batch (``bench feed``)."""
    from euclip_cli.towers.archs import ARCHS

    if s.arch in ARCHS:  # euclip's in-code towers, given to OpenCLIP as a model config of its own
        model_name = f"euclip-{s.arch}"
        model_config = work / f"{model_name}.json"
        model_config.write_text(json.dumps(ARCHS[s.arch].open_clip_config()))
    else:  # one of OpenCLIP's own models (ViT-B-32)
        model_name, model_config = s.arch, "-"
    if world_train is None:
        data = ["--dataset-type", "synthetic"]
    else:
        # Resampled: OpenCLIP otherwise wants a shard per worker, and the bench's world is one shard.
        data = ["--dataset-type", "webdataset", "--dataset-resampled",
                "--train-data", "::".join(str(p) for p in sorted(world_train.glob("*.tar")))]
    command = [sys.executable, "-c", OPENCLIP_SCRIPT, str(model_config), "math" if math_attention else "default",
               str(step_samples), "--model", model_name, *data, "--train-num-samples", str(s.batch_size * (s.steps + s.warmup)),
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
        raise BenchError("no throughput lines in OpenCLIP's output:", [output[-3000:]])
    waits = [float(data) / float(batch) for data, batch in OPENCLIP_TIMES.findall(output)[s.warmup:] if float(batch)]
    name = (("openclip-math-attention" if math_attention else "openclip") + ("-synthetic" if world_train is None else "")
            + ("-sliced" if step_samples else ""))
    return Measurement(name, statistics.median(rates), [statistics.median(rates)], len(rates), rss,
                       data_wait_share=statistics.median(waits) if waits else None,
                       overall_samples_per_s=statistics.harmonic_mean(rates))


# The matrix-product peak: square products at the bench's precision, timed for at least a second
# after warm-up (2048 on a CPU, where one bf16 product takes ~15-50 ms; 8192 on a GPU).
PEAK_SCRIPT = """
import sys, time, torch
n, dtype, device = int(sys.argv[1]), getattr(torch, sys.argv[2]), sys.argv[3]
a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
for _ in range(3):
    a @ b
sync()
count, start = 0, time.perf_counter()
while count < 5 or time.perf_counter() - start < 1.0:
    a @ b
    count += 1
    if count % 5 == 0:
        sync()
sync()
print(2 * n ** 3 * count / (time.perf_counter() - start) / 1e12)
"""
PEAK_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def matmul_peak_tflops(work: Path, s: Settings, precision: Optional[str] = None) -> float:
    """The device's dense matrix-product TFLOP/s at ``precision`` (default: the bench's) and the bench's
    thread count, in a child process like the trainers."""
    size = "8192" if s.device.startswith("cuda") else "2048"
    output, _ = run_child([sys.executable, "-c", PEAK_SCRIPT, size, PEAK_DTYPE[precision or s.precision], s.device],
                          child_env(s.threads), work)
    try:
        return float(output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BenchError("the matrix-product peak printed no number:", [output[-3000:]]) from None


def flops_per_sample(arch: str = BENCH_ARCH, captions: Optional[list[str]] = None) -> float:
    """Forward + backward FLOPs of one training sample (the encoders), counted by torch.

    Without ``captions`` the text tower runs on its full context, as OpenCLIP's trainer computes it.
    With them it runs as euclip's trainer runs it, each caption on its trimmed context
    (``towers.text.text_features``), and the text tower's count is the mean over the captions: the arithmetic
    euclip really does, so that its fraction of peak does not count the padding it skips.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from euclip_cli.towers import build_clip, image_size, tokenizer_for
    from euclip_cli.towers.text import text_features

    clip = build_clip(arch)
    size, ctx = image_size(clip), clip.context_length
    # An image's count does not depend on its pixels; a caption's depends on its length only when trimmed.
    # The math attention kernel runs the attention products as bmm, which the counter counts; it has no
    # formula for the CPU's fused attention kernel and would leave the attention products out.
    images = 2
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as image_counter:
        clip.encode_image(torch.randn(images, 3, size, size)).sum().backward()
    tokens = tokenizer_for(arch)(captions) if captions else torch.randint(1, 1000, (2, ctx))
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as text_counter:
        (text_features(clip, tokens) if captions else clip.encode_text(tokens)).sum().backward()
    return image_counter.get_total_flops() / images + text_counter.get_total_flops() / len(tokens)


@contextlib.contextmanager
def scratch(work: Path):
    """The bench's scratch folder, made and held for this bench alone; yields its absolute path (the
    children run inside it). Two benches in one folder would delete each other's runs; the lock dies
    with its process."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    with (work / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BenchError(f"another euclip bench is running in {work}; wait for it or pass --out DIR") from None
        yield work


def bench_train(work: Path, s: Settings, openclip: bool = True, accumulation: bool = True, tiny: bool = True,
                on_stage: Callable[[str], None] = lambda stage: None, shards: Optional[Path] = None,
                hycoclip: bool = False) -> dict:
    """Both trainers on ``shards`` (a folder of training shards), or on the bench's embedded world; with
    ``hycoclip``, euclip's with HyCoCLIP's loss too (its boxes: the embedded world only)."""
    with scratch(work) as held:
        return _bench_train(held, s, openclip, accumulation, tiny, on_stage, shards, hycoclip)


def _bench_train(work: Path, s: Settings, openclip: bool, accumulation: bool, tiny: bool,
                 on_stage: Callable[[str], None], shards: Optional[Path], hycoclip: bool) -> dict:
    on_stage("embedded world for the loader")
    world_train = shards or ensure_world(work)
    stages: dict[str, Callable[[], Measurement]] = {"euclip": lambda: euclip_run(work, world_train, s, 1)}
    if openclip:
        stages["openclip"] = lambda: openclip_run(work, s, world_train)
        if s.device == "cpu":  # on a GPU both trainers already use the same fused kernel
            stages["openclip_math"] = lambda: openclip_run(work, s, world_train, math_attention=True)
        stages["openclip_synthetic"] = lambda: openclip_run(work, s, None)
    if accumulation:
        stages["euclip_accum2"] = lambda: euclip_run(work, world_train, s, 2)
    if tiny:
        stages["tiny_recipe"] = lambda: tiny_recipe_run(work, world_train, s)
    if hycoclip:
        stages["euclip_hycoclip"] = lambda: euclip_run(work, world_train, s, 1, "hycoclip")
    rounds: dict[str, list[Measurement]] = {key: [] for key in stages}
    peaks, fp32_peaks = [], []
    for r in range(s.rounds):
        for key, measure in stages.items():
            on_stage(f"round {r + 1}/{s.rounds}: {key}")
            rounds[key].append(measure())
        on_stage(f"round {r + 1}/{s.rounds}: matrix-product peak")
        peaks.append(matmul_peak_tflops(work, s))
        # fp32 too: a CPU without bf16 units (no AMX, no AVX-512 BF16) multiplies bf16 slower than fp32.
        fp32_peaks.append(peaks[-1] if s.precision == "fp32" else matmul_peak_tflops(work, s, "fp32"))
    measurements = {key: over_rounds(ms) for key, ms in rounds.items()}
    # OpenCLIP computes the model's FLOPs; euclip fewer, its text tower on trimmed contexts.
    flops = flops_per_sample(s.arch)
    euclip_flops = flops_per_sample(s.arch, shard_captions(world_train, CAPTIONS_COUNTED))
    euclip_tflops = [euclip_flops * rate / 1e12 for rate in measurements["euclip"].per_round]
    result = {"settings": asdict(s) | {"shards": str(world_train)}, "flops_per_sample": flops, "euclip_flops_per_sample": euclip_flops,
              "measurements": {k: asdict(v) for k, v in measurements.items()},
              "peak_tflops": {"median": statistics.median(peaks), "per_round": peaks},
              "fp32_peak_tflops": {"median": statistics.median(fp32_peaks), "per_round": fp32_peaks},
              "euclip_tflops": statistics.median(euclip_tflops),
              "fraction_of_peak": ratio_over_rounds(euclip_tflops, peaks)}
    rates = {key: m.per_round for key, m in measurements.items()}
    if openclip:
        result["speedup_vs_openclip"] = ratio_over_rounds(rates["euclip"], rates["openclip"])
        openclip_tflops = [flops * rate / 1e12 for rate in rates["openclip"]]
        result["openclip_fraction_of_peak"] = ratio_over_rounds(openclip_tflops, peaks)
        # The most euclip could reach against OpenCLIP, computing what it computes at the measured peak:
        # the bound the speed-up target has to fit under on this device.
        result["speedup_ceiling"] = ratio_over_rounds([p * 1e12 / euclip_flops for p in peaks], rates["openclip"])
        if "openclip_math" in rates:
            result["speedup_vs_openclip_math"] = ratio_over_rounds(rates["euclip"], rates["openclip_math"])
    if accumulation:
        result["accumulation_overhead"] = ratio_over_rounds(rates["euclip"], rates["euclip_accum2"])
    if hycoclip:
        # Samples/s without boxes over samples/s with: what a HyCoCLIP step costs against a plain one.
        result["hycoclip_step_cost"] = ratio_over_rounds(rates["euclip"], rates["euclip_hycoclip"])
    return result


def shard_captions(shards: Path, count: int) -> list[str]:
    """The first ``count`` captions of a folder of img2dataset shards (the world's, or DataComp's as
    ``euclip download`` writes them), in shard order."""
    import tarfile

    captions: list[str] = []
    for shard in sorted(shards.glob("*.tar")):
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

    from euclip_cli.towers import build_clip, tokenizer_for
    from euclip_cli.towers.text import context_groups, end_positions, text_features

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
    # A caption's tokens with its start and end tokens: its end-of-text position plus one.
    caption_tokens = torch.cat([end_positions(clip, tokens) for tokens in batches]).float() + 1
    return {"arch": arch, "batch_size": batch_size, "batches": len(batches), "rounds": rounds,
            "precision": precision, "context": batches[0].shape[1],
            "mean_caption_tokens": float(caption_tokens.mean()),
            "mean_trimmed_context": sum(lengths) / len(lengths) if lengths else None,
            "seconds_per_batch": {k: statistics.median(v) for k, v in times.items()},
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


# The loaders a loader measurement can time: euclip's, euclip's with a box per sample (HyCoCLIP's batches:
# two images and two texts a sample), and OpenCLIP's pipeline as its trainer builds it.
LOADERS = ("euclip", "euclip-boxes", "openclip")


def loader_batches_timed(workers: int) -> int:
    """Batches a loader measurement times by default: a worker's batches arrive in clumps of about
    ``workers``, so a rate over a few clumps is off by up to one clump; four or more keep it within 25%."""
    return max(8, 4 * workers)


def make_loader(kind: str, shards: list[str], parts: tuple[Callable, Callable], batch_size: int, workers: int,
                segment_steps: int = sys.maxsize, sharing: str = "file_descriptor", decoder: str = "pil"):
    """A training loader as the trainer builds one (``kind`` in ``LOADERS``) with ``parts`` (training
    transform, tokenizer), the default shuffle buffer and, for euclip's, ``decoder``. By default one
    segment: a stream restarts only every ``loader.SEGMENT_BUFFERS`` shuffle buffers in a run."""
    from euclip_cli.config import DataConfig
    from euclip_cli.data.loader import TrainBatches
    from euclip_cli.data.openclip_pipeline import OpenCLIPBatches

    if kind == "openclip":
        return OpenCLIPBatches(shards, batch_size, parts[0], parts[1], seed=0, workers=workers, rank=0, world=1,
                               samples=10 ** 9)
    return TrainBatches(shards, batch_size, parts[0], parts[1], seed=0, shuffle_buffer=DataConfig().shuffle_buffer,
                        segment_steps=segment_steps, workers=workers, sharing=sharing, decoder=decoder,
                        boxes=kind == "euclip-boxes")


def time_loader(make: Callable[[], object], batch_size: int, workers: int, batches: int, warmup: int,
                device: str = "cpu", while_timed: Callable = contextlib.nullcontext) -> dict:
    """One measurement of a training loader alone: ``make()``'s loader with fresh workers, ``warmup``
    batches taken, then ``batches`` timed inside ``while_timed()``, each moved to ``device`` as the
    trainer moves it (``feed.DeviceFeed``). Returns the samples/s delivered and the batches'
    ``LoaderWork`` fields (empty for a loader that does not report them)."""
    import time

    import torch

    from euclip_cli.data.feed import DeviceFeed

    stream = make()
    feed = DeviceFeed(torch.device(device), normalization=stream.normalization,
                      device_crops=getattr(stream, "device_crops", None))
    try:
        for _ in range(warmup):
            feed(next(stream))
        stream.take_work()
        with while_timed():
            start = time.perf_counter()
            for _ in range(batches):
                feed(next(stream))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
        work = stream.take_work()
    finally:
        stream.close()
    return {"samples_per_s": batches * batch_size / elapsed, **work.record(max(1, workers), batch_size)}


def bench_loader(world_train: Path, arch: str, batch_size: int, workers: int, batches: int, warmup: int,
                 rounds: int, device: str, decoder: str = "pil", kinds: tuple[str, ...] = LOADERS) -> dict:
    """The training loaders alone, euclip's (with ``decoder``) against OpenCLIP's pipeline, with ``arch``'s
    training transforms and tokenizer, interleaved in rounds; each measurement starts fresh workers,
    waits out ``warmup`` batches, then times ``batches``, fed to ``device`` as euclip's trainer feeds
    them (euclip's crops normalised there). ``kinds``: the loaders timed (``LOADERS``; euclip's with boxes
    only on shards that have them, the embedded world's).
    """
    from euclip_cli.data.loader import list_shards
    from euclip_cli.towers import build_clip, tokenizer_for, transforms_for

    parts = transforms_for(build_clip(arch))[0], tokenizer_for(arch)
    shards = list_shards(world_train, "euclip bench loader")
    per_round: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            make = functools.partial(make_loader, kind, shards, parts, batch_size, workers, decoder=decoder)
            per_round[kind].append(time_loader(make, batch_size, workers, batches, warmup, device))
    measurements = {kind: {"per_round": [m["samples_per_s"] for m in ms],
                           **{field: _median_of([m.get(field) for m in ms])
                              for field in ("samples_per_s", "loader_samples_per_s", "loader_cpu_share")}}
                    for kind, ms in per_round.items()}
    result = {"settings": {"arch": arch, "batch_size": batch_size, "workers": workers, "batches": batches,
                           "warmup": warmup, "rounds": rounds, "device": device, "decoder": decoder,
                           "shards": str(world_train)},
              "measurements": measurements,
              "euclip_vs_openclip": ratio_over_rounds(measurements["euclip"]["per_round"],
                                                      measurements["openclip"]["per_round"])}
    if "euclip-boxes" in measurements:
        # What a sample with its box costs against one without (samples/s plain over samples/s with boxes):
        # a sample brings two images and two captions, so about 2 when decoding dominates.
        result["boxes_cost"] = ratio_over_rounds(measurements["euclip"]["per_round"],
                                                 measurements["euclip-boxes"]["per_round"])
    return result


# The trainer's step, by kind of work: (label, predicate on an op's name). An op's *self* time goes to
# the first kind it matches, so nested ops are not counted twice; the rest is element-wise work,
# copies, the loss and dispatch. On a CPU, math attention runs its products as bmm, the layers as mm.
PROFILE_KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("linear layers (mm, addmm)", lambda op: op in ("aten::mm", "aten::addmm")),
    ("attention products (bmm)", lambda op: op in ("aten::bmm", "aten::baddbmm")),
    ("convolutions", lambda op: "conv" in op),
    ("softmax", lambda op: "softmax" in op),
    ("layer norm", lambda op: "layer_norm" in op),
    ("GELU", lambda op: "gelu" in op),
    ("optimizer (fused AdamW)", lambda op: "fused_adam" in op),
)
MATRIX_KINDS = ("linear layers (mm, addmm)", "attention products (bmm)")
OTHER_OPS_SHOWN = 8


def profile_step(work: Path, arch: str, batch_size: int, steps: int, precision: str, compile: bool) -> dict:
    """The trainer's optimizer step (``step.forward_backward``, the fused AdamW, the clip and
    clamps of ``tiny-clip`` with ``arch`` and ``batch_size``) under torch's profiler, on random images
    and the world's captions (so that trimming sees real lengths), after two untimed steps.

    Data loading is not in it: the trainer logs its wait for data as ``data_wait_share``. Returns the
    median step time (timed apart, without the profiler), the self time of each kind of op per step,
    the matrix products' FLOP/s (torch's own count) and the device's 2048^3 matrix-product peak on
    as many threads, measured in the same run (a child, as ``bench train`` measures it), and writes
    a Chrome trace.
    """
    import time

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    from euclip_cli import config as C
    from euclip_cli.device import autocast_factory
    from euclip_cli.model import EuclipModel
    from euclip_cli.optim import build_optimizer
    from euclip_cli.step import forward_backward
    from euclip_cli.towers import image_size, tokenizer_for

    cfg = C.load_config(STUDY_RUN_RECIPE, [f"model.arch={arch}", f"data.batch_size={batch_size}",
                                       f"train.precision={precision}", f"train.compile={str(compile).lower()}"])
    torch.manual_seed(0)
    model = EuclipModel(cfg)
    if compile:
        model.compile_encoders()
    optimizer = build_optimizer(model, cfg.optim)
    params = [p for p in model.parameters() if p.requires_grad]
    autocast = autocast_factory(precision, torch.device("cpu"))
    size = image_size(model.clip)
    images = torch.randn(batch_size, 3, size, size)
    tokens = tokenizer_for(arch)(shard_captions(ensure_world(work), batch_size))

    def step() -> tuple[float, float]:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        forward_backward(model, images, tokens, cfg.optim.accum_steps, cfg.loss.entail_weight,
                         cfg.loss.entail_min_radius, autocast)
        middle = time.perf_counter()
        if cfg.optim.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
        optimizer.step()
        model.clamp_scalars_()
        return middle - start, time.perf_counter() - middle

    model.train()
    with sdpa_kernel([SDPBackend.MATH]) if cfg.train.sdpa_math else contextlib.nullcontext():
        step(), step()  # untimed: allocator, kernel choices (and compiling)
        # Timed without the profiler first: its bookkeeping lengthens the steps it records.
        phases = [step() for _ in range(steps)]
        with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
            profiled = [sum(step()) for _ in range(steps)]
    trace = work / "profile-trace.json"
    prof.export_chrome_trace(str(trace))

    kinds = {label: {"ms": 0.0, "flops": 0} for label, _ in PROFILE_KINDS}
    other: dict[str, float] = {}
    for event in prof.key_averages():
        label = next((label for label, match in PROFILE_KINDS if match(event.key)), None)
        self_ms = event.self_cpu_time_total / 1000 / steps
        if label is None:
            other[event.key] = other.get(event.key, 0.0) + self_ms
        else:
            kinds[label]["ms"] += self_ms
            kinds[label]["flops"] += event.flops / steps
    forward_backward_s = statistics.median(p[0] for p in phases)
    optimizer_s = statistics.median(p[1] for p in phases)
    matrix_ms = sum(kinds[k]["ms"] for k in MATRIX_KINDS)
    matrix_flops = sum(kinds[k]["flops"] for k in MATRIX_KINDS)
    threads = torch.get_num_threads()
    peak = matmul_peak_tflops(work, Settings(threads=threads, precision=precision))
    return {"arch": arch, "batch_size": batch_size, "steps": steps, "precision": precision, "compile": compile,
            "threads": threads, "step_ms": 1000 * (forward_backward_s + optimizer_s),
            "forward_backward_ms": 1000 * forward_backward_s, "optimizer_ms": 1000 * optimizer_s,
            "profiled_step_ms": 1000 * statistics.median(profiled),
            "kinds_ms": {label: v["ms"] for label, v in kinds.items()}
            | {"other (element-wise, copies, loss)": sum(other.values())},
            # What "other" is made of, the largest first: the candidates for fusing.
            "other_ops_ms": dict(sorted(other.items(), key=lambda kv: -kv[1])[:OTHER_OPS_SHOWN]),
            "kinds_gflop": {label: v["flops"] / 1e9 for label, v in kinds.items() if v["flops"]},
            "matrix_tflops": matrix_flops / (matrix_ms / 1000) / 1e12 if matrix_ms else None,
            "kinds_tflops": {k: kinds[k]["flops"] / (kinds[k]["ms"] / 1000) / 1e12 for k in MATRIX_KINDS
                             if kinds[k]["ms"]},
            "peak_tflops": peak, "trace": str(trace)}


@contextlib.contextmanager
def _native_stderr_silenced():
    """File descriptor 2 to /dev/null: torch's profiler (kineto) prints start and stop lines, and on a
    machine without a GPU an error about counting GPUs, from C++, whatever its log level is set to."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
