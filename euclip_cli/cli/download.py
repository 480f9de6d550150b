"""``euclip download world | datacomp-like | datacomp | redcaps | grit | urls | evalsets | probesets | wordnet | --recipe NAME``: fetch or generate the data a recipe needs."""

from __future__ import annotations

import inspect
import shlex
import sys
import typing
from pathlib import Path
from typing import Callable, Optional

import typer

from euclip_cli import worlddir as W
from euclip_cli.cli.common import checked_path, console, errors, fail, writable_folder
from euclip_cli.download import grit as grit_data  # `grit` is the command below
from euclip_cli.download.redcaps import ANNOTATIONS_URL
from euclip_cli.data.wordnet import INDEX_URL
from euclip_cli.download.webshards import ASSET_CACHE, DISTRIBUTORS, ImageOptions
from euclip_cli.evaluate.selection_sets import COCO_VAL2017_URL, SUGARCREPE_URL

WORKERS = 2

app = typer.Typer(invoke_without_command=True)


def generated(description: str, make: Callable[[Callable[[int, int], None]], dict]) -> dict:
    """``make(progress)``'s manifest, made under a progress bar that ``progress(done, total)`` moves."""
    from rich.progress import Progress

    with errors(), Progress(console=console, transient=True) as progress:
        bar = progress.add_task(description, total=None)
        return make(lambda done, total: progress.update(bar, completed=done, total=total))


def generate_world(out: Path, settings: W.WorldSettings, workers: int) -> None:
    """Write the world ``settings`` describe into ``out``, with a progress bar."""
    from euclip_cli.data.world_files import generate

    manifest = generated("generating the embedded world",
                         lambda progress: generate(out, settings, workers=workers, progress=progress))
    if manifest.get("skipped"):
        console.print(f"{out} already holds this world (seed {settings.seed}, {settings.samples} pairs): nothing to do")
    elif manifest.get("added"):
        console.print(f"{out} holds this world (seed {settings.seed}, {settings.samples} pairs); added the evaluation "
                      f"task(s) it lacked: {', '.join(manifest['added'])}")
    else:
        console.print(f"wrote {settings.samples} training pairs in {manifest['train_shards']} shard(s) to {out / 'train'} and "
                      f"{len(manifest['eval_tasks'])} evaluation tasks to {out / 'eval'} in {manifest['seconds']} s")


@app.callback()
def download(ctx: typer.Context,
             recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Fetch what this recipe trains on.")) -> None:
    """Get training and evaluation data: the embedded world, or what a recipe pins (--recipe).

    Examples:
      euclip download --recipe tiny-clip
      euclip download --recipe small-clip      (DataComp small, CLIP score L/14 30%)
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
        generate_world(C.train_dir(cfg).parent, W.from_config(cfg.data), WORKERS)
        return
    shards = C.train_dir(cfg)
    if shards.name != "shards":
        fail(f"data.train_dir {shards} must end in 'shards' for the download to write there "
             f"(or run 'euclip download {cfg.data.dataset.split('-')[0]} --out DIR' and point data.train_dir at "
             f"DIR/shards)", 2)
    if cfg.data.dataset == "redcaps":
        fetch_redcaps(shards.parent, ImageOptions())
        return
    if cfg.data.dataset == "grit":
        fetch_grit(shards.parent, ImageOptions())
        return
    fetch_datacomp(cfg.data.dataset.removeprefix("datacomp-"), cfg.data.filter, shards.parent, None, ImageOptions())


def image_options(processes: int, threads: int, retries: int, timeout: int, shard_size: int, image_size: int,
                  skip_bbox_blurring: bool, distributor: str, spark_master: str) -> ImageOptions:
    """img2dataset's options, shared by ``datacomp`` and ``urls``, checked."""
    if distributor not in DISTRIBUTORS:
        fail(f"unknown --distributor '{distributor}': choose one of {', '.join(DISTRIBUTORS)}", 2)
    if min(processes, threads, shard_size, image_size, timeout) < 1 or retries < 0:
        fail("--processes, --threads, --shard-size, --image-size and --timeout must be positive, --retries >= 0", 2)
    return ImageOptions(image_size=image_size, shard_size=shard_size, processes=processes, threads=threads,
                        retries=retries, timeout=timeout, blur_faces=not skip_bbox_blurring, distributor=distributor,
                        spark_master=spark_master)


class Bars:
    """Rich progress bars that step aside whenever a message is printed (img2dataset and
    huggingface_hub draw their own)."""

    def __init__(self):
        self.progress, self.tasks = None, {}

    def say(self, message: str) -> None:
        self.stop()
        console.print(message, highlight=False)

    def update(self, name: str, completed: int, total: Optional[int], advance: bool = False) -> None:
        from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn

        if self.progress is None:
            count = DownloadColumn() if advance else MofNCompleteColumn()
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), count, console=console,
                                     transient=True)
            self.progress.start()
            self.tasks = {}
        if name not in self.tasks:
            self.tasks[name] = self.progress.add_task(name, total=total)
        if advance:
            self.progress.advance(self.tasks[name], completed)
        else:
            self.progress.update(self.tasks[name], completed=completed, total=total)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def print_summary(manifest: dict, out: Path) -> None:
    rate = manifest["success_rate"]
    console.print(f"{manifest['downloaded']:,} of {manifest['attempted']:,} images downloaded ({rate:.1%}), "
                  f"{manifest['shards']} shard(s), {manifest['bytes'] / 1e9:.2f} GB in {out / 'shards'}")
    for reason, count in list(manifest["failures"].items())[:5]:
        console.print(f"  {count:>9,}  {reason}", highlight=False)
    if len(manifest["failures"]) > 5:
        console.print(f"  ... {len(manifest['failures']) - 5} more reasons in {out / 'manifest.json'}")


def fetch_datacomp(scale: str, filter_name: str, out: Path, metadata_dir: Optional[Path], options: ImageOptions,
                   hub_url: Optional[str] = None, assets_dir: Path = ASSET_CACHE, device: str = "auto",
                   chunk: int = 4096, uid_file: Optional[Path] = None) -> None:
    from euclip_cli.download.webshards import download_datacomp

    if filter_name == "image-based-clip-l14-30" and uid_file is None:  # the only stage that computes
        from euclip_cli.device import resolve_device

        with errors():
            device = str(resolve_device(device))
    bars = Bars()
    command = shlex.join(["euclip", *sys.argv[1:]])
    with errors():
        try:
            manifest = download_datacomp(
                out, scale, filter_name, options, command, bars.say,
                on_progress=lambda name, n, total: bars.update(f"asset {name}", n, total, advance=True),
                on_file=lambda stage, done, total: bars.update(f"{stage}: metadata files", done, total),
                metadata_dir=metadata_dir, endpoint=hub_url, assets_dir=assets_dir, device=device, chunk=chunk,
                uid_file=uid_file)
        finally:
            bars.stop()
    print_summary(manifest, out)


def fetch_redcaps(out: Path, options: ImageOptions, annotations_url: Optional[str] = None,
                  subreddits: Optional[list[str]] = None) -> None:
    from euclip_cli.download import redcaps

    bars = Bars()
    command = shlex.join(["euclip", *sys.argv[1:]])
    with errors():
        try:
            manifest = redcaps.download_redcaps(out, options, command, bars.say,
                                                annotations_url or redcaps.ANNOTATIONS_URL, subreddits,
                                                lambda n: bars.update("annotations", n, None, advance=True))
        finally:
            bars.stop()
    print_summary(manifest, out)


def fetch_grit(out: Path, options: ImageOptions, parts: int = grit_data.PARTS, hub_url: Optional[str] = None) -> None:
    bars = Bars()
    command = shlex.join(["euclip", *sys.argv[1:]])
    with errors():
        try:
            manifest = grit_data.download_grit(out, options, command, bars.say, parts, hub_url)
        finally:
            bars.stop()
    print_summary(manifest, out)
    boxes = manifest["boxes"]
    console.print(f"{boxes['with_boxes']:,} of {boxes['samples']:,} pairs kept with {boxes['boxes']:,} boxes "
                  f"(HyCoCLIP's preparation drops a pair left without a box) in {out / 'shards'}")


def world(out: Path = typer.Option(Path("data/world"), callback=writable_folder, help="Output folder."),
          workers: int = typer.Option(WORKERS, min=1, max=256, help="Generator processes."), **settings) -> None:
    """Generate the embedded hierarchical image-caption world (training shards + evaluation tasks).

    Example: euclip download world --out data/world --samples 100000
    """
    chosen = W.WorldSettings(**settings)
    bad = W.problems(chosen)
    if bad:
        fail("; ".join(f"--{name.replace('_', '-')} {value} must lie in {allowed}" for name, value, allowed in bad), 2)
    generate_world(out, chosen, workers)


def _with_world_options(command: Callable) -> Callable:
    """``command`` with an option per world setting (``worlddir.WorldSettings``: its name, type, default and
    help), so that ``download world`` and the config keys ``data.world_*`` cannot drift apart."""
    own, hints = inspect.signature(command).parameters, typing.get_type_hints(W.WorldSettings)
    options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name],
                                 default=typer.Option(f.default, help=f.metadata["help"])) for f in W.SETTINGS]
    command.__signature__ = inspect.Signature([own["out"], *options, own["workers"].replace(
        kind=inspect.Parameter.KEYWORD_ONLY)])
    command.__annotations__ = {**{p.name: p.annotation for p in options}, "out": Path, "workers": int, "return": None}
    return command


app.command("world")(_with_world_options(world))


@app.command("datacomp-like")
def datacomp_like(out: Path = typer.Option(Path("data/datacomp-like"), callback=writable_folder, help="Output folder."),
                  samples: int = typer.Option(4000, min=1, max=10_000_000, help="Samples to write (1,000 a shard)."),
                  seed: int = typer.Option(0, min=0, max=2 ** 63 - 1, help="Everything is deterministic from this seed."),
                  workers: int = typer.Option(WORKERS, min=1, max=256, help="Generator processes.")) -> None:
    """Generate DataComp-like training shards: photo-like JPEGs of up to 512 px at quality 95, as
    img2dataset writes DataComp's, with captions of DataComp's lengths, for measuring the data path
    (euclip bench loader --shards, bench decode). Not for learning: the images carry no labels.

    Example: euclip download datacomp-like --out data/datacomp-like --samples 4000
    """
    from euclip_cli.data.photo_shards import generate

    manifest = generated("generating DataComp-like shards",
                         lambda progress: generate(out, samples, seed=seed, workers=workers, progress=progress))
    if manifest.get("skipped"):
        console.print(f"{out} already holds these shards (seed {seed}, {samples} samples): nothing to do")
    else:
        console.print(f"wrote {samples} samples in {manifest['shards']} shard(s), {manifest['bytes'] / 2 ** 20:.1f} MiB, "
                      f"to {out} in {manifest['seconds']} s")


@app.command()
def evalsets(tasks: str = typer.Option("datacomp", help="A suite, SUITE:GROUP or task keys (euclip eval --list-tasks)."),
             root: Path = typer.Option(Path("data/eval"), callback=writable_folder,
                                       help="Where task folders go (eval.root in recipes)."),
             base_url: Optional[str] = typer.Option(None, help="Dataset host; a mirror or a local server for tests "
                                                               "(default: Hugging Face's datasets, where "
                                                               "clip-benchmark keeps them)."),
             sugarcrepe_url: str = typer.Option(SUGARCREPE_URL, help="SugarCrepe's annotation folder; a mirror or a "
                                                                     "local server for tests."),
             coco_url: str = typer.Option(COCO_VAL2017_URL, help="COCO's val2017.zip (SugarCrepe's images); a mirror "
                                                                 "or a local server for tests.")) -> None:
    """Fetch DataComp's evaluation sets (clip-benchmark wds layout), checksummed and resumable, and the
    compositional ones (SugarCrepe from its authors and COCO; Winoground from the Hub, gated: set HF_TOKEN).

    Re-running continues interrupted files and skips finished ones.

    Examples:
      euclip download evalsets --tasks imagenet1k
      euclip download evalsets --tasks datacomp:main,wilds/fmow
      euclip download evalsets --tasks meru      (the DataComp sets MERU's suite reads)
      euclip download evalsets --tasks compositional      (SugarCrepe's seven splits and Winoground)
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from euclip_cli.errors import Failure
    from euclip_cli.evaluate.evalsets import HF_DATASETS, download
    from euclip_cli.evaluate.runner import export_command
    from euclip_cli.evaluate.selection_sets import download_sugar_crepe, download_winoground
    from euclip_cli.protocol.tasks import TASKS, select

    with errors():
        named = select(tasks)
    # MERU's suite reads DataComp's sets: each of its tasks fetches its source's (once); one on no host cannot.
    unhosted = [t for t in named if t.folder]
    chosen = list(dict.fromkeys(TASKS[t.source] if t.source else t for t in named if t.suite != "world" and not t.folder))
    for task in unhosted:
        console.print(f"{task.key}: on no host; make it with {export_command(task, str(root))}", highlight=False)
    if not chosen:
        if unhosted:
            return
        fail(f"--tasks '{tasks}' names no DataComp or compositional task (the embedded world's come from 'euclip "
             f"download world')", 2)
    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn()]
    with Progress(*columns, console=console, transient=True) as progress:
        bars: dict[str, int] = {}

        def on_progress(name: str, advance: int, total: Optional[int]) -> None:
            if name not in bars:
                bars[name] = progress.add_task(name, total=total)
            progress.advance(bars[name], advance)

        # SugarCrepe's seven splits share one folder, fetched once.
        by_folder: dict[Path, object] = {}
        for task in chosen:
            by_folder.setdefault(task.data_dir(root, Path("data/world")), task)
        for folder, task in by_folder.items():
            bars.clear()
            shown = lambda name, n, total, key=task.key: on_progress(f"{key} {name}", n, total)  # noqa: E731
            with errors():  # a folder holding another source is a usage error
                try:
                    if task.key == "winoground":
                        result = download_winoground(folder, base_url or HF_DATASETS, shown)
                    elif task.suite == "compositional":
                        result = download_sugar_crepe(folder, sugarcrepe_url, coco_url, shown)
                    else:
                        result = download(task, folder, base_url or HF_DATASETS, shown)
                except Failure as err:
                    fail(f"{result_name(task)}: {err}", 1, err.details)
            what = f"{result['shards']} shard(s)" if "shards" in result else "instances and images"
            if "pairs" in result:
                what = f"{result['pairs']:,} pairs of all seven splits and {result['images']:,} images"
            if "captions" in result:
                what += f", {result['images']:,} images and {result['captions']:,} captions"
            console.print(f"{result_name(task)}: {what} in {folder} ({result['fetched']} fetched, "
                          f"{result['present']} already there)")


def result_name(task) -> str:
    """How a download's line names what it fetched: SugarCrepe's splits come as one set."""
    return "sugar_crepe" if task.key.startswith("sugar_crepe/") else task.key


@app.command()
def probesets(tasks: str = typer.Option("meru-probe", help="Probe tasks: meru-probe, or meru-probe/DATASET,..."),
              root: Path = typer.Option(Path("data/eval"), callback=writable_folder,
                                        help="Where the probe sets go (eval.root in recipes)."),
              sources: Path = typer.Option(Path("data/eval-sources"), callback=writable_folder,
                                           help="Where clip-benchmark's builder fetches the datasets.")) -> None:
    """Make MERU's linear-probe sets (Table 7) with clip-benchmark's exporter, each split from the export that
    gives MERU's (docs/meru.md), then count them against MERU's Table 6 (euclip eval --check-sets).

    Examples:
      euclip download probesets --tasks meru-probe/food101,meru-probe/dtd
      euclip download probesets             (every dataset with an export; SUN397, EuroSAT, RESISC45, CLEVR have none)
    """
    from euclip_cli.download.probesets import export_for, make_probe_set
    from euclip_cli.errors import UsageError
    from euclip_cli.evaluate.sets import check_probe_set
    from euclip_cli.protocol.tasks import select

    say = lambda line: console.print(line, highlight=False, soft_wrap=True)  # noqa: E731
    with errors():
        chosen = [t for t in select(tasks) if t.kind == "probe"]
        if not chosen:
            fail(f"--tasks '{tasks}' names no probe task (meru-probe, or meru-probe/DATASET)", 2)
        for task in chosen:
            try:
                export_for(task)
            except UsageError as err:
                if len(chosen) == 1:  # a set no export makes, asked for alone, is the user's to know at once
                    raise
                say(str(err))
                continue
            folder = task.data_dir(root, Path("data/world"))
            make_probe_set(task, folder, sources, say)
            r = check_probe_set(task, folder)
            say(f"{task.key}: {r['train']:,} / {r['val']:,} / {r['test']:,} images, {r['classes']} classes; MERU's "
                f"sizes {'match' if r['sizes_match_meru'] else 'DIFFER'}")


@app.command()
def wordnet(out: Path = typer.Option(Path("data/nltk_data"), callback=writable_folder,
                                     help="nltk_data folder to install into (analyze hierarchy --wordnet)."),
            index_url: str = typer.Option(INDEX_URL, help="nltk's data index; a mirror or a local server for tests.")
            ) -> None:
    """Fetch WordNet 3.0 (nltk's 'wordnet' package, checksummed by nltk's downloader), the hierarchy over
    ImageNet's classes that 'euclip analyze hierarchy --tree wordnet' scores mistakes in. About 10 MB.

    Example: euclip download wordnet
    """
    from euclip_cli.data.wordnet import fetch, reader

    with errors():
        said = fetch(out, index_url)
        reader(out)  # what was fetched is a WordNet nltk can read, or this says so now
    console.print(f"WordNet in {out}: {said}")


# img2dataset's options, shared by ``datacomp``, ``redcaps``, ``grit`` and ``urls``; the defaults are DataComp's.
_IMG = ImageOptions()
PROCESSES = typer.Option(_IMG.processes, help="img2dataset processes.")
THREADS = typer.Option(_IMG.threads, help="img2dataset threads per process.")
RETRIES = typer.Option(_IMG.retries, help="Retries per image.")
TIMEOUT = typer.Option(_IMG.timeout, help="Seconds per image request.")
SHARD_SIZE = typer.Option(_IMG.shard_size, help="Samples per shard.")
IMAGE_SIZE = typer.Option(_IMG.image_size, help="Longest side kept (resized only if bigger).")
DISTRIBUTOR = typer.Option(_IMG.distributor, help="img2dataset distributor: multiprocessing | pyspark | ray.")
SPARK_MASTER = typer.Option("", help="pyspark: the cluster's master URL (spark://HOST:7077).")


@app.command()
def datacomp(scale: str = typer.Option(..., help="Pool: small (12.8M) or medium (128M)."),
             filter: Optional[str] = typer.Option(None, "--filter",
                                                  help="none | clip-l14-30 (default) | image-based-clip-l14-30 "
                                                       "(the paper's subsets)."),
             uids: Optional[Path] = typer.Option(None, callback=checked_path,
                                                 help="Instead of --filter: a DataComp uid file (.npy of "
                                                      "u8,u8) to download, e.g. another baseline's subset."),
             out: Optional[Path] = typer.Option(None, callback=writable_folder,
                                                help="Output folder (default data/datacomp-SCALE-FILTER, "
                                                     "where the recipes' data.train_dir looks)."),
             metadata_dir: Optional[Path] = typer.Option(None, callback=checked_path,
                                                         help="Pool metadata (default OUT/metadata); share one "
                                                              "between filters of a scale."),
             hub_url: Optional[str] = typer.Option(None, help="Hugging Face endpoint (default HF_ENDPOINT or "
                                                              "huggingface.co)."),
             assets_dir: Path = typer.Option(ASSET_CACHE, callback=writable_folder,
                                             help="Cache of the image-based filter's centroids, ImageNet embeddings "
                                                  "and fastText model."),
             device: str = typer.Option("auto", help="Where the image-based filter's nearest-centroid search runs."),
             chunk: int = typer.Option(4096, min=1, help="Embeddings per nearest-centroid matmul (memory peak)."),
             processes: int = PROCESSES, threads: int = THREADS, retries: int = RETRIES, timeout: int = TIMEOUT,
             shard_size: int = SHARD_SIZE, image_size: int = IMAGE_SIZE,
             skip_bbox_blurring: bool = typer.Option(False, help="Do not blur the metadata's face boxes."),
             distributor: str = DISTRIBUTOR, spark_master: str = SPARK_MASTER) -> None:
    """Fetch a DataComp pool's metadata, apply the paper's filter, download only the selected images.

    Re-running the same command continues where it stopped, and does nothing once complete.

    Examples:
      euclip download datacomp --scale small --filter clip-l14-30
      euclip download datacomp --scale medium --filter image-based-clip-l14-30 --processes 32 --threads 256
      euclip download datacomp --scale small --uids my_filter.npy --out data/small-my-filter
    """
    from euclip_cli.download.webshards import datacomp_folder

    # Scale and filter are checked where the recipe route checks them too: download_datacomp.
    if filter is not None and uids is not None:
        fail("give --filter or --uids, not both", 2)
    if uids is not None and not uids.is_file():
        fail(f"--uids {uids} does not exist", 2)
    options = image_options(processes, threads, retries, timeout, shard_size, image_size, skip_bbox_blurring,
                            distributor, spark_master)
    fetch_datacomp(scale, filter or "clip-l14-30", out or datacomp_folder(scale, filter, uids), metadata_dir,
                   options, hub_url, assets_dir, device, chunk, uids)


@app.command()
def redcaps(out: Path = typer.Option(Path("data/redcaps"), callback=writable_folder,
                                     help="Output folder (shards in OUT/shards, where MERU's recipes read)."),
            subreddits: Optional[str] = typer.Option(None, help="Only these subreddits, comma-separated "
                                                               "(a smaller download; default: all 350)."),
            annotations_url: str = typer.Option(ANNOTATIONS_URL, help="RedCaps' annotations archive; a mirror or "
                                                                     "a local server for tests."),
            processes: int = PROCESSES, threads: int = THREADS, retries: int = RETRIES, timeout: int = TIMEOUT,
            shard_size: int = SHARD_SIZE, image_size: int = IMAGE_SIZE, distributor: str = DISTRIBUTOR,
            spark_master: str = SPARK_MASTER) -> None:
    """Download RedCaps (12M Reddit image-caption pairs, MERU's training data): its annotations archive,
    then the images with img2dataset into the same shards as DataComp's. Resumable.

    Examples:
      euclip download --recipe meru-vit-s          (all of it, into data/redcaps)
      euclip download redcaps --subreddits itookapicture,pics --out data/redcaps-small
    """
    chosen = [s.strip() for s in subreddits.split(",") if s.strip()] if subreddits is not None else None
    if subreddits is not None and not chosen:
        fail("--subreddits names no subreddit: give a comma-separated list, or leave it out for all", 2)
    # No face blurring: DataComp's face boxes come with its metadata, and RedCaps has none.
    options = image_options(processes, threads, retries, timeout, shard_size, image_size, True, distributor,
                            spark_master)
    fetch_redcaps(out, options, annotations_url, chosen)
    console.print(f"next: euclip train --recipe meru-vit-s data.train_dir={out / 'shards'}")


@app.command()
def grit(out: Path = typer.Option(Path("data/grit"), callback=writable_folder,
                                  help="Output folder (shards in OUT/shards, where HyCoCLIP's recipes read)."),
         parts: int = typer.Option(grit_data.PARTS, min=1, max=grit_data.PARTS,
                                   help=f"The first N of GRIT's {grit_data.PARTS} metadata files (about 1M pairs each; "
                                        f"default all)."),
         hub_url: Optional[str] = typer.Option(None, help="Hugging Face endpoint (default HF_ENDPOINT or "
                                                          "huggingface.co)."),
         processes: int = PROCESSES, threads: int = THREADS, retries: int = RETRIES, timeout: int = TIMEOUT,
         shard_size: int = SHARD_SIZE, distributor: str = DISTRIBUTOR, spark_master: str = SPARK_MASTER) -> None:
    """Download GRIT (20.5M grounded image-text pairs, HyCoCLIP's training data): its metadata from the Hub, the
    images with img2dataset at GRIT's own settings, then each pair's boxes cut as HyCoCLIP prepares them.
    Resumable.

    Examples:
      euclip download --recipe hycoclip-vit-s      (all of it, into data/grit)
      euclip download grit --parts 1 --out data/grit-1m
    """
    # GRIT's image size and resize mode are its dataset card's (download.grit), so there is no --image-size;
    # no face boxes come with it, so nothing is blurred.
    options = image_options(processes, threads, retries, timeout, shard_size, _IMG.image_size, True, distributor,
                            spark_master)
    fetch_grit(out, options, parts, hub_url)
    console.print(f"next: euclip train --recipe hycoclip-vit-s data.train_dir={out / 'shards'}")


@app.command()
def urls(parquet: Path = typer.Option(..., callback=checked_path, help="A parquet file of image URLs and captions."),
         out: Path = typer.Option(..., callback=writable_folder,
                                  help="Output folder (shards in OUT/shards; point data.train_dir there)."),
         url_col: str = typer.Option("url", help="The URL column."),
         caption_col: str = typer.Option("caption", help="The caption column."),
         uid_col: Optional[str] = typer.Option(None, help="A unique-id column (default: derived from url and caption)."),
         processes: int = PROCESSES, threads: int = THREADS, retries: int = RETRIES, timeout: int = TIMEOUT,
         shard_size: int = SHARD_SIZE, image_size: int = IMAGE_SIZE, distributor: str = DISTRIBUTOR,
         spark_master: str = SPARK_MASTER) -> None:
    """Download any image-text list (RedCaps, CC3M, ...) into training shards, as DataComp's are.

    Examples:
      euclip download urls --parquet cc3m.parquet --out data/cc3m
      euclip download urls --parquet redcaps.parquet --url-col url --caption-col caption --out data/redcaps
    """
    from euclip_cli.download.webshards import download_urls

    options = image_options(processes, threads, retries, timeout, shard_size, image_size, True, distributor,
                            spark_master)
    command = shlex.join(["euclip", *sys.argv[1:]])
    with errors():
        manifest = download_urls(parquet, out, options, command, lambda message: console.print(message, highlight=False),
                                 url_col, caption_col, uid_col)
    print_summary(manifest, out)
    console.print(f"next: euclip train --recipe RECIPE data.train_dir={out / 'shards'}")
