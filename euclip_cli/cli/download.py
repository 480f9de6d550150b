"""``euclip download world | evalsets | --recipe NAME``: fetch or generate the data a recipe needs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli.common import console, errors, fail
from euclip_cli.config import DataConfig
from euclip_cli.evaluate.evalsets import HF_DATASETS

# The world's defaults are the schema's, so `download world` and `download --recipe tiny-clip` agree.
_DATA = DataConfig()
# Shared by `download world` and `download --recipe` (a recipe pins the training pool, not these).
EVAL_SIZE = 1000
WORKERS = 2

app = typer.Typer(invoke_without_command=True)


def generate_world(out: Path, seed: int, samples: int, mismatch: float, eval_size: int, workers: int) -> None:
    from rich.progress import Progress

    from euclip_cli.data.world_files import WorldSettings, generate

    settings = WorldSettings(seed=seed, samples=samples, mismatch=mismatch, eval_size=eval_size)
    with errors(), Progress(console=console, transient=True) as progress:
        bar = progress.add_task("generating the embedded world", total=None)
        manifest = generate(out, settings, workers=workers,
                            progress=lambda done, total: progress.update(bar, completed=done, total=total))
    if manifest.get("skipped"):
        console.print(f"{out} already holds this world (seed {seed}, {samples} pairs): nothing to do")
    else:
        console.print(f"wrote {samples} training pairs in {manifest['train_shards']} shard(s) to {out / 'train'} and "
                      f"{len(manifest['eval_tasks'])} evaluation tasks to {out / 'eval'} in {manifest['seconds']} s")


@app.callback()
def download(ctx: typer.Context,
             recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Fetch what this recipe trains on.")) -> None:
    """Get training and evaluation data: the embedded world, or what a recipe pins (--recipe).

    Examples:
      euclip download --recipe tiny-clip
      euclip download world --samples 20000
    """
    if ctx.invoked_subcommand is not None:
        return
    if recipe is None:
        fail("give --recipe NAME or a subcommand (euclip download --help)", 2)
    from euclip_cli import config as C

    with errors():
        cfg = C.load_config(recipe)
    if cfg.data.dataset == "world":
        generate_world(C.train_dir(cfg).parent, cfg.data.world_seed, cfg.data.world_samples,
                       cfg.data.world_mismatch, EVAL_SIZE, WORKERS)
        return
    fail(f"recipe '{recipe}' trains on {cfg.data.dataset} ({cfg.data.filter}); the DataComp download "
         f"is not built yet (see the README's status section)", 1)


@app.command()
def world(out: Path = typer.Option(Path("data/world"), help="Output folder."),
          seed: int = typer.Option(_DATA.world_seed, help="Everything is deterministic from this seed."),
          samples: int = typer.Option(_DATA.world_samples, help="Training pairs to write."),
          mismatch: float = typer.Option(_DATA.world_mismatch, help="Fraction of pairs whose caption describes another image."),
          eval_size: int = typer.Option(EVAL_SIZE, help="Images per evaluation task."),
          workers: int = typer.Option(WORKERS, help="Generator processes.")) -> None:
    """Generate the embedded hierarchical image-caption world (training shards + evaluation tasks).

    Example: euclip download world --out data/world --samples 100000
    """
    if samples < 1 or eval_size < 1 or not 0 <= mismatch < 1:
        fail("--samples and --eval-size must be positive and --mismatch in [0, 1)", 2)
    generate_world(out, seed, samples, mismatch, eval_size, workers)


@app.command()
def evalsets(tasks: str = typer.Option("datacomp", help="A suite, SUITE:GROUP or task keys (euclip eval --list-tasks)."),
             root: Path = typer.Option(Path("data/eval"), help="Where task folders go (eval.root in recipes)."),
             base_url: str = typer.Option(HF_DATASETS, help="Dataset host; a mirror or a local server for tests.")) -> None:
    """Fetch DataComp's evaluation sets (clip-benchmark wds layout), checksummed and resumable.

    Re-running continues interrupted files and skips finished ones.

    Examples:
      euclip download evalsets --tasks imagenet1k
      euclip download evalsets --tasks datacomp:main,wilds/fmow
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from euclip_cli.evaluate.evalsets import DownloadError, download_task, download_winogavil
    from euclip_cli.evaluate.tasks import select

    with errors():
        chosen = select(tasks)
    chosen = [t for t in chosen if t.suite == "datacomp"]
    if not chosen:
        fail(f"--tasks '{tasks}' names no DataComp task (the embedded world's come from 'euclip download world')", 2)
    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn()]
    with Progress(*columns, console=console, transient=True) as progress:
        bars: dict[str, int] = {}

        def on_progress(name: str, advance: int, total: Optional[int]) -> None:
            if name not in bars:
                bars[name] = progress.add_task(name, total=total)
            progress.advance(bars[name], advance)

        for task in chosen:
            bars.clear()
            folder = task.data_dir(root, Path("data/world"))
            fetch = download_winogavil if task.kind == "winogavil" else lambda *a: download_task(task, *a)
            try:
                result = fetch(folder, base_url,
                               lambda name, n, total, key=task.key: on_progress(f"{key} {name}", n, total))
            except DownloadError as err:
                fail(f"{task.key}: {err}", 1)
            what = f"{result['shards']} shard(s)" if "shards" in result else "instances and images"
            console.print(f"{task.key}: {what} in {folder} ({result['fetched']} fetched, {result['present']} already there)")
