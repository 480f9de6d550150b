"""``euclip bench train``: euclip's trainer against OpenCLIP's, on one model, batch and thread count."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli import common

app = typer.Typer(help="Speed benchmarks (targets live here, never in tests).", no_args_is_help=True)

# Dense bf16 peaks for the MFU column; elsewhere pass --peak-tflops.
KNOWN_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


@app.command("train")
def train_bench(arch: str = typer.Option("bench-vit", help="Model (euclip_cli.model.LOCAL_ARCHS); the default is "
                                                             "the one OpenCLIP was measured with on this CPU."),
                batch_size: int = typer.Option(256, min=2, help="Global batch (the reference measurement used 256)."),
                steps: int = typer.Option(10, min=1, help="Timed steps per trainer (after the warm-up steps)."),
                warmup: int = typer.Option(2, min=0, help="Untimed first steps."),
                threads: int = typer.Option(0, help="Threads per trainer; 0 = every core of this machine."),
                precision: str = typer.Option("bf16", help="fp32, bf16 or fp16 (both trainers)."),
                device: str = typer.Option("auto", help="cpu, cuda or auto."),
                workers: int = typer.Option(0, min=0, help="Loader worker processes (both trainers)."),
                compile: bool = typer.Option(True, help="euclip with train.compile=true (compiling is not timed)."),
                openclip: bool = typer.Option(True, help="Also run OpenCLIP's trainer (--no-openclip skips it)."),
                accumulation: bool = typer.Option(True, help="Also time accumulation 2 at the same global batch."),
                peak_tflops: Optional[float] = typer.Option(None, help="The device's peak TFLOP/s, for MFU."),
                out: Path = typer.Option(Path("results") / "bench", help="Where the JSON result and scratch go.")
                ) -> None:
    """Time euclip's trainer and OpenCLIP's (synthetic data) in one invocation; print the ratios.

    Example: euclip bench train --steps 10
    """
    from rich.table import Table

    from euclip_cli.bench import TARGET_ACCUM_OVERHEAD, TARGET_SPEEDUP, BenchError, Settings, bench_train

    if precision not in ("fp32", "bf16", "fp16"):
        common.fail(f"--precision: '{precision}' is not one of fp32, bf16, fp16")
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    from euclip_cli.model import LOCAL_ARCHS

    if arch not in LOCAL_ARCHS:
        common.fail(f"--arch: '{arch}' is not one of {', '.join(LOCAL_ARCHS)}")
    settings = Settings(arch=arch, batch_size=batch_size, steps=steps, warmup=warmup, threads=threads or os.cpu_count() or 1,
                        precision=precision, device=device, workers=workers, compile=compile)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with common.errors():
        try:
            with common.console.status("starting") as status:
                result = bench_train(out / "scratch", settings, openclip=openclip, accumulation=accumulation,
                                     on_stage=lambda stage: status.update(f"running: {stage}"))
        except BenchError as err:
            common.fail(str(err), 1)
    if device == "cuda" and peak_tflops is None:
        import torch

        name = torch.cuda.get_device_name()
        peak_tflops = next((v for k, v in KNOWN_PEAK_TFLOPS.items() if k in name), None)
    table = Table(title=f"training throughput: {arch}, batch {batch_size}, {precision}, {device}, "
                        f"{settings.threads} threads")
    for column in ("trainer", "samples/s", "steps timed", "peak RSS MiB", "peak GPU MiB"):
        table.add_column(column, justify="left" if column == "trainer" else "right")
    for m in result["measurements"].values():
        gpu = f"{m['peak_gpu_mib']:.0f}" if m["peak_gpu_mib"] else "-"
        table.add_row(m["name"], f"{m['samples_per_s']:.1f}", str(m["steps_timed"]), f"{m['peak_rss_mib']:.0f}", gpu)
    common.console.print(table)
    lines = [f"model: {result['flops_per_sample'] / 1e9:.2f} GFLOP per training sample; "
             f"euclip {result['euclip_tflops']:.3f} TFLOP/s"]
    if peak_tflops:
        result["mfu"] = result["euclip_tflops"] / peak_tflops
        lines[-1] += f", MFU {100 * result['mfu']:.1f}% of {peak_tflops:g}"
    if "speedup_vs_openclip" in result:
        ratio = result["speedup_vs_openclip"]
        lines.append(f"euclip / OpenCLIP samples/s: {ratio:.2f}x (target >= {TARGET_SPEEDUP}x on CPU: "
                     f"{'met' if ratio >= TARGET_SPEEDUP else 'missed'})")
    if "accumulation_overhead" in result:
        overhead = result["accumulation_overhead"]
        lines.append(f"accumulation overhead (2 vs 1, same global batch): {overhead:.2f}x "
                     f"(target <= {TARGET_ACCUM_OVERHEAD}x: {'met' if overhead <= TARGET_ACCUM_OVERHEAD else 'missed'})")
    for line in lines:
        common.console.print(line, highlight=False)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"train-{stamp}.json"
    path.write_text(json.dumps(result, indent=2))
    common.console.print(f"written: {path}")


@app.command("text")
def text_bench(arch: str = typer.Option("tiny", help="Model (euclip_cli.model.LOCAL_ARCHS); tiny is the "
                                                      "embedded study's."),
               batch_size: int = typer.Option(128, min=2, help="Captions per batch."),
               batches: int = typer.Option(8, min=1, help="Batches of the world's captions timed per round."),
               rounds: int = typer.Option(5, min=1, help="Interleaved rounds (full context, then trimmed)."),
               precision: str = typer.Option("bf16", help="fp32, bf16 or fp16 (autocast)."),
               out: Path = typer.Option(Path("results") / "bench", help="Where the JSON result and scratch go.")
               ) -> None:
    """The text tower with open_clip's full context against euclip's exact trimming, on the world's captions.

    Example: euclip bench text --rounds 5
    """
    from euclip_cli.bench import BenchError, bench_text, ensure_world, world_captions

    if precision not in ("fp32", "bf16", "fp16"):
        common.fail(f"--precision: '{precision}' is not one of fp32, bf16, fp16")
    from euclip_cli.model import LOCAL_ARCHS

    if arch not in LOCAL_ARCHS:
        common.fail(f"--arch: '{arch}' is not one of {', '.join(LOCAL_ARCHS)}")
    with common.errors():
        try:
            with common.console.status("timing the text tower, full context and trimmed, interleaved"):
                captions = world_captions(ensure_world(out / "scratch"), batch_size * batches)
                result = bench_text(captions, arch, batch_size, rounds, precision)
        except BenchError as err:
            common.fail(str(err), 1)
    seconds = result["seconds_per_batch"]
    common.console.print(
        f"text tower forward+backward, {arch}, batch {batch_size}, {precision}, {result['batches']} batches x "
        f"{rounds} rounds: full context {result['context']} tokens {1000 * seconds['full']:.1f} ms/batch, trimmed "
        f"(mean context {result['mean_trimmed_context']:.1f}) {1000 * seconds['trimmed']:.1f} ms/batch; "
        f"median ratio {result['ratio_median']:.2f}x (rounds {result['ratio_min']:.2f}-{result['ratio_max']:.2f}x)",
        highlight=False)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"text-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    common.console.print(f"written: {path}")
