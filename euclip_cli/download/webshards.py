"""Web image-text pairs into training shards: a DataComp pool's filtered subset, or any url list.

One output folder per dataset::

    <out>/manifest.json      what was asked, what came: counts, bytes, success rate, failure reasons
    <out>/uids.npy           DataComp only: the subset, sorted u8,u8 (DataComp's uid-file format)
    <out>/download-list/     the selected rows (url, text, uid[, face_bboxes]): img2dataset's input
    <out>/shards/            img2dataset's webdataset output, which ``euclip train`` reads
    <out>/metadata/          DataComp, by default: the pool's parquet (and npz) files; RedCaps: its
                             annotations archive (``download.redcaps``)

Every stage leaves a record of completion, so the same command continues where a previous
one stopped (img2dataset itself skips shards whose ``_stats.json`` exists) and does nothing
once the manifest says ``complete``. Nothing here deletes a downloaded file; an asset that
fails its checksum is set aside as ``NAME.bad``.

NumPy, pyarrow and torch are imported inside the functions that use them: the CLI reads
``ImageOptions`` for its defaults, and ``euclip --help`` must stay instant.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import multiprocessing
import re
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from euclip_cli.data.fetch import FetchError, check_ray_address, configure_hub_client, fetch_file, sha256_of
from euclip_cli.errors import UsageError
from euclip_cli.data.downloads import MANIFEST, read_manifest
from euclip_cli.rundir import read_json

if TYPE_CHECKING:
    from euclip_cli.data.datacomp import ImageBasedInputs

LIST_DIR = "download-list"
SHARDS_DIR = "shards"
# GRIT's img2dataset shards, before its boxes are cut (download.grit).
RAW_DIR = "raw"
OWN_ENTRIES = {MANIFEST, "uids.npy", LIST_DIR, SHARDS_DIR, RAW_DIR, "metadata"}
DISTRIBUTORS = ("multiprocessing", "pyspark", "ray")
SHARD_DIGITS = 8  # img2dataset's oom_shard_count, as DataComp sets it: shard names 00000000.tar ...
ASSET_CACHE = Path("~/.cache/euclip/datacomp")
# DataComp's README: 450 GB of shards for small's 12.8M pool at 512 px, about 35 kB a sample.
BYTES_PER_IMAGE = 35_000


class OutputConflict(UsageError):
    """The output folder holds something other than this download."""


@dataclass
class ImageOptions:
    """img2dataset's settings; the defaults are DataComp's ``download_upstream.py``."""
    image_size: int = 512
    shard_size: int = 10_000
    processes: int = 16
    threads: int = 128
    retries: int = 2
    timeout: int = 10
    blur_faces: bool = True
    distributor: str = "multiprocessing"
    # img2dataset's resize_mode with image_size: DataComp's keeps the longest side at most image_size; GRIT's
    # own command ("keep_ratio") the shortest.
    resize_mode: str = "keep_ratio_largest"
    # pyspark only: the cluster to run on (img2dataset otherwise starts a local Spark session).
    spark_master: str = ""

    def identity(self) -> dict:
        """What changes the shards' content; a rerun must keep these. The resize mode only where it is not
        DataComp's, so that a download begun before the mode was an option still continues."""
        return {"image_size": self.image_size, "shard_size": self.shard_size, "blur_faces": self.blur_faces,
                **({"resize_mode": self.resize_mode} if self.resize_mode != "keep_ratio_largest" else {})}


Say = Callable[[str], None]
OnProgress = Callable[[str, int, Optional[int]], None]


# ------------------------------------------------------------------ the output folder and its manifest

def write_manifest(folder: Path, manifest: dict) -> None:
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    tmp.replace(folder / MANIFEST)


def claim_output(out: Path, identity: dict, command: str) -> dict:
    """The folder's manifest, new or matching ``identity``; refuse a folder holding anything else."""
    found = read_manifest(out)
    if found is None:
        if out.exists() and any(p.name not in OWN_ENTRIES for p in out.iterdir()):
            raise OutputConflict(f"{out} already holds other files and no euclip {MANIFEST}; choose an empty or new "
                                 f"--out (nothing was changed)")
        if out.exists() and (out / SHARDS_DIR).exists():
            raise OutputConflict(f"{out}/{SHARDS_DIR} exists without a {MANIFEST}; choose a new --out "
                                 f"(nothing was changed)")
        out.mkdir(parents=True, exist_ok=True)
        found = {"identity": identity, "command": command, "complete": False,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_manifest(out, found)
        return found
    if found.get("identity") != identity:
        theirs = found.get("identity", {})
        differs = sorted(k for k in set(theirs) | set(identity) if theirs.get(k) != identity.get(k))
        raise OutputConflict(f"{out} holds another download ({', '.join(f'{k}={theirs.get(k)}' for k in differs)}); "
                             f"rerun with those settings or choose another --out (nothing was changed)")
    return found


# ------------------------------------------------------------------ Hugging Face metadata

def fetch_metadata(repo: str, dest: Path, patterns: list[str], endpoint: Optional[str], say: Say,
                   hint: str = "check --scale") -> None:
    """``repo``'s files matching ``patterns`` into ``dest`` through huggingface_hub, which skips
    finished files and continues partial ones.

    A marker lists what a finished fetch brought, so a rerun needs no network for this stage.
    """
    marker = dest / ".euclip-fetched.json"
    done = read_json(marker) if marker.exists() else {}
    todo = [p for p in patterns if p not in done.get("patterns", [])]
    if todo:
        import fnmatch

        from huggingface_hub import HfApi, snapshot_download

        configure_hub_client()
        api = HfApi(endpoint=endpoint)
        # repo_info first: it fails at once when the Hub is unreachable, where the tree listing
        # retries for half a minute; and it tells a missing or gated repository apart.
        _hub_call(repo, endpoint, lambda: api.repo_info(repo, repo_type="dataset"))
        listing = _hub_call(repo, endpoint, lambda: list(api.list_repo_tree(repo, repo_type="dataset", recursive=True)))
        wanted = [f for f in listing if getattr(f, "size", None) is not None
                  and any(fnmatch.fnmatch(f.path, p) for p in todo)]
        if not wanted:
            raise FetchError(f"the Hub's {repo} has no {' or '.join(todo)} files; {hint}")
        dest.mkdir(parents=True, exist_ok=True)
        needed = sum(f.size for f in wanted if not (dest / f.path).exists() or (dest / f.path).stat().st_size != f.size)
        free = shutil.disk_usage(dest).free
        if needed > free:
            raise FetchError(f"{repo} needs {needed / 1e9:.1f} GB more under {dest}, {free / 1e9:.1f} GB is free; "
                             f"free space (or pass another --metadata-dir) and rerun")
        say(f"metadata: {len(wanted)} file(s) of {repo} ({needed / 1e9:.2f} GB to fetch) into {dest}")
        _hub_call(repo, endpoint, lambda: snapshot_download(repo_id=repo, repo_type="dataset", allow_patterns=todo,
                                                            local_dir=dest, endpoint=endpoint))
        done = {"repo": repo, "patterns": sorted(set(done.get("patterns", [])) | set(todo))}
        marker.write_text(json.dumps(done))


def _hub_call(repo: str, endpoint: Optional[str], call):
    """One Hugging Face Hub call with its failures turned into one-line FetchErrors."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError)

    where = endpoint or constants.ENDPOINT
    try:
        return call()
    except GatedRepoError:
        raise FetchError(f"{repo} is gated: accept its terms on Hugging Face and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise FetchError(f"{where} has no dataset {repo}; check --scale (or HF_ENDPOINT)") from None
    # LocalEntryNotFoundError: a download that lost the Hub midway and has no local copy.
    except (httpx2.TransportError, LocalEntryNotFoundError) as err:
        reason = str(err).splitlines()[0]
        raise FetchError(f"cannot reach the Hugging Face Hub at {where} ({reason}); check the network connection "
                         f"and rerun: files already fetched are kept") from None
    except HfHubHTTPError as err:
        raise FetchError(f"the Hub answered {str(err).splitlines()[0]} for {repo}; rerun later") from None
    except OSError as err:
        if getattr(err, "errno", None) == 28:  # disk full: the CLI words it
            raise
        raise FetchError(f"fetching {repo} from {where} failed ({err}); rerun to continue") from None


# ------------------------------------------------------------------ the image-based filter's assets

def fetch_assets(names: list[str], cache: Path, on_progress: OnProgress) -> dict[str, Path]:
    """DataComp's filter assets into ``cache``, each checked against its pinned sha256."""
    from euclip_cli.data import datacomp as dc

    cache.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names:
        asset, path = dc.ASSETS[name], cache / name
        if not (path.exists() and sha256_of(path) == asset.sha256):
            on_progress(name, 0, None)
            fetch_file(asset.url, path, None, lambda n, name=name: on_progress(name, n, None))
            if sha256_of(path) != asset.sha256:
                bad = path.with_name(path.name + ".bad")
                path.replace(bad)
                raise FetchError(f"{asset.url} fails its sha256 check (kept as {bad} for inspection); rerun to "
                                 f"fetch it again")
        paths[name] = path
    return paths


def load_language_model(path: Path):
    """fastText's language identifier (DataComp's lid.176.bin)."""
    import fasttext

    fasttext.FastText.eprint = lambda *args: None  # silence its load-time deprecation warning
    return fasttext.load_model(str(path))


def load_asset(path: Path):
    """A DataComp asset (the centroids are a pickled NumPy array, the ImageNet files a dict of tensors)
    through torch's weights-only unpickler, which builds tensors and containers and no other object:
    NumPy's array reconstruction is the one callable it is allowed beside them, so a file that would run
    code is refused (one line naming it) even though its sha256 matched a pin."""
    import numpy as np
    import torch

    rebuild = np._core.multiarray._reconstruct
    allowed = [np.ndarray, np.dtype, rebuild, (rebuild, "numpy.core.multiarray._reconstruct"),
               *(type(np.dtype(t)) for t in ("float16", "float32", "float64"))]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch reports refused globals and damaged files with several types
        raise FetchError(f"{path} is not an asset of DataComp's kind ({type(err).__name__}: "
                         f"{str(err).splitlines()[0][:200]}): delete it and rerun") from None


def _matrix(value, path: Path):
    """``value`` if it is a 2-D array or tensor of floats (what every DataComp asset is), else a FetchError."""
    import numpy as np
    import torch

    ok = (isinstance(value, (np.ndarray, torch.Tensor)) and value.ndim == 2
          and (value.dtype.is_floating_point if isinstance(value, torch.Tensor) else value.dtype.kind == "f"))
    if not ok:
        raise FetchError(f"{path} holds {type(value).__name__} {getattr(value, 'shape', '')}, not a matrix of "
                         f"embeddings: delete it and rerun")
    return value


def image_based_inputs(scale: str, assets: dict[str, Path], device: str, chunk: int) -> ImageBasedInputs:
    """Load the language model, the pool centroids and the ImageNet clusters onto ``device``."""
    import fasttext
    import torch

    from euclip_cli.data import datacomp as dc

    centroids = torch.as_tensor(_matrix(load_asset(assets[f"{scale}_centroids_l14.pt"]),
                                        assets[f"{scale}_centroids_l14.pt"]), dtype=torch.float32).to(device)
    parts = []
    for i in range(5):
        path = assets[f"in1k_clip_vit_l14_{i}.pt"]
        loaded = load_asset(path)
        if not isinstance(loaded, dict) or "image_features" not in loaded:
            raise FetchError(f"{path} holds no 'image_features': not DataComp's ImageNet embeddings; delete it "
                             f"and rerun")
        parts.append(torch.as_tensor(_matrix(loaded["image_features"], path)))
    if len({p.shape[1] for p in parts} | {centroids.shape[1]}) != 1:
        raise FetchError(f"DataComp's assets in {assets[f'{scale}_centroids_l14.pt'].parent} disagree on the "
                         f"embedding width: delete them and rerun")
    imagenet = torch.cat(parts)
    target = dc.imagenet_clusters(imagenet, centroids, chunk)
    return dc.ImageBasedInputs(load_language_model(assets["lid.176.bin"]), fasttext.tokenize, centroids, target,
                               chunk)


# ------------------------------------------------------------------ img2dataset

def expected_shards(list_dir: Path, shard_size: int) -> int:
    """img2dataset shards each input file on its own; shard ids run on across files."""
    import pyarrow.parquet as pq

    return sum(math.ceil(pq.ParquetFile(f).metadata.num_rows / shard_size) for f in sorted(list_dir.glob("*.parquet")))


@contextlib.contextmanager
def _ray_cluster(options: ImageOptions):
    """img2dataset's ray distributor submits to whatever cluster ``ray`` is connected to, and would
    otherwise start one with a dashboard and every core. Connect to ``RAY_ADDRESS`` when it is set
    (a real cluster, left running); else start a local one of ``processes`` CPUs and stop it after."""
    if options.distributor != "ray":
        yield
        return
    import os

    import ray

    if ray.is_initialized():
        yield
        return
    if os.environ.get("RAY_ADDRESS"):
        check_ray_address()
        ray.init(log_to_driver=False)
    else:
        ray.init(num_cpus=options.processes, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


# The warnings filter that quiets multiprocessing's resource tracker on semaphores it removes for stopped workers.
TRACKER_QUIET = "ignore::UserWarning:multiprocessing.resource_tracker"


@contextlib.contextmanager
def _spawned_children_stop_quietly() -> Iterator[None]:
    """img2dataset's pool and logger are fresh Pythons that multiprocessing spawns into this process group: a
    terminal's Ctrl-C reached each, and each printed its KeyboardInterrupt's traceback (or, caught while starting,
    "Fatal Python error") under the command's one line. Each is now started with SIGINT blocked in the thread that
    starts it, a mask that fork and exec keep: Ctrl-C is the command's alone, which then stops them. Stopped, they
    leave the semaphores they held to multiprocessing's resource tracker, which removes them and would warn of
    each as leaked, a second line: the tracker, spawned here too, takes a warnings filter from the environment."""
    import os
    from multiprocessing.context import SpawnProcess

    start, warnings = SpawnProcess.start, os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [warnings, TRACKER_QUIET]))

    def started_without_ctrl_c(process) -> None:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            start(process)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    SpawnProcess.start = started_without_ctrl_c
    try:
        yield
    finally:
        SpawnProcess.start = start
        if warnings is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = warnings


@contextlib.contextmanager
def _spawned_children_temporary_folder() -> Iterator[None]:
    """img2dataset's spawned workers import wandb (for its logger), which makes two temporary folders as it is
    imported and removes them as the interpreter exits, which a multiprocessing worker never does: every download
    left two empty folders in /tmp per worker. The workers get a temporary folder of the command's own (``TMPDIR``,
    which a fresh Python reads), removed with whatever they left once img2dataset returns or stops."""
    import os
    import tempfile

    # mkdtemp settles this process's own temporary folder first (tempfile keeps the first it finds): TMPDIR
    # changes for the children only.
    own, before = tempfile.mkdtemp(prefix="euclip-img2dataset-"), os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = own
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        shutil.rmtree(own, ignore_errors=True)


def run_img2dataset(list_dir: Path, shards_dir: Path, options: ImageOptions, bbox: bool,
                    columns: tuple[str, ...] = ()) -> None:
    """DataComp's img2dataset call, on the selected rows only; ``columns`` of the list beside ``uid`` go
    into each sample's json (RedCaps: its subreddit; GRIT: its boxes)."""
    import os

    # albumentations (imported by img2dataset, here and in every worker) would check PyPI for updates.
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    from img2dataset import download

    if options.spark_master:
        from pyspark.sql import SparkSession

        # img2dataset's pyspark distributor runs on the active session: make it the cluster's.
        SparkSession.builder.master(options.spark_master).appName("euclip-download").getOrCreate()
    # img2dataset answers Ctrl-C with a handler of its own that removes its staging folder and exits with 0, which
    # ended a stopped download as if it had finished; it also leaves that handler in place when it returns.
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    try:
        with _ray_cluster(options), _spawned_children_stop_quietly(), _spawned_children_temporary_folder():
            download(url_list=str(list_dir), input_format="parquet", url_col="url", caption_col="text",
                     save_additional_columns=["uid", *columns], bbox_col="face_bboxes" if bbox else None,
                     output_format="webdataset", output_folder=str(shards_dir), image_size=options.image_size,
                     resize_mode=options.resize_mode, resize_only_if_bigger=True, encode_format="jpg",
                     processes_count=options.processes, thread_count=options.threads,
                     number_sample_per_shard=options.shard_size, oom_shard_count=SHARD_DIGITS,
                     retries=options.retries, timeout=options.timeout, distributor=options.distributor,
                     incremental_mode="incremental", enable_wandb=False)
    except (SystemExit, KeyboardInterrupt) as stop:  # SystemExit: img2dataset's only exit, its Ctrl-C handler
        # Its workers are stopped before the command exits: one still starting would find the semaphores it
        # inherits removed by the exit and print a traceback. Its staging folder goes, as its handler removes it.
        for child in multiprocessing.active_children():
            child.terminate()
        for child in multiprocessing.active_children():
            child.join(timeout=10)
        shutil.rmtree(shards_dir / "_tmp", ignore_errors=True)
        if isinstance(stop, SystemExit):
            raise KeyboardInterrupt from None
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _reason(message: str) -> str:
    # Messages quote object addresses ("<_io.BytesIO object at 0x7f…>"): one reason, not thousands.
    return re.sub(r"0x[0-9a-fA-F]+", "0x…", message)


def summarize(shards_dir: Path, expected: int) -> dict:
    """Counts over img2dataset's ``*_stats.json``: attempted, downloaded, success rate, reasons, bytes."""
    stats = {}
    for path in shards_dir.glob("*_stats.json"):
        stats[int(path.name.split("_")[0])] = read_json(path)
    attempted = sum(s["count"] for s in stats.values())
    downloaded = sum(s["successes"] for s in stats.values())
    reasons: dict[str, int] = {}
    for s in stats.values():
        for message, n in s.get("status_dict", {}).items():
            if message != "success":
                reasons[_reason(message)] = reasons.get(_reason(message), 0) + n
    finished = sorted(shards_dir / f"{i:0{SHARD_DIGITS}d}.tar" for i in stats)
    return {"shards": len(stats), "expected_shards": expected, "attempted": attempted, "downloaded": downloaded,
            "success_rate": downloaded / attempted if attempted else None,
            "failures": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
            "bytes": sum(p.stat().st_size for p in finished if p.exists()),
            "complete": expected > 0 and all(i in stats for i in range(expected))}


def fetch_images(out: Path, manifest: dict, options: ImageOptions, bbox: bool, say: Say,
                 columns: tuple[str, ...] = (), shards: str = SHARDS_DIR, last_stage: bool = True) -> dict:
    """img2dataset's shards of the download list into ``out/<shards>``; the manifest takes their counts and,
    where this is ``last_stage``, whether the download is complete (a later stage, GRIT's boxes, says that)."""
    list_dir, shards_dir = out / LIST_DIR, out / shards
    expected = expected_shards(list_dir, options.shard_size)
    if expected == 0:
        raise FetchError(f"the selection in {list_dir} is empty: nothing to download")
    before = summarize(shards_dir, expected) if shards_dir.exists() else None
    if before is None or not before["complete"]:
        selected = manifest.get("selected", 0)
        free = shutil.disk_usage(out).free
        if selected * BYTES_PER_IMAGE > free:
            say(f"warning: {selected:,} images take about {selected * BYTES_PER_IMAGE / 1e9:.0f} GB at 512 px; "
                f"{free / 1e9:.0f} GB is free under {out}")
        done = before["shards"] if before else 0
        say(f"images: {expected - done} of {expected} shard(s) to fetch with img2dataset ({options.distributor}, "
            f"{options.processes} processes x {options.threads} threads) into {shards_dir}")
        run_img2dataset(list_dir, shards_dir, options, bbox, columns)
    summary = summarize(shards_dir, expected)
    manifest.update(summary)
    manifest["complete"] = summary["complete"] and last_stage
    manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_manifest(out, manifest)
    if summary["attempted"] and not summary["downloaded"]:
        first = next(iter(summary["failures"]), "no reason recorded")
        raise FetchError(f"none of {summary['attempted']:,} images could be downloaded (first reason: {first}); "
                         f"check the network connection and rerun")
    if not summary["complete"]:
        raise FetchError(f"{expected - summary['shards']} of {expected} shard(s) did not finish; rerun the same "
                         f"command to continue (finished shards are kept)")
    return manifest


def check_distributor(options: ImageOptions) -> None:
    """pyspark and ray are not dependencies: say so before any work is done."""
    import importlib.util

    module = options.distributor
    if module != "multiprocessing" and importlib.util.find_spec(module) is None:
        raise UsageError(f"--distributor {module} needs the {module} package: pip install {module}")


# ------------------------------------------------------------------ the two entry points

def datacomp_folder(scale: str, filter_name: Optional[str], uid_file: Optional[Path]) -> Path:
    """Where a DataComp download goes by default: ``data/datacomp-SCALE-FILTER`` (``data.train_dir``'s
    parent for a recipe of that scale and filter), or ``-uids-NAME`` for a subset of one's own."""
    from euclip_cli.data.datacomp import UID_FILE

    name = f"{UID_FILE}-{uid_file.stem}" if uid_file is not None else filter_name or "clip-l14-30"
    return Path("data") / f"datacomp-{scale}-{name}"


def download_datacomp(out: Path, scale: str, filter_name: str, options: ImageOptions, command: str, say: Say,
                      on_progress: OnProgress, on_file: Callable[[str, int, int], None],
                      metadata_dir: Optional[Path] = None, endpoint: Optional[str] = None,
                      assets_dir: Path = ASSET_CACHE, device: str = "cpu", chunk: int = 4096,
                      uid_file: Optional[Path] = None) -> dict:
    """Metadata, the filter (``filter_name``, or the subset in ``uid_file`` when one is given), then
    the selected images; every stage resumable. Returns the manifest."""
    from euclip_cli.data import datacomp as dc

    if scale not in dc.SCALES:
        raise UsageError(f"unknown --scale '{scale}': the paper's DataComp scales are {', '.join(dc.SCALES)}")
    if filter_name not in dc.FILTERS + (dc.UID_FILE,):
        raise UsageError(f"unknown --filter '{filter_name}': choose one of {', '.join(dc.FILTERS)}")
    subset, identity = None, {"source": "datacomp", "scale": scale, "filter": filter_name}
    if uid_file is not None:
        subset = dc.load_uids(uid_file)
        identity.update(filter=dc.UID_FILE, uids_sha256=sha256_of(uid_file))
    check_distributor(options)
    identity.update(options.identity())
    manifest = claim_output(out, identity, command)
    if manifest["complete"]:
        return manifest
    metadata_dir = metadata_dir or out / "metadata"
    image_based = identity["filter"] == "image-based-clip-l14-30"
    if not (out / LIST_DIR / ".complete").exists():
        repo = dc.SCALES[scale].repo
        fetch_metadata(repo, metadata_dir, ["*.parquet"] + (["*.npz"] if image_based else []), endpoint, say)
        inputs = None
        if image_based:
            assets = fetch_assets(dc.assets_for(scale), assets_dir.expanduser(), on_progress)
            inputs = image_based_inputs(scale, assets, device, chunk)
        say(f"filter {identity['filter']}: selecting from {metadata_dir}")
        selection = dc.select(metadata_dir, identity["filter"], inputs, on_file, subset)
        written = dc.write_download_list(metadata_dir, selection, out / LIST_DIR, bbox=options.blur_faces)
        dc.save_uids(selection.uids, out / "uids.npy")
        manifest.update({"pool": selection.pool, "threshold": selection.threshold, "selected": written,
                         "metadata_dir": str(metadata_dir)})
        if subset is not None:
            # As DataComp's resharder warns: uids of the file that the pool does not hold.
            manifest.update(uid_file=str(uid_file), not_in_pool=len(subset) - written,
                            repeated_listings=selection.repeats)
        write_manifest(out, manifest)
        (out / LIST_DIR / ".complete").touch()
        say(f"selected {written:,} of {selection.pool:,} samples ({written / max(selection.pool, 1):.1%}); "
            f"uid file {out / 'uids.npy'}")
        if selection.pool != dc.SCALES[scale].pool:
            say(f"note: DataComp's {scale} pool has {dc.SCALES[scale].pool:,} rows; this metadata has "
                f"{selection.pool:,} (a pool percentile depends on the whole pool)")
    return fetch_images(out, manifest, options, bbox=options.blur_faces, say=say)


def derived_uid(url: str, caption: str) -> str:
    """A 128-bit hex uid for lists that have none, in DataComp's format."""
    return hashlib.sha256(f"{url}\n{caption}".encode()).hexdigest()[:32]


def download_urls(parquet: Path, out: Path, options: ImageOptions, command: str, say: Say,
                  url_col: str = "url", caption_col: str = "caption", uid_col: Optional[str] = None) -> dict:
    """Any url/caption parquet (RedCaps, CC3M, ...) into the same shards and manifest as DataComp's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not parquet.is_file():
        raise UsageError(f"--parquet {parquet} does not exist")
    try:
        names = pq.ParquetFile(parquet).schema_arrow.names
    except (pa.ArrowException, OSError) as err:  # a file that is not parquet, or one cut short
        raise UsageError(f"--parquet {parquet} is not a readable parquet file ({str(err).splitlines()[0][:120]}); "
                         f"give a parquet file of image URLs and captions") from None
    for option, column in (("--url-col", url_col), ("--caption-col", caption_col), ("--uid-col", uid_col)):
        if column is not None and column not in names:
            raise UsageError(f"{option} '{column}' is not a column of {parquet} (columns: {', '.join(names)})")
    check_distributor(options)
    identity = {"source": "urls", "parquet": str(parquet.resolve()), "url_col": url_col, "caption_col": caption_col,
                "uid_col": uid_col, **options.identity()}
    manifest = claim_output(out, identity, command)
    if manifest["complete"]:
        return manifest
    list_dir = out / LIST_DIR
    if not (list_dir / ".complete").exists():
        table = pq.read_table(parquet, columns=[c for c in (url_col, caption_col, uid_col) if c])
        urls = table[url_col].to_pylist()
        captions = ["" if c is None else str(c) for c in table[caption_col].to_pylist()]
        uids = (table[uid_col].to_pylist() if uid_col else [derived_uid(u or "", c) for u, c in zip(urls, captions)])
        list_dir.mkdir(parents=True, exist_ok=True)
        tmp = list_dir / ".00000000.parquet.tmp"
        pq.write_table(pa.table({"url": urls, "text": captions, "uid": uids}), tmp)
        tmp.replace(list_dir / "00000000.parquet")
        manifest.update({"pool": table.num_rows, "selected": table.num_rows})
        write_manifest(out, manifest)
        (list_dir / ".complete").touch()
    return fetch_images(out, manifest, options, bbox=False, say=say)
