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

import hashlib
import http.client
import io
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from euclip_cli.evaluate.tasks import Task

HF_DATASETS = "https://huggingface.co/datasets"
CHUNK = 1 << 20
TIMEOUT_S = 60

# Retrieval sets: clip-benchmark's wds mirrors (DataComp itself loads nlphuji loading-script
# datasets, which current `datasets` releases no longer run).
RETRIEVAL_REPOS = {
    "retrieval/flickr_1k_test_image_text_retrieval": "clip-benchmark/wds_flickr30k",
    "retrieval/mscoco_2014_5k_test_image_text_retrieval": "clip-benchmark/wds_mscoco_captions",
}
# A gated loading-script dataset: a csv of instances and a zip of candidate images.
WINOGAVIL_REPO = "nlphuji/winogavil"
OPTIONAL_FILES = ("classnames.txt", "zeroshot_classification_templates.txt", "dataset_type.txt")


class DownloadError(Exception):
    """A file could not be fetched or failed its check; nothing verified was deleted."""


def repo_for(task: Task) -> str:
    if task.suite != "datacomp":
        raise DownloadError(f"task {task.key} belongs to the embedded world: run 'euclip download world'")
    if task.key in RETRIEVAL_REPOS:
        return RETRIEVAL_REPOS[task.key]
    if task.kind == "winogavil":
        return WINOGAVIL_REPO
    key = task.key.split("/", 1)[1] if task.key.startswith("fairness/") else task.key
    return f"djghosh/wds_{key.replace('/', '-')}_test"


@dataclass
class LfsPointer:
    sha256: str
    size: int


def parse_pointer(text: str) -> Optional[LfsPointer]:
    """The oid and size of a Git LFS pointer file, or None when ``text`` is not one."""
    fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    if not fields.get("version", "").startswith("https://git-lfs") or "oid" not in fields:
        return None
    return LfsPointer(fields["oid"].split(":", 1)[1].strip(), int(fields["size"]))


def _open(url: str, start: int = 0):
    headers = {"Range": f"bytes={start}-"} if start else {}
    if os.environ.get("HF_TOKEN"):  # gated repos (WinoGAViL) need the user's token
        headers["Authorization"] = f"Bearer {os.environ['HF_TOKEN']}"
    request = urllib.request.Request(url, headers=headers)
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise DownloadError(f"{url}: HTTP {err.code}: the repository is gated; accept its terms on Hugging Face "
                                f"and set HF_TOKEN") from None
        raise DownloadError(f"{url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        raise DownloadError(f"could not reach {url} ({getattr(err, 'reason', err)}); check the network "
                            f"connection or --base-url") from None


def fetch_text(url: str) -> str:
    with _open(url) as response:
        return response.read().decode("utf-8")


def fetch_pointer(url: str) -> Optional[LfsPointer]:
    """The LFS pointer served at a ``raw/main`` URL; None when the file is stored in git itself."""
    with _open(url) as response:
        head = response.read(1024)  # a pointer is ~130 bytes; a plain file is not read in full
    try:
        return parse_pointer(head.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_file(url: str, dest: Path, expected: Optional[LfsPointer],
               on_bytes: Callable[[int], None] = lambda n: None) -> None:
    """Download ``url`` to ``dest`` through ``dest.part``, continuing a partial file; verify; rename."""
    part = dest.with_name(dest.name + ".part")
    start = part.stat().st_size if part.exists() else 0
    if expected and start > expected.size:
        part.unlink()
        start = 0
    if not expected or start < expected.size:
        try:
            with _open(url, start) as response:
                mode = "ab" if start and response.status == 206 else "wb"  # 200: the server ignored the range
                if mode == "wb":
                    start = 0
                on_bytes(start)
                with part.open(mode) as f:
                    for block in iter(lambda: response.read(CHUNK), b""):
                        f.write(block)
                        on_bytes(len(block))
        except (OSError, http.client.HTTPException) as err:  # a connection cut mid-file: the .part file stays for the next run
            raise DownloadError(f"{url}: transfer interrupted ({err}); run the same command again to continue") from None
    if expected:
        size = part.stat().st_size
        if size < expected.size:  # the server closed early without an error: keep what came
            raise DownloadError(f"{url}: transfer interrupted at {size} of {expected.size} bytes; "
                                f"run the same command again to continue")
        if size != expected.size or sha256_of(part) != expected.sha256:
            part.unlink()
            raise DownloadError(f"{url}: downloaded file fails its checksum (size {size}, expected {expected.size}); "
                                f"run the same command again")
    os.replace(part, dest)


def is_complete(dest: Path, expected: Optional[LfsPointer], verified_before: bool) -> bool:
    """A final file was checksummed when it was renamed into place; once the task's marker exists,
    its size alone is re-checked (hashing gigabytes on every run would dominate a no-op)."""
    if not dest.exists():
        return False
    if expected is None:
        return True
    if dest.stat().st_size != expected.size:
        return False
    return verified_before or sha256_of(dest) == expected.sha256


def fetch_lfs(repo: str, rel: str, dest: Path, verified_before: bool,
              on_progress: Callable[[str, int, Optional[int]], None]) -> bool:
    """``repo``'s file ``rel`` into ``dest`` unless already there and intact; True when it was fetched."""
    pointer = fetch_pointer(f"{repo}/raw/main/{rel}")
    if is_complete(dest, pointer, verified_before):
        return False
    on_progress(rel, 0, pointer.size if pointer else None)
    fetch_file(f"{repo}/resolve/main/{rel}", dest, pointer, lambda n: on_progress(rel, n, None))
    return True


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
        except DownloadError as err:
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
        raise DownloadError(f"{api}: expected one csv and one zip in {WINOGAVIL_REPO}, found {files}")
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
            raise DownloadError(f"{WINOGAVIL_REPO}: instance {row.ID} names images missing from {zips[0]}: {missing[:3]}")
        lines.append(json.dumps({"id": int(row.ID), "cue": row.cue, "candidates": candidates,
                                 "associations": associations}))
    tmp = marker.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, marker)
    return {"task": "misc/winogavil", "folder": str(folder), "instances": len(lines), "fetched": 1, "present": 0}
