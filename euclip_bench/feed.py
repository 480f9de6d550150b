"""``euclip bench feed``: the data path as a very fast accelerator sees it, measured on a CPU.

A GPU that computes a step in a few milliseconds leaves the trainer's loop running at the pace of
its data path: the loaders, the handing over of each batch, its copy to the device and whatever host
work each step adds. This bench runs the real training loops with the step made nearly free (each
step computes on ``step_samples`` samples of its batch: ``train.bench_step_samples``, and OpenCLIP's
model patched alike) while the loaders make full batches, and divides each loop's rate by the rate
its own loader delivers alone in the same round:

- euclip's loop on euclip's loader, with its staging slots (``data.staging``) and without;
- euclip's loop on OpenCLIP's pipeline (``data.pipeline = "openclip"``);
- OpenCLIP's own trainer loop on its pipeline.

An efficiency near 1 means the loop takes batches as fast as its loader makes them. Rates are the
timed steps' samples over their time (``Measurement.overall_samples_per_s``): with a few workers,
batches arrive in clumps, and a median step would say little about the whole.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from euclip_bench.measure import (BenchError, Measurement, Settings, child_env, ensure_world, openclip_run, over_rounds,
                              ratio_over_rounds, run_child, scratch, timed_training)

# Targets of the data-path issue: each euclip loop at least this efficient, and at least as efficient
# as OpenCLIP's loop in the same round.
TARGET_EFFICIENCY = 0.9

# The loops, each beside the loader whose rate it is divided by.
LOOPS = {"euclip_staged": "euclip", "euclip_unstaged": "euclip", "euclip_on_openclip_pipeline": "openclip",
         "openclip_loop": "openclip"}


@dataclass
class FeedSettings:
    arch: str = "bench-feed"
    batch_size: int = 256
    steps: int = 24  # timed steps (and batches timed for a loader alone)
    warmup: int = 4
    # A GPU machine's loader workers leave the trainer's process a core of its own; on 2 cores one worker does.
    workers: int = 1
    threads: int = 1  # compute threads of each trainer: on a GPU its process mostly launches kernels
    step_samples: int = 2
    rounds: int = 3


def _settings(s: FeedSettings) -> Settings:
    """The trainers' settings: fp32 (the step is tiny; no CPU's bf16 emulation distorts it), on the CPU."""
    return Settings(arch=s.arch, batch_size=s.batch_size, steps=s.steps, warmup=s.warmup, threads=s.threads,
                    precision="fp32", device="cpu", workers=s.workers, rounds=s.rounds)


def euclip_loop(work: Path, world_train: Path, s: FeedSettings, name: str, overrides: list[str]) -> Measurement:
    return timed_training(work, name, world_train, _settings(s), s.batch_size,
                          [f"model.arch={s.arch}", f"data.batch_size={s.batch_size}", f"data.workers={s.workers}",
                           "train.precision=fp32", "optim.warmup_steps=2", f"train.host_threads={s.threads}",
                           f"train.bench_step_samples={s.step_samples}", *overrides])


# A loader alone, timed in a child process as the loops are (a fresh interpreter, the same threads).
LOADER_SCRIPT = """
import functools, json, sys
from pathlib import Path
from euclip_bench.measure import make_loader, time_loader
from euclip_cli.data.loader import list_shards
from euclip_cli.towers import build_clip, tokenizer_for, transforms_for
kind, arch, world, batch, workers, steps, warmup = sys.argv[1:]
parts = transforms_for(build_clip(arch))[0], tokenizer_for(arch)
make = functools.partial(make_loader, kind, list_shards(Path(world), "euclip bench feed"), parts, int(batch), int(workers))
print(json.dumps(time_loader(make, int(batch), int(workers), int(steps), int(warmup))))
"""


def loader_alone(work: Path, world_train: Path, s: FeedSettings, kind: str) -> float:
    """Samples/s of ``kind``'s loader alone (``bench.LOADERS``), fed to the CPU as the trainer feeds it."""
    output, _ = run_child([sys.executable, "-c", LOADER_SCRIPT, kind, s.arch, str(world_train), str(s.batch_size),
                           str(s.workers), str(s.steps), str(s.warmup)], child_env(s.threads), work)
    try:
        return json.loads(output.strip().splitlines()[-1])["samples_per_s"]
    except (ValueError, IndexError, KeyError):
        raise BenchError("the loader measurement printed no result:", [output[-3000:]]) from None


def bench_feed(work: Path, s: FeedSettings, on_stage: Callable[[str], None] = lambda stage: None) -> dict:
    with scratch(work) as held:
        return _bench_feed(held, s, on_stage)


def _bench_feed(work: Path, s: FeedSettings, on_stage: Callable[[str], None]) -> dict:
    on_stage("embedded world for the loaders")
    world_train = ensure_world(work)
    loaders = {kind: [] for kind in ("euclip", "openclip")}
    stages: dict[str, Callable[[], Measurement]] = {
        "euclip_staged": lambda: euclip_loop(work, world_train, s, "feed-euclip-staged", []),
        "euclip_unstaged": lambda: euclip_loop(work, world_train, s, "feed-euclip-unstaged", ["data.staging=false"]),
        "euclip_on_openclip_pipeline": lambda: euclip_loop(work, world_train, s, "feed-euclip-openclip-pipeline",
                                                           ["data.pipeline=openclip"]),
        "openclip_loop": lambda: openclip_run(work, _settings(s), world_train, step_samples=s.step_samples),
    }
    rounds: dict[str, list[Measurement]] = {key: [] for key in stages}
    for r in range(s.rounds):
        for kind in loaders:
            on_stage(f"round {r + 1}/{s.rounds}: {kind}'s loader alone")
            loaders[kind].append(loader_alone(work, world_train, s, kind))
        for key, measure in stages.items():
            on_stage(f"round {r + 1}/{s.rounds}: {key}")
            rounds[key].append(measure())
    loops = {key: over_rounds(ms) for key, ms in rounds.items()}
    overall = {key: [m.overall_samples_per_s for m in ms] for key, ms in rounds.items()}
    efficiency = {key: ratio_over_rounds(overall[key], loaders[LOOPS[key]]) for key in stages}
    result = {"settings": asdict(s),
              "loaders": {kind: {"samples_per_s": statistics.median(v), "per_round": v} for kind, v in loaders.items()},
              "loops": {key: asdict(m) | {"overall_per_round": overall[key]} for key, m in loops.items()},
              "efficiency": efficiency,
              # Per round: how a euclip loop's efficiency compares with OpenCLIP's loop's.
              "vs_openclip_loop": {key: ratio_over_rounds(efficiency[key]["per_round"],
                                                          efficiency["openclip_loop"]["per_round"])
                                   for key in ("euclip_staged", "euclip_unstaged")}}
    return result
