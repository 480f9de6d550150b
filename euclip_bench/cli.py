"""``euclip-bench`` (alias ``euclip bench``): euclip's trainer, loaders, decoders and kernels against their
references, each on one model, batch and thread count, with the ratio measured in the same run."""

from __future__ import annotations

import json
import time
import typing
from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli import common
from euclip_cli.config import DataConfig, Precision
from euclip_cli.errors import UsageError
from euclip_cli.rundir import write_text_atomic
from euclip_cli.workers import usable_cores

app = typer.Typer(cls=common.OneLineErrors, name="euclip-bench",
                  help="Speed benchmarks (targets live here, never in tests).", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})

# Dense bf16 peaks for the MFU column; elsewhere pass --peak-tflops.
KNOWN_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


PRECISIONS = typing.get_args(Precision)


def write_result(out: Path, kind: str, result: dict, stamp: Optional[str] = None) -> Path:
    """A bench's JSON result, ``out/KIND-STAMP.json`` (stamp: now, to the second); returns its path.
    A folder or disk that cannot take it ends the command with one line."""
    path = out / f"{kind}-{stamp or time.strftime('%Y%m%d-%H%M%S')}.json"
    with common.errors():
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(result, indent=2))  # a stop mid-write leaves no half result
    return path


# Every bench's --out but profile's (which writes a trace beside its result).
OUT = typer.Option(Path("results") / "bench", callback=common.writable_folder,
                   help="Where the JSON result and scratch go.")


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        common.fail(f"--precision: '{precision}' is not one of {', '.join(PRECISIONS)}")


def _check_local_arch(arch: str) -> None:
    from euclip_cli.towers.archs import local_names

    if arch not in local_names():
        common.fail(f"--arch: '{arch}' is not one of {', '.join(local_names())}")


def _check_model_arch(arch: str) -> None:
    """One of euclip's local models or an open_clip model, as ``model.arch`` takes."""
    from open_clip import list_models

    from euclip_cli.towers.archs import local_names

    if arch not in local_names() and arch not in list_models():
        common.fail(f"--arch: '{arch}' is neither one of {', '.join(local_names())} nor an open_clip model "
                    "(open_clip.list_models())")


@app.command("train")
def train_bench(arch: str = typer.Option("bench-vit", help="Model: one of euclip's archs (model.arch) (the default "
                                                             "is the one OpenCLIP was first measured with on a CPU) "
                                                             "or an open_clip model (ViT-B-32)."),
                batch_size: int = typer.Option(256, min=2, help="Global batch (the reference measurement used 256)."),
                steps: int = typer.Option(10, min=1, help="Timed steps per trainer and round (after the warm-up)."),
                warmup: int = typer.Option(2, min=0, help="Untimed first steps."),
                rounds: int = typer.Option(3, min=1, help="Interleaved rounds; every ratio is taken within a round."),
                threads: int = typer.Option(0, help="Threads per trainer; 0 = every core this process may use."),
                precision: str = typer.Option("auto", help="auto, fp32, bf16 or fp16 (both trainers); auto is "
                                                           "what train.precision=auto picks on this device."),
                device: str = typer.Option("auto", help="cpu, cuda or auto."),
                workers: Optional[int] = typer.Option(None, min=0, help="Loader worker processes (both trainers); "
                                                                        "default 0 on a CPU (in-process decoding "
                                                                        "is cheapest on few cores), 8 on a GPU."),
                compile: bool = typer.Option(False, help="euclip with train.compile=true (compiling is not timed; "
                                                         "off by default: on some CPUs torch 2.14.1's compiled bf16 "
                                                         "ViT backward is not finite)."),
                openclip: bool = typer.Option(True, help="Also run OpenCLIP's trainer (--no-openclip skips it)."),
                accumulation: bool = typer.Option(True, help="Also time accumulation 2 at the same global batch."),
                tiny: bool = typer.Option(True, help="Also time the embedded study's run recipe as shipped."),
                hycoclip: bool = typer.Option(False, help="Also time HyCoCLIP's step (loss.kind=hycoclip: a box per "
                                                          "sample, both towers run twice) against the plain one; "
                                                          "the embedded world's shards only."),
                peak_tflops: Optional[float] = typer.Option(None, help="The device's spec-sheet TFLOP/s, for MFU "
                                                                       "(the measured peak is always printed)."),
                shards: Optional[Path] = typer.Option(None, callback=common.checked_path, help="Training shards both trainers read (e.g. euclip "
                                                      "download datacomp-like); default: the bench's embedded world."),
                out: Path = OUT
                ) -> None:
    """Time euclip's trainer and OpenCLIP's (synthetic data), interleaved over rounds; print the ratios.

    Each round runs euclip, OpenCLIP as its users run it, OpenCLIP with euclip's attention kernel
    (CPU), euclip with accumulation 2, the study's tiny recipe, and the device's matrix-product
    peak. Ratios are taken within a round; the median and the spread over rounds are printed.

    Example: euclip bench train --steps 10 --rounds 3
    """
    from rich.table import Table

    from euclip_bench.measure import BenchError, Settings, bench_train

    _check_precision(precision)
    import torch

    from euclip_cli.device import resolve_precision

    device = _bench_device(device)
    precision = resolve_precision(precision, torch.device(device))
    if workers is None:
        # A GPU consumes batches faster than one process decodes them; loader workers keep it fed
        # (measured: docs/speed.md links the runs).
        workers = 8 if device.startswith("cuda") else 0
    _check_model_arch(arch)
    if shards is not None and not shards.is_dir():
        common.fail(f"--shards {shards} is not a folder: give a folder of training shards (*.tar)")
    if hycoclip and shards is not None:
        common.fail("--hycoclip trains on the embedded world's boxes: leave out --shards (or --no-hycoclip)")
    settings = Settings(arch=arch, batch_size=batch_size, steps=steps, warmup=warmup, threads=threads or usable_cores(),
                        precision=precision, device=device, workers=workers, compile=compile, rounds=rounds)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with common.errors():
        try:
            with common.console.status("starting") as status:
                result = bench_train(out / "scratch", settings, openclip=openclip, accumulation=accumulation,
                                     tiny=tiny, on_stage=lambda stage: status.update(f"running: {stage}"),
                                     shards=shards, hycoclip=hycoclip)
        except BenchError as err:
            common.fail(str(err), 1)
    if tiny:
        result["study_training"] = study_training_time(result["measurements"]["tiny_recipe"]["samples_per_s"])
    if device == "cuda" and peak_tflops is None:
        import torch

        name = torch.cuda.get_device_name()
        peak_tflops = next((v for k, v in KNOWN_PEAK_TFLOPS.items() if k in name), None)
    if peak_tflops:
        result["mfu"] = result["euclip_tflops"] / peak_tflops
    table = Table(title=f"training throughput: {arch}, batch {batch_size}, {precision}, {device}, "
                        f"{settings.threads} threads, {rounds} interleaved rounds")
    gpu = any(m["peak_gpu_mib"] for m in result["measurements"].values())
    # The trainer's name never wraps or is cut: two OpenCLIP rows differ only at its end.
    table.add_column("trainer", no_wrap=True)
    for column in ("samples/s (median)", "per round", "waiting for data", "loaders could give (CPU)",
                   "peak RSS MiB") + (("peak GPU MiB",) * gpu):
        table.add_column(column, justify="right")
    for m in result["measurements"].values():
        wait = f"{m['data_wait_share']:.0%}" if m.get("data_wait_share") is not None else "-"
        loaders = (f"{m['loader_samples_per_s']:.1f} ({m['loader_cpu_share']:.0%})"
                   if m.get("loader_samples_per_s") is not None else "-")
        row = [m["name"], f"{m['samples_per_s']:.1f}", ", ".join(f"{r:.1f}" for r in m["per_round"]), wait, loaders,
               f"{m['peak_rss_mib']:.0f}"]
        table.add_row(*row, *([f"{m['peak_gpu_mib']:.0f}" if m["peak_gpu_mib"] else "-"] * gpu))
    common.console.print(table)
    for line in summary_lines(result):
        common.console.print(line, highlight=False)
    common.console.print(f"written: {write_result(out, 'train', result, stamp)}")


# The study ``make study`` runs, whose training time the tiny recipe's rate predicts.
DEFAULT_STUDY = "study-geometries"


def study_training_time(samples_per_s: float, study_name: str = DEFAULT_STUDY) -> dict:
    """The default study's training time at ``samples_per_s``: every (configuration, seed) run's
    samples over the rate. Training only; evaluation and analyses add about half a minute per run,
    and geometries other than the recipe's run at somewhat different speeds."""
    from euclip_cli import config as C
    from euclip_cli.study.spec import load_study

    study = load_study(study_name)
    samples = sum(C.load_config(spec.recipe, study.overrides(name, seed)).optim.samples
                  for name, spec in study.configs.items() for seed in study.seeds)
    runs = len(study.configs) * len(study.seeds)
    return {"study": study_name, "runs": runs, "samples": samples, "training_s": samples / samples_per_s}


def _spread(ratio: dict) -> str:
    return f"{ratio['median']:.2f}x (rounds {ratio['min']:.2f}-{ratio['max']:.2f}x)"


def summary_lines(result: dict) -> list[str]:
    """The bench's verdict lines: each ratio with its spread over rounds and its target."""
    from euclip_cli.config import STUDY_RUN_RECIPE
    from euclip_bench.measure import TARGET_ACCUM_OVERHEAD as overhead
    from euclip_bench.measure import TARGET_HYCOCLIP_STEP as hycoclip_cost
    from euclip_bench.measure import TARGET_FRACTION_OF_PEAK as fraction
    from euclip_bench.measure import TARGET_SPEEDUP as speedup
    from euclip_cli.data.loader import loader_reading

    def verdict(met: bool) -> str:
        return "met" if met else "missed"

    peak = result["peak_tflops"]["median"]
    share = result["fraction_of_peak"]
    lines = [f"model: {result['flops_per_sample'] / 1e9:.2f} GFLOP per training sample (euclip computes "
             f"{result['euclip_flops_per_sample'] / 1e9:.2f}: its text tower runs on trimmed contexts); euclip "
             f"{result['euclip_tflops']:.3f} TFLOP/s; this device's {result['settings']['precision']} matrix-product "
             f"peak, measured in the same run: {peak:.3f} TFLOP/s",
             f"euclip / measured peak: {100 * share['median']:.0f}% (rounds {100 * share['min']:.0f}-"
             f"{100 * share['max']:.0f}%; target >= {100 * fraction:.0f}%: {verdict(share['median'] >= fraction)})"]
    if "openclip_fraction_of_peak" in result:
        theirs = result["openclip_fraction_of_peak"]
        lines.append(f"OpenCLIP as its users run it / measured peak: {100 * theirs['median']:.0f}% (rounds "
                     f"{100 * theirs['min']:.0f}-{100 * theirs['max']:.0f}%)")
    fp32 = result["fp32_peak_tflops"]["median"]
    if fp32 > peak:
        lines.append(f"note: this device multiplies fp32 faster ({fp32:.3f} TFLOP/s) than "
                     f"{result['settings']['precision']} (no bf16 matrix units): compare --precision fp32")
    if "mfu" in result:
        lines.append(f"MFU against the spec sheet's peak: {100 * result['mfu']:.1f}%")
    if "speedup_vs_openclip" in result:
        ratio = result["speedup_vs_openclip"]
        lines.append(f"euclip / OpenCLIP as its users run it, both on the shards: {_spread(ratio)} (target >= "
                     f"{speedup}x on CPU: {verdict(ratio['median'] >= speedup)})")
        lines.append(f"the most euclip could reach against it here, at 100% of the measured peak: "
                     f"{_spread(result['speedup_ceiling'])}")
    if "openclip_synthetic" in result["measurements"]:
        ceiling = result["measurements"]["openclip_synthetic"]["samples_per_s"]
        lines.append(f"OpenCLIP on its synthetic images (no JPEG decoding, one image transformed again and "
                     f"again): {ceiling:.1f} samples/s; euclip on the shards reaches "
                     f"{result['measurements']['euclip']['samples_per_s'] / ceiling:.2f}x of it")
    if "speedup_vs_openclip_math" in result:
        lines.append(f"euclip / OpenCLIP with euclip's attention kernel (math): "
                     f"{_spread(result['speedup_vs_openclip_math'])}")
    if "accumulation_overhead" in result:
        ratio = result["accumulation_overhead"]
        lines.append(f"accumulation overhead (2 vs 1, same global batch): {_spread(ratio)} "
                     f"(target <= {overhead}x: {verdict(ratio['median'] <= overhead)})")
    if "hycoclip_step_cost" in result:
        ratio = result["hycoclip_step_cost"]
        lines.append(f"HyCoCLIP's step (a box per sample) against the plain one, samples/s without / with: "
                     f"{_spread(ratio)} (target <= {hycoclip_cost}x: {verdict(ratio['median'] <= hycoclip_cost)})")
    euclip = result["measurements"]["euclip"]
    if euclip.get("loader_samples_per_s") is not None:
        lines.append(f"euclip waited for data {euclip['data_wait_share']:.0%} of its time; its loaders could give "
                     f"{euclip['loader_samples_per_s']:.1f} samples/s at {euclip['loader_cpu_share']:.0%} CPU: "
                     + loader_reading(euclip["samples_per_s"], euclip["data_wait_share"],
                                      euclip["loader_samples_per_s"], euclip["loader_cpu_share"]))
    if "tiny_recipe" in result["measurements"]:
        study = result["study_training"]
        lines.append(f"the embedded study's recipe ({STUDY_RUN_RECIPE} as shipped): "
                     f"{result['measurements']['tiny_recipe']['samples_per_s']:.1f} samples/s; at this rate "
                     f"{study['study']} ({study['runs']} runs, {study['samples']:,} samples) trains in "
                     f"{study['training_s'] / 3600:.1f} h, before evaluation")
    return lines


def _check_caption_source(shards: Optional[Path], caption_words: Optional[float]) -> None:
    """``--shards`` and ``--caption-words`` (``bench text``, ``bench ops``): at most one, and a mean of a word or more."""
    if shards is not None and caption_words is not None:
        common.fail("--shards and --caption-words both name the captions: give one")
    if caption_words is not None and not caption_words >= 1:
        common.fail(f"--caption-words: {caption_words} is not a mean of at least one word")


def _captions(shards: Optional[Path], caption_words: Optional[float], count: int, out: Path) -> tuple[list[str], str]:
    """``count`` captions and where they come from, in words: synthetic ones of ``caption_words`` words on
    average, those of ``shards``, or the bench's world's (generated under ``out`` where missing)."""
    from euclip_bench.measure import ensure_world, shard_captions
    from euclip_cli.data.photo_shards import CAPTION_WORDS_SIGMA, synthetic_captions

    if caption_words is not None:
        return (synthetic_captions(caption_words, count),
                f"synthetic captions, word counts log-normal with mean {caption_words:g} (log-space spread "
                f"{CAPTION_WORDS_SIGMA})")
    if shards is not None and not shards.is_dir():
        raise UsageError(f"--shards {shards} is not a folder of .tar shards")
    source = shards if shards is not None else ensure_world(out / "scratch")
    return shard_captions(source, count), str(shards) if shards is not None else "the embedded world"


@app.command("text")
def text_bench(arch: str = typer.Option("tiny", help="Model: one of euclip's archs (model.arch) (tiny is the "
                                                      "embedded study's) or an open_clip model (ViT-B-32, "
                                                      "DataComp's small and medium tower, context 77)."),
               batch_size: int = typer.Option(128, min=2, help="Captions per batch."),
               batches: int = typer.Option(8, min=1, help="Batches of the world's captions timed per round."),
               rounds: int = typer.Option(5, min=1, help="Interleaved rounds (full context, then trimmed)."),
               precision: str = typer.Option("auto", help="auto, fp32, bf16 or fp16 (autocast); auto is what "
                                                          "train.precision=auto picks on this CPU."),
               shards: Optional[Path] = typer.Option(None, callback=common.checked_path,
                                                     help="Time on the captions of these img2dataset shards "
                                                          "(e.g. DataComp's) instead of the world's."),
               caption_words: Optional[float] = typer.Option(
                   None, help="Time on synthetic captions whose word counts are log-normal with this mean "
                              "(10: DataComp-1B's captions, as Li et al. 2024 report them) instead of the world's."),
               out: Path = OUT
               ) -> None:
    """The text tower with open_clip's full context against euclip's exact trimming, on the world's
    captions, on those of any shard folder, or on a DataComp-like length distribution.

    Examples:
      euclip bench text --rounds 5
      euclip bench text --shards data/datacomp/small/shards --arch bench-vit
      euclip bench text --arch ViT-B-32 --caption-words 10 --batch-size 64 --batches 4 --rounds 3
    """
    from euclip_bench.measure import BenchError, bench_text

    _check_precision(precision)
    import torch

    from euclip_cli.device import resolve_precision

    precision = resolve_precision(precision, torch.device("cpu"))
    _check_model_arch(arch)
    _check_caption_source(shards, caption_words)
    with common.errors():
        try:
            with common.console.status("timing the text tower, full context and trimmed, interleaved"):
                captions, source_name = _captions(shards, caption_words, batch_size * batches, out)
                result = bench_text(captions, arch, batch_size, rounds, precision)
        except BenchError as err:
            common.fail(str(err), 1)
    seconds = result["seconds_per_batch"]
    result["captions_from"] = source_name
    common.console.print(
        f"text tower forward+backward, {arch}, captions of {result['captions_from']}, batch {batch_size}, {precision}, {result['batches']} batches x "
        f"{rounds} rounds, mean caption {result['mean_caption_tokens']:.1f} tokens: full context {result['context']} tokens {1000 * seconds['full']:.1f} ms/batch, trimmed "
        f"(mean context {result['mean_trimmed_context']:.1f}) {1000 * seconds['trimmed']:.1f} ms/batch; "
        f"median ratio {result['ratio_median']:.2f}x (rounds {result['ratio_min']:.2f}-{result['ratio_max']:.2f}x)",
        highlight=False)
    common.console.print(f"written: {write_result(out, 'text', result)}")


@app.command("loader")
def loader_bench(arch: str = typer.Option("ViT-B-32", help="The model whose training transforms and tokenizer the "
                                                            "loader runs: 224 px for ViT-B-32 (DataComp's small "
                                                            "and medium tower), 64 for the local models."),
                 batch_size: int = typer.Option(256, min=1, help="Samples per batch."),
                 workers: int = typer.Option(2, min=0, help="Loader worker processes (data.workers)."),
                 batches: int = typer.Option(0, min=0, help="Batches timed per measurement; 0: four per worker, "
                                                            "at least 8."),
                 warmup: int = typer.Option(2, min=1, help="Batches taken before the clock starts (each "
                                                           "measurement starts fresh workers)."),
                 rounds: int = typer.Option(3, min=1, help="Interleaved rounds (euclip's loader, then OpenCLIP's)."),
                 device: str = typer.Option("auto", help="Where the batches go, as the trainer feeds them: cpu, "
                                                         "cuda or auto."),
                 shards: Optional[Path] = typer.Option(None, callback=common.checked_path, help="A folder of training shards to read (e.g. "
                                                       "euclip download datacomp-like); default: the bench's "
                                                       "embedded world."),
                 decoder: str = typer.Option(DataConfig().decoder, help="euclip's decoder (data.decoder): "
                                             "pil or pil-draft."),
                 out: Path = OUT
                 ) -> None:
    """The training loaders alone, euclip's against OpenCLIP's pipeline, on the embedded world or on
    --shards: samples/s, what euclip's loaders could give and their CPU share. Beside a training run's
    records (`data_wait_share`, `loader_samples_per_s`) it tells a loader too slow for the trainer
    from a trainer that loses time between its loader and its step.

    Examples:
      euclip bench loader
      euclip bench loader --shards data/datacomp-like --workers 1 --device cpu   # per core, 512-px JPEGs
      euclip bench loader --workers 8 --device cuda      # on a GPU machine, as the GPU checklist runs it
    """
    from rich.table import Table

    from euclip_bench.measure import (LOADERS, TARGET_BOXES_COST, BenchError, bench_loader, ensure_world,
                                      loader_batches_timed)

    _check_model_arch(arch)
    _check_decoder(decoder)
    if shards is not None and not shards.is_dir():
        common.fail(f"--shards {shards} is not a folder: give a folder of training shards (*.tar)")
    device = _bench_device(device)
    batches = batches or loader_batches_timed(workers)
    with common.errors():
        try:
            with common.console.status(f"timing the loaders: {arch}'s transforms, batch {batch_size}, {workers} "
                                       f"workers, {rounds} rounds"):
                # Only the embedded world has boxes: on other shards the box loader is left out.
                kinds = LOADERS if shards is None else tuple(k for k in LOADERS if k != "euclip-boxes")
                result = bench_loader(shards or ensure_world(out / "scratch"), arch, batch_size, workers, batches,
                                      warmup, rounds, device, decoder, kinds)
        except BenchError as err:
            common.fail(str(err), 1)
    table = Table(title=f"the training loaders alone: {arch}'s transforms, batch {batch_size}, {workers} workers, "
                        f"{batches} batches timed, fed to {device}, {rounds} interleaved rounds, shards "
                        f"{shards or 'of the embedded world'}, euclip's decoder {decoder}")
    table.add_column("loader", no_wrap=True)
    for column in ("samples/s (median)", "per round", "loaders could give (CPU)"):
        table.add_column(column, justify="right")
    names = {"euclip": "euclip (one buffer a batch)", "euclip-boxes": "euclip, a box per sample (HyCoCLIP's)",
             "openclip": "OpenCLIP's pipeline (reference)"}
    for kind in result["measurements"]:
        m = result["measurements"][kind]
        could = (f"{m['loader_samples_per_s']:.1f} ({m['loader_cpu_share']:.0%})"
                 if m["loader_samples_per_s"] is not None else "-")
        table.add_row(names[kind], f"{m['samples_per_s']:.1f}", ", ".join(f"{r:.1f}" for r in m["per_round"]), could)
    common.console.print(table)
    common.console.print(f"euclip / OpenCLIP: {_spread(result['euclip_vs_openclip'])}", highlight=False)
    if "boxes_cost" in result:
        common.console.print(f"a sample with its box costs {_spread(result['boxes_cost'])} one without (samples/s "
                             f"without / with; target at most {TARGET_BOXES_COST}x on one worker)", highlight=False)
    common.console.print(f"written: {write_result(out, 'loader', result)}")


def _check_decoder(decoder: str) -> None:
    from euclip_cli.data.decode import DECODERS

    if decoder not in DECODERS:
        common.fail(f"--decoder {decoder!r} is not one of {', '.join(DECODERS)}")


@app.command("decode")
def decode_bench(shards: Path = typer.Option(..., callback=common.checked_path, help="A folder of training shards with JPEGs (euclip download "
                                             "datacomp-like)."),
                 arch: str = typer.Option("ViT-B-32", help="The model whose training transform is measured (its "
                                                           "crop size and normalisation)."),
                 images: int = typer.Option(300, min=10, max=100_000, help="Images timed per way and round."),
                 rounds: int = typer.Option(3, min=1, max=100, help="Interleaved rounds."),
                 out: Path = OUT) -> None:
    """One core turning JPEG bytes into training crops, by each way there is: OpenCLIP's (PIL and the
    whole transform, to normalised floats) and, stopping at the uint8 crop as euclip's loader does, PIL,
    PIL's draft mode, torchvision.io's decode_jpeg and simplejpeg (where installed), each with its pixel
    difference from OpenCLIP's result on the same crops.

    Example: euclip bench decode --shards data/datacomp-like
    """
    from euclip_bench.decode import bench_decode, shard_images
    from euclip_cli.towers import build_clip, transforms_for

    _check_model_arch(arch)
    if not shards.is_dir():
        common.fail(f"--shards {shards} is not a folder: give a folder of training shards (*.tar)")
    with common.errors():
        data = shard_images(shards, images)
        if not data:
            common.fail(f"no JPEG images in the shards of {shards}: give shards of JPEGs (euclip download "
                        f"datacomp-like)")
        with common.console.status(f"decoding {len(data)} images x {rounds} rounds, one core"):
            result = bench_decode(data, transforms_for(build_clip(arch))[0], rounds)
    result["settings"] = {"shards": str(shards), "arch": arch, "images": len(data), "rounds": rounds}
    from rich.table import Table

    table = Table(title=f"{len(data)} JPEGs of {shards} (mean {result['mean_bytes'] / 1024:.0f} KiB, "
                        f"{result['mean_pixels'] / 1e3:.0f}k pixels) to {arch}'s training crops, one core, "
                        f"{rounds} rounds")
    for column in ("way", "samples/s (median)", "x openclip", "mean |diff| from openclip (0-255)", "99th pct",
                   "max"):
        table.add_column(column, justify="right" if column != "way" else "left")
    for name, m in result["measurements"].items():
        d = m["difference_from_openclip"]
        table.add_row(name, f"{m['samples_per_s']:.1f}", f"{m['vs_openclip']:.2f}", f"{d['mean']:.3f}",
                      f"{d['p99']:.1f}", f"{d['max']:.0f}")
    common.console.print(table)
    for name, why in result["not_measured"].items():
        common.console.print(f"{name}: not measured: {why}", highlight=False)
    common.console.print(f"written: {write_result(out, 'decode', result)}")


def _bench_device(device: str) -> str:
    """``--device`` resolved: auto is a GPU where there is one; a GPU the machine lacks is one line."""
    from euclip_cli.device import resolve_device

    with common.errors():
        return str(resolve_device(device))


@app.command("profile")
def profile_bench(arch: str = typer.Option("bench-vit", help="Model (one of euclip's archs, model.arch)."),
                  batch_size: int = typer.Option(256, min=2, help="Batch (bench train's default)."),
                  steps: int = typer.Option(3, min=1, help="Profiled steps, after two untimed ones."),
                  threads: int = typer.Option(0, min=0, help="Torch threads; 0 = every core this process may use."),
                  precision: str = typer.Option("auto", help="auto, fp32, bf16 or fp16; auto is what "
                                                             "train.precision=auto picks on this CPU."),
                  compile: bool = typer.Option(False, help="Compile the encoders as train.compile=true does."),
                  out: Path = typer.Option(Path("results") / "bench", callback=common.writable_folder,
                                       help="Where the JSON result and trace go.")
                  ) -> None:
    """Where a CPU training step goes: the trainer's step under torch's profiler, by kind of op, with
    the matrix products' FLOP/s beside the matrix-product peak measured in the same run.

    Example: euclip bench profile --steps 3
    """
    from rich.table import Table

    from euclip_bench.measure import MATRIX_KINDS, BenchError, profile_step

    _check_precision(precision)
    import torch

    from euclip_cli.device import resolve_precision

    _check_local_arch(arch)
    callers_threads = torch.get_num_threads()
    torch.set_num_threads(threads or usable_cores())
    precision = resolve_precision(precision, torch.device("cpu"))
    work = out / "scratch"
    with common.errors():
        work.mkdir(parents=True, exist_ok=True)
        try:
            with common.console.status(f"profiling {steps} training steps of {arch}, batch {batch_size}"):
                result = profile_step(work, arch, batch_size, steps, precision, compile)
        except BenchError as err:
            common.fail(str(err), 1)
        finally:  # the profile's count for the profile alone: a caller in this process (a test) keeps its own
            torch.set_num_threads(callers_threads)
    kinds = result["kinds_ms"]
    profiled = sum(kinds.values())
    table = Table(title=f"one step of {arch}, batch {batch_size}, {precision}, {result['threads']} threads, "
                        f"{'compiled' if compile else 'eager'}: self time by kind of op (under the profiler)")
    for column in ("kind of op", "ms per step", "share", "TFLOP/s"):
        table.add_column(column, justify="left" if column == "kind of op" else "right")
    for label, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        rate = result["kinds_tflops"].get(label)
        table.add_row(label, f"{ms:.1f}", f"{ms / profiled:.0%}", f"{rate:.3f}" if rate else "")
    common.console.print(table)
    largest = ", ".join(f"{op} {ms:.0f} ms" for op, ms in result["other_ops_ms"].items())
    common.console.print(f"largest in other: {largest}", highlight=False)
    matrix_share = sum(kinds[k] for k in MATRIX_KINDS) / profiled
    common.console.print(
        f"step {result['step_ms']:.0f} ms without the profiler ({batch_size * 1000 / result['step_ms']:.1f} samples/s; "
        f"forward and backward {result['forward_backward_ms']:.0f} ms, optimizer {result['optimizer_ms']:.0f} ms), "
        f"{result['profiled_step_ms']:.0f} ms under it. Matrix products: {matrix_share:.0%} of the step at "
        f"{result['matrix_tflops']:.3f} TFLOP/s, {result['matrix_tflops'] / result['peak_tflops']:.0%} of the "
        f"{result['peak_tflops']:.3f} TFLOP/s a 2048^3 product reached in the same run", highlight=False)
    common.console.print(f"written: {write_result(out, 'profile', result)} (Chrome trace: {result['trace']})")


@app.command("feed")
def feed_bench(arch: str = typer.Option("bench-feed", help="Model (one of euclip's archs, model.arch): its image size and "
                                                            "context set the loaders' work; the default's towers "
                                                            "are tiny, so that a step costs next to nothing."),
               batch_size: int = typer.Option(256, min=2, help="Samples per batch, as the loaders make them."),
               steps: int = typer.Option(24, min=1, help="Timed steps per loop (and batches per loader alone)."),
               warmup: int = typer.Option(4, min=1, help="Untimed first steps."),
               workers: int = typer.Option(1, min=0, help="Loader workers (1 on 2 cores leaves the trainer a "
                                                          "core, as a GPU machine's workers do)."),
               threads: int = typer.Option(1, min=1, help="Compute threads of each trainer."),
               step_samples: int = typer.Option(2, min=2, help="Samples of each batch the step computes on."),
               rounds: int = typer.Option(3, min=1, help="Interleaved rounds; every ratio is taken within a round."),
               out: Path = OUT
               ) -> None:
    """The data path as a very fast accelerator sees it: training loops with a nearly free step.

    Each loop's efficiency is its samples/s over its own loader's alone, in the same round: euclip's
    loop with staging slots and without, euclip's loop on OpenCLIP's pipeline, and OpenCLIP's trainer.

    Example: euclip bench feed --rounds 3
    """
    from rich.table import Table

    from euclip_bench.measure import BenchError
    from euclip_bench.feed import LOOPS, TARGET_EFFICIENCY, FeedSettings, bench_feed

    _check_local_arch(arch)
    if step_samples > batch_size:
        common.fail(f"--step-samples: {step_samples} is more than the batch of {batch_size}")
    settings = FeedSettings(arch=arch, batch_size=batch_size, steps=steps, warmup=warmup, workers=workers,
                            threads=threads, step_samples=step_samples, rounds=rounds)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with common.errors():
        try:
            with common.console.status("starting") as status:
                result = bench_feed(out / "scratch", settings, on_stage=lambda stage: status.update(f"running: {stage}"))
        except BenchError as err:
            common.fail(str(err), 1)
    table = Table(title=f"the data path with a nearly free step: {arch}, batch {batch_size} (steps on {step_samples}), "
                        f"{workers} workers, {threads} thread(s), {rounds} interleaved rounds")
    table.add_column("loop", no_wrap=True)
    for column in ("samples/s", "per round", "waiting for data", "its loader alone", "efficiency"):
        table.add_column(column, justify="right")
    names = {"euclip_staged": "euclip, staged", "euclip_unstaged": "euclip, unstaged",
             "euclip_on_openclip_pipeline": "euclip, OpenCLIP's data", "openclip_loop": "OpenCLIP"}
    for key, loader in LOOPS.items():
        m, e = result["loops"][key], result["efficiency"][key]
        table.add_row(names[key], f"{m['overall_samples_per_s']:.0f}",
                      ", ".join(f"{r:.0f}" for r in m["overall_per_round"]), f"{m['data_wait_share']:.0%}",
                      f"{result['loaders'][loader]['samples_per_s']:.0f}", f"{e['median']:.2f}")
    common.console.print(table)
    for line in feed_summary(result, TARGET_EFFICIENCY):
        common.console.print(line, highlight=False)
    common.console.print(f"written: {write_result(out, 'feed', result, stamp)}")


def feed_summary(result: dict, target: float) -> list[str]:
    """The feed bench's verdicts: each euclip loop's efficiency against the target and OpenCLIP's loop."""
    lines = []
    for key, name in (("euclip_staged", "staged"), ("euclip_unstaged", "not staged")):
        efficiency, versus = result["efficiency"][key], result["vs_openclip_loop"][key]
        met = efficiency["median"] >= target and versus["median"] >= 1.0
        lines.append(f"euclip's loop, {name}: efficiency {_spread(efficiency)} (target >= {target}), "
                     f"{_spread(versus)} OpenCLIP's loop's (target >= 1.00x): {'met' if met else 'missed'}")
    return lines


@app.command("ops")
def ops_bench(arch: str = typer.Option("bench-vit", help="Model: one of euclip's archs (model.arch) or an open_clip "
                                                          "model (ViT-B-32, DataComp's small and medium tower)."),
              batch_size: int = typer.Option(256, min=2, help="Captions (and images) in the step."),
              shards: Optional[Path] = typer.Option(None, callback=common.checked_path,
                                                    help="Captions of these img2dataset shards (e.g. DataComp's) "
                                                         "instead of the world's."),
              caption_words: Optional[float] = typer.Option(
                  None, help="Synthetic captions whose word counts are log-normal with this mean (10: DataComp-1B's "
                             "captions, as Li et al. 2024 report them) instead of the world's."),
              out: Path = OUT
              ) -> None:
    """Operations one training step dispatches, euclip's trainer against OpenCLIP's.

    On the same model and captions: on a GPU that computes faster than the host launches, the host's
    time follows this count. euclip's rows are its text tower's groupings (model.text_groups): one, the GPU's default of two,
    three, and every length its own (the CPU's default), each with the share of trimming's saving
    on the text tower's FLOPs it keeps.

    Examples:
      euclip bench ops
      euclip bench ops --arch ViT-B-32 --caption-words 10 --batch-size 128
    """
    from rich.table import Table

    from euclip_bench.ops import bench_ops

    _check_model_arch(arch)
    _check_caption_source(shards, caption_words)
    with common.errors():
        with common.console.status(f"counting the operations of a step of {arch}, batch {batch_size}"):
            captions, source = _captions(shards, caption_words, batch_size, out)
            if len(captions) < 2:
                raise UsageError(f"--shards {shards} holds {len(captions)} caption(s): a step needs at least 2")
            result = bench_ops(arch, captions, batch_size)
    result["captions_from"] = source
    theirs = result["openclip"]
    table = Table(title=f"operations in one training step: {arch}, {result['batch_size']} pairs, captions of {source}, "
                        f"context {result['context']}, bf16 autocast (views not counted)")
    table.add_column("trainer (text groups)", no_wrap=True)
    for column in ("plan", "step", "ratio", "update", "waits", "text", "kept"):
        table.add_column(column, justify="right")
    table.add_row("OpenCLIP (full context)", "-", str(theirs["step"]["ops"]), "1.00", str(theirs["update"]["ops"]),
                  str(theirs["step"]["reads"]), "1.00", "-")
    names = {0: "euclip, each length (CPU)", 1: "euclip, 1", 2: "euclip, 2 (GPU)"}
    for row in result["euclip"]:
        phases = row["phases"]
        kept = f"{row['saving_kept']:.0%}" if row["saving_kept"] is not None else "-"
        table.add_row(names.get(row["text_groups"], f"euclip, {row['text_groups']}"), str(phases["plan"]["ops"]),
                      str(phases["step"]["ops"]), f"{row['step_vs_openclip']:.2f}", str(phases["update"]["ops"]),
                      str(phases["step"]["reads"] + phases["update"]["reads"]),
                      f"{row['text_flops'] / row['full_text_flops']:.2f}", kept)
    common.console.print(table)
    common.console.print(
        "plan: operations on the host's copy of the tokens (the text groups); step: forward and backward, and "
        "its ratio to OpenCLIP's; update: the optimizer step (euclip: the non-finite guard, the fused AdamW, the "
        "clamps; OpenCLIP: AdamW on the multi-tensor path a GPU takes, which reads its step counts from host memory); "
        "waits: operations after which a GPU's host would wait for the device; text: the text tower's forward "
        "and backward FLOPs against the full context's; kept: the share of trimming's saving (every length its own "
        "group) kept", highlight=False)
    common.console.print(f"written: {write_result(out, 'ops', result)}")


def main() -> None:
    common.run_app(app)
