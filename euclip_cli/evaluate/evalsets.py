"""Fetch DataComp's evaluation sets (clip-benchmark ``wds`` layout) from Hugging Face dataset repos.

The same files DataComp's ``download_evalsets.py`` fetches: ``classnames.txt``,
``zeroshot_classification_templates.txt`` (and ``dataset_type.txt`` where a repo has one),
``test/nshards.txt`` and ``test/{i}.tar``. Each tar is checked against its Git LFS pointer (size and sha256), downloaded into a ``.part`` file that
an interrupted run continues with an HTTP range request, and renamed only once verified.
``test/nshards.txt`` is written last, so a task folder with it is complete.

Written with urllib rather than ``huggingface_hub``: the files are addressed by the plain
``resolve/main`` and ``raw/main`` URLs DataComp uses, which any HTTP server can serve, so the
downloader is tested offline against one on 127.0.0.1.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Callable, Optional

from euclip_cli.data.fetch import HF_DATASETS, FetchError, fetch_lfs, fetch_text
from euclip_cli.errors import UsageError
from euclip_cli.evaluate.tasks import Task

# Retrieval sets: clip-benchmark's wds mirrors (DataComp itself loads nlphuji loading-script
# datasets, which current `datasets` releases no longer run).
RETRIEVAL_REPOS = {
    "retrieval/flickr_1k_test_image_text_retrieval": "clip-benchmark/wds_flickr30k",
    "retrieval/mscoco_2014_5k_test_image_text_retrieval": "clip-benchmark/wds_mscoco_captions",
}
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
                  on_progress: Callable[[str, int, Optional[int]], None] = lambda name, n, total: None) -> dict:
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
            if "HTTP 404" in str(err):  # retrieval repos have no class names or templates
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


def download_winogavil(folder: Path, base_url: str = HF_DATASETS,
                       on_progress: Callable[[str, int, Optional[int]], None] = lambda name, n, total: None) -> dict:
    """WinoGAViL's instances and images as ``instances.jsonl`` + ``images/NAME.jpg`` (DataComp loads the
    same repo through its loading script, which current ``datasets`` releases no longer run).

    The repo's files are listed through the Hub API (its csv and its image zip); ``instances.jsonl``
    is written last, so a folder with it is complete.
    """
    import json
    import zipfile

    import pandas as pd

    marker = folder / "instances.jsonl"
    if marker.exists():
        return {"task": "misc/winogavil", "folder": str(folder), "fetched": 0, "present": 1}
    api = f"{base_url.rstrip('/').removesuffix('/datasets')}/api/datasets/{WINOGAVIL_REPO}"
    files = [s["rfilename"] for s in json.loads(fetch_text(api)).get("siblings", [])]
    csvs, zips = [f for f in files if f.endswith(".csv")], [f for f in files if f.endswith(".zip")]
    if len(csvs) != 1 or len(zips) != 1:
        raise FetchError(f"{api}: expected one csv and one zip in {WINOGAVIL_REPO}, found {files}")
    repo = f"{base_url.rstrip('/')}/{WINOGAVIL_REPO}"
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / zips[0]
    fetch_lfs(repo, zips[0], archive, False, on_progress)
    images = folder / "images"
    images.mkdir(exist_ok=True)
    with zipfile.ZipFile(archive) as z:
        for member in z.namelist():
            if member.lower().endswith(".jpg"):
                (images / Path(member).name).write_bytes(z.read(member))
    table = pd.read_csv(io.StringIO(fetch_text(f"{repo}/resolve/main/{csvs[0]}")))
    lines = []
    for row in table.itertuples():
        candidates, associations = json.loads(row.candidates), json.loads(row.associations)
        missing = [c for c in candidates if not (images / f"{c}.jpg").exists()]
        if missing:
            raise FetchError(f"{WINOGAVIL_REPO}: instance {row.ID} names images missing from {zips[0]}: {missing[:3]}")
        lines.append(json.dumps({"id": int(row.ID), "cue": row.cue, "candidates": candidates,
                                 "associations": associations}))
    tmp = marker.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, marker)
    return {"task": "misc/winogavil", "folder": str(folder), "instances": len(lines), "fetched": 1, "present": 0}
