"""Fetch DataComp's evaluation sets (clip-benchmark ``wds`` layout) from Hugging Face dataset repos.

The same files DataComp's ``download_evalsets.py`` fetches: ``classnames.txt``,
``zeroshot_classification_templates.txt`` (and ``dataset_type.txt`` where a repo has one),
``test/nshards.txt`` and ``test/{i}.tar``. Each tar is checked against its Git LFS pointer (size and sha256), downloaded into a ``.part`` file that
an interrupted run continues with an HTTP range request, and renamed only once verified.
``test/nshards.txt`` is written last, so a task folder with it is complete.

Three tasks DataComp loads from nlphuji's loading-script datasets (which current ``datasets``
releases no longer run) are fetched from the same repos as their csv and image zip and converted
here: Flickr30k and MSCOCO retrieval into the ``wds`` retrieval layout, WinoGAViL into
``instances.jsonl`` and ``images/``.

Written with urllib rather than ``huggingface_hub``: the files are addressed by the plain
``resolve/main`` and ``raw/main`` URLs DataComp uses, which any HTTP server can serve, so the
downloader is tested offline against one on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Callable, Optional

from euclip_cli.data.fetch import FetchError, check_hub_environment, fetch_lfs, fetch_text
from euclip_cli.errors import UsageError
from euclip_cli.protocol.tasks import Task

# Where DataComp's evaluation sets are hosted (clip-benchmark's Hugging Face datasets).
HF_DATASETS = "https://huggingface.co/datasets"

OnProgress = Callable[[str, int, Optional[int]], None]
# DataComp's retrieval sets (its eval_utils/retr_eval.py loads f"nlphuji/{name}", split "test"):
# Karpathy's test splits, a csv of file names and caption lists beside a zip of the images.
RETRIEVAL_REPOS = {
    "retrieval/flickr_1k_test_image_text_retrieval": "nlphuji/flickr_1k_test_image_text_retrieval",
    "retrieval/mscoco_2014_5k_test_image_text_retrieval": "nlphuji/mscoco_2014_5k_test_image_text_retrieval",
}
RETRIEVAL_PER_SHARD = 1000
SOURCE_FILE = "source.txt"  # the repo a converted folder came from
# A gated loading-script dataset: a csv of instances and a zip of candidate images.
WINOGAVIL_REPO = "nlphuji/winogavil"
OPTIONAL_FILES = ("classnames.txt", "zeroshot_classification_templates.txt", "dataset_type.txt")


def repo_for(task: Task) -> str:
    if task.suite != "datacomp":
        raise UsageError(f"task {task.key} belongs to the embedded world: run 'euclip download world'")
    if task.key in RETRIEVAL_REPOS:
        return RETRIEVAL_REPOS[task.key]
    if task.kind == "winogavil":
        return WINOGAVIL_REPO
    key = task.key.split("/", 1)[1] if task.key.startswith("fairness/") else task.key
    return f"djghosh/wds_{key.replace('/', '-')}_test"


def download_task(task: Task, folder: Path, base_url: str = HF_DATASETS,
                  on_progress: OnProgress = lambda name, n, total: None) -> dict:
    """Fetch one task into ``folder``; returns counts of files fetched and already present."""
    repo = f"{base_url.rstrip('/')}/{repo_for(task)}"
    marker = folder / "test" / "nshards.txt"
    (folder / "test").mkdir(parents=True, exist_ok=True)
    fetched, present = 0, 0
    for name in OPTIONAL_FILES:
        dest = folder / name
        if dest.exists():
            present += 1
            continue
        try:
            text = fetch_text(f"{repo}/resolve/main/{name}")
        except FetchError as err:
            if "HTTP 404" in str(err):  # not every repo has all three
                continue
            raise
        dest.write_text(text)
        fetched += 1
    nshards = int(fetch_text(f"{repo}/resolve/main/test/nshards.txt").strip())
    for i in range(nshards):
        rel = f"test/{i}.tar"
        if fetch_lfs(repo, rel, folder / rel, marker.exists(), on_progress):
            fetched += 1
        else:
            present += 1
    if not marker.exists():
        marker.write_text(f"{nshards}\n")
    return {"task": task.key, "folder": str(folder), "shards": nshards, "fetched": fetched, "present": present}


def download(task: Task, folder: Path, base_url: str = HF_DATASETS,
             on_progress: OnProgress = lambda name, n, total: None) -> dict:
    """Fetch ``task`` into ``folder`` in the layout the evaluator reads; returns what was done."""
    check_hub_environment()  # before any folder is made: a token that cannot be sent is the user's to fix
    if task.kind == "winogavil":
        return download_winogavil(folder, base_url, on_progress)
    if task.key in RETRIEVAL_REPOS:
        return download_retrieval(task, folder, base_url, on_progress)
    return download_task(task, folder, base_url, on_progress)


def repo_files(repo_id: str, base_url: str) -> list[str]:
    """The files of dataset repo ``repo_id``, from the Hub API's listing."""
    api = f"{base_url.rstrip('/').removesuffix('/datasets')}/api/datasets/{repo_id}"
    try:
        return [s["rfilename"] for s in json.loads(fetch_text(api)).get("siblings", [])]
    except (json.JSONDecodeError, AttributeError, TypeError, KeyError):  # a page or a proxy's, not the Hub's
        raise FetchError(f"{api} did not answer with the Hub's file listing; check --base-url") from None


def _csv_and_zip(repo_id: str, folder: Path, base_url: str, on_progress: OnProgress) -> tuple[str, Path]:
    """The one csv (as text) and the one zip (fetched into ``folder``, checksummed) of a loading-script repo,
    found through the Hub API's file listing."""
    files = repo_files(repo_id, base_url)
    csvs, zips = [f for f in files if f.endswith(".csv")], [f for f in files if f.endswith(".zip")]
    if len(csvs) != 1 or len(zips) != 1:
        raise FetchError(f"{base_url}: expected one csv and one zip in {repo_id}, found {files}")
    repo = f"{base_url.rstrip('/')}/{repo_id}"
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / zips[0]
    fetch_lfs(repo, zips[0], archive, False, on_progress)
    return fetch_text(f"{repo}/resolve/main/{csvs[0]}"), archive


# An evaluation image is at most a few MB: a member that declares more is not one (a damaged archive, or
# one built to exhaust memory), and none is read past what it declares.
MEMBER_BYTES = 64 * 2 ** 20


@contextlib.contextmanager
def open_zip(archive: Path):
    """The fetched archive, read as untrusted: damage anywhere in it (not a zip, a member whose bytes fail
    its CRC or differ from its declared size) is one FetchError naming the file; members are read by
    ``read_member`` and written under names of their own, never the paths the archive gives."""
    try:
        with zipfile.ZipFile(archive) as z:
            yield z
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise FetchError(f"{archive} is damaged ({err}): delete it and rerun to fetch it again") from None


def read_member(z: zipfile.ZipFile, member: str) -> bytes:
    """One member's bytes, no more than it declares and no more than ``MEMBER_BYTES``."""
    info = z.getinfo(member)
    if info.file_size > MEMBER_BYTES:
        raise FetchError(f"{z.filename}: {member} declares {info.file_size:,} bytes, more than any evaluation image "
                         f"({MEMBER_BYTES:,}): the archive is not DataComp's; delete it and rerun")
    with z.open(info) as f:
        data = f.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise FetchError(f"{z.filename}: {member} holds other than the {info.file_size:,} bytes it declares: "
                         f"the archive is damaged; delete it and rerun")
    return data


def retrieval_rows(table, images: dict[str, str]) -> list[tuple[str, list[str]]]:
    """``(zip member, captions)`` per csv row, in the csv's order, as DataComp's loader yields them
    (``image`` from the row's ``filename``, ``caption`` the JSON list in its ``raw`` column).

    A caption's own line breaks become spaces: the ``wds`` layout stores one caption per line."""
    missing = {"filename", "raw"} - set(table.columns)
    if missing:
        raise FetchError(f"the retrieval csv lacks column(s) {sorted(missing)} (has {list(table.columns)})")
    rows = []
    for row in table.itertuples():
        member = images.get(Path(row.filename).name)
        if member is None:
            raise FetchError(f"the retrieval csv names {row.filename}, which its image zip does not hold")
        captions = [" ".join(str(c).split()) for c in json.loads(row.raw)]
        if not captions or not all(captions):
            raise FetchError(f"the retrieval csv gives {row.filename} an empty caption list or an empty caption")
        rows.append((member, captions))
    return rows


def download_retrieval(task: Task, folder: Path, base_url: str = HF_DATASETS,
                       on_progress: OnProgress = lambda name, n, total: None) -> dict:
    """DataComp's Flickr30k or MSCOCO retrieval set, converted to clip-benchmark's ``wds`` retrieval
    layout: ``test/{i}.tar`` of ``KEY.jpg`` (the zip's bytes, unchanged) and ``KEY.txt`` (the captions,
    one per line), ``dataset_type.txt`` = retrieval, and ``test/nshards.txt`` written last."""
    import pandas as pd
    import webdataset as wds

    repo_id = repo_for(task)
    marker, source = folder / "test" / "nshards.txt", folder / SOURCE_FILE
    if marker.exists():
        held = source.read_text().strip() if source.exists() else "another source (an earlier euclip's mirror)"
        if held != repo_id:
            raise UsageError(f"{folder} holds {task.key} from {held}, not DataComp's {repo_id}: move or delete "
                             f"the folder and rerun")
        return {"task": task.key, "folder": str(folder), "shards": int(marker.read_text()), "fetched": 0, "present": 1}
    text, archive = _csv_and_zip(repo_id, folder, base_url, on_progress)
    with open_zip(archive) as z:
        images = {Path(m).name: m for m in z.namelist() if m.lower().endswith((".jpg", ".jpeg"))}
        rows = retrieval_rows(pd.read_csv(io.StringIO(text)), images)
        (folder / "test").mkdir(parents=True, exist_ok=True)
        with wds.ShardWriter(str(folder / "test" / "%d.tar"), maxcount=RETRIEVAL_PER_SHARD, verbose=0) as sink:
            for i, (member, captions) in enumerate(rows):
                sink.write({"__key__": f"s{i:06d}", "jpg": read_member(z, member), "txt": "\n".join(captions)})
    shards = -(-len(rows) // RETRIEVAL_PER_SHARD)
    (folder / "dataset_type.txt").write_text("retrieval\n")
    source.write_text(repo_id + "\n")
    marker.write_text(f"{shards}\n")
    return {"task": task.key, "folder": str(folder), "shards": shards, "images": len(rows),
            "captions": sum(len(c) for _, c in rows), "fetched": 1, "present": 0}


def download_winogavil(folder: Path, base_url: str = HF_DATASETS,
                       on_progress: OnProgress = lambda name, n, total: None) -> dict:
    """WinoGAViL's instances and images as ``instances.jsonl`` + ``images/NAME.jpg`` (DataComp loads the
    same repo through its loading script).

    The repo's files are listed through the Hub API (its csv and its image zip); ``instances.jsonl``
    is written last, so a folder with it is complete.
    """
    import pandas as pd

    marker = folder / "instances.jsonl"
    if marker.exists():
        return {"task": "misc/winogavil", "folder": str(folder), "fetched": 0, "present": 1}
    text, archive = _csv_and_zip(WINOGAVIL_REPO, folder, base_url, on_progress)
    images = folder / "images"
    images.mkdir(exist_ok=True)
    with open_zip(archive) as z:
        for member in z.namelist():
            if member.lower().endswith(".jpg"):
                (images / Path(member).name).write_bytes(read_member(z, member))
    table = pd.read_csv(io.StringIO(text))
    lines = []
    for row in table.itertuples():
        candidates, associations = json.loads(row.candidates), json.loads(row.associations)
        missing = [c for c in candidates if not (images / f"{c}.jpg").exists()]
        if missing:
            raise FetchError(f"{WINOGAVIL_REPO}: instance {row.ID} names images missing from {archive.name}: {missing[:3]}")
        lines.append(json.dumps({"id": int(row.ID), "cue": row.cue, "candidates": candidates,
                                 "associations": associations}))
    tmp = marker.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, marker)
    return {"task": "misc/winogavil", "folder": str(folder), "instances": len(lines), "fetched": 1, "present": 0}
