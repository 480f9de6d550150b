"""SugarCrepe's and Winoground's evaluation sets, written where the evaluator reads them offline.

SugarCrepe (Hsieh et al., NeurIPS 2023): seven JSON files of (COCO val2017 image, caption, negative caption)
from the authors' repository, and COCO's val2017 images. clip-benchmark's builder reads ``ROOT/{split}.json``
and ``ROOT/val2017/`` and runs wget only for what is missing; this writes both, keeping of COCO's 5,000
images those the splits name (the zip, 778 MB, is deleted once they are out).

Winoground (Thrush et al., CVPR 2022) is gated on the Hub (``facebook/winoground``): its examples and images
become ``examples.jsonl`` and ``images/``, read by ``evaluate.selection.WinogroundSet``. The repository has
kept them as ``data/examples.jsonl`` with ``data/images.zip``, and as parquet; either is read.

Every file goes through ``data.fetch`` (resumable ``.part`` files, checksums where the Hub gives them), and
each folder's marker (the split files, ``examples.jsonl``) is written last, so a folder with it is complete.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Optional

from euclip_cli.data.fetch import FetchError, check_hub_environment, fetch_file, fetch_lfs, fetch_text
from euclip_cli.evaluate.evalsets import open_zip, read_member, repo_files
from euclip_cli.data.world_tasks import NEGATIVE_KINDS
from euclip_cli.rundir import write_text_atomic

SUGARCREPE_URL = "https://raw.githubusercontent.com/RAIVNLab/sugar-crepe/main/data"  # clip-benchmark's source
COCO_VAL2017_URL = "http://images.cocodataset.org/zips/val2017.zip"
WINOGROUND_REPO = "facebook/winoground"
WINOGROUND_PAGE = f"https://huggingface.co/datasets/{WINOGROUND_REPO}"
# The layouts written here, which the readers (evaluate.selection) and runner.has_data take.
SUGARCREPE_IMAGES = "val2017"  # COCO's val2017 images, where clip-benchmark's builder looks for them
WINOGROUND_EXAMPLES = "examples.jsonl"
WINOGROUND_IMAGES = "images"

OnProgress = Callable[[str, int, Optional[int]], None]


def sugar_crepe_pairs(name: str, text: str) -> dict:
    """One split's annotation file, checked: ``{id: {filename, caption, negative_caption}}``."""
    try:
        pairs = json.loads(text)
    except json.JSONDecodeError as err:
        raise FetchError(f"SugarCrepe's {name} is not JSON ({err}); check --sugarcrepe-url") from None
    fields = ("filename", "caption", "negative_caption")
    if not isinstance(pairs, dict) or not pairs or not all(
            isinstance(p, dict) and all(isinstance(p.get(f), str) and p[f] for f in fields) for p in pairs.values()):
        raise FetchError(f"SugarCrepe's {name} is not a non-empty map of pairs with {', '.join(fields)}; "
                         f"check --sugarcrepe-url")
    return pairs


def download_sugar_crepe(folder: Path, annotations_url: str = SUGARCREPE_URL, coco_url: str = COCO_VAL2017_URL,
                         on_progress: OnProgress = lambda name, n, total: None) -> dict:
    """The seven splits' files and the COCO images they name into ``folder``; returns what was done."""
    names = [f"{split}.json" for split in NEGATIVE_KINDS]
    images = folder / SUGARCREPE_IMAGES
    if images.is_dir() and all((folder / n).exists() for n in names):
        return {"task": "sugar_crepe", "folder": str(folder), "fetched": 0, "present": 1}
    texts = {n: fetch_text(f"{annotations_url.rstrip('/')}/{n}") for n in names}
    pairs = {n: sugar_crepe_pairs(n, text) for n, text in texts.items()}
    wanted = sorted({p["filename"] for split in pairs.values() for p in split.values()})
    folder.mkdir(parents=True, exist_ok=True)
    if not images.is_dir():
        archive = folder / Path(coco_url).name
        if not archive.exists():
            on_progress(archive.name, 0, None)
            fetch_file(coco_url, archive, None, lambda n: on_progress(archive.name, n, None))
        staging = folder / (SUGARCREPE_IMAGES + ".part")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        with open_zip(archive) as z:
            members = {Path(m).name: m for m in z.namelist() if not m.endswith("/")}
            missing = [name for name in wanted if name not in members]
            if missing:
                raise FetchError(f"{archive} lacks {len(missing)} image(s) SugarCrepe names ({', '.join(missing[:3])}): "
                                 f"delete it and rerun, or check --coco-url")
            for name in wanted:
                (staging / name).write_bytes(read_member(z, members[name]))
        os.replace(staging, images)
        archive.unlink()
    absent = [name for name in wanted if not (images / name).exists()]
    if absent:
        raise FetchError(f"{images} lacks {len(absent)} image(s) SugarCrepe names ({', '.join(absent[:3])}): "
                         f"delete the folder and rerun")
    for n, text in texts.items():  # the markers, last
        write_text_atomic(folder / n, text)
    return {"task": "sugar_crepe", "folder": str(folder), "pairs": sum(len(p) for p in pairs.values()),
            "images": len(wanted), "fetched": 1, "present": 0}


def winoground_rows(rows: list[dict]) -> list[dict]:
    """The fields the reader needs from each example, checked: id, caption_0/1, image_0/1 (names)."""
    fields = ("id", "caption_0", "caption_1", "image_0", "image_1")
    bad = [r for r in rows if not isinstance(r, dict) or not all(r.get(f) not in (None, "") for f in fields)]
    if bad or not rows:
        raise FetchError(f"{WINOGROUND_REPO}: {len(bad) if rows else 'no'} example(s) lack one of {', '.join(fields)}")
    return [{f: r[f] for f in fields} for r in rows]


def download_winoground(folder: Path, base_url: str, on_progress: OnProgress = lambda name, n, total: None) -> dict:
    """Winoground's examples and images into ``folder``; the repository's files are found through the Hub API."""
    marker = folder / WINOGROUND_EXAMPLES
    if marker.exists():
        return {"task": "winoground", "folder": str(folder), "fetched": 0, "present": 1}
    if not (os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")):
        raise FetchError(f"Winoground is gated on the Hub: accept its terms at {WINOGROUND_PAGE}, then set HF_TOKEN "
                         f"to a token of that account")
    check_hub_environment()
    files = repo_files(WINOGROUND_REPO, base_url)
    repo = f"{base_url.rstrip('/')}/{WINOGROUND_REPO}"
    images = folder / WINOGROUND_IMAGES
    images.mkdir(parents=True, exist_ok=True)
    if "data/examples.jsonl" in files and "data/images.zip" in files:
        url = f"{repo}/resolve/main/data/examples.jsonl"
        try:
            rows = [json.loads(line) for line in fetch_text(url).splitlines() if line.strip()]
        except json.JSONDecodeError as err:
            raise FetchError(f"{url} is not JSON lines ({err}); check --base-url") from None
        rows = winoground_rows(rows)
        archive = folder / "images.zip"
        fetch_lfs(repo, "data/images.zip", archive, False, on_progress)
        with open_zip(archive) as z:
            members = {Path(m).stem: m for m in z.namelist() if not m.endswith("/")}
            for row in rows:
                for k in ("image_0", "image_1"):
                    if row[k] not in members:
                        raise FetchError(f"{archive} lacks {row[k]}, which example {row['id']} names: delete it and rerun")
                    name = Path(members[row[k]]).name
                    (images / name).write_bytes(read_member(z, members[row[k]]))
                    row[k] = name
        archive.unlink()
    else:
        parquets = sorted(f for f in files if f.startswith("data/") and f.endswith(".parquet"))
        if not parquets:
            raise FetchError(f"{base_url}: neither data/examples.jsonl with data/images.zip nor parquet files in "
                             f"{WINOGROUND_REPO} ({', '.join(files[:8])})")
        rows = []
        for rel in parquets:
            dest = folder / Path(rel).name
            fetch_lfs(repo, rel, dest, False, on_progress)
            rows += _parquet_rows(dest, images)
            dest.unlink()
        rows = winoground_rows(rows)
    write_text_atomic(marker, "".join(json.dumps(row) + "\n" for row in rows))
    return {"task": "winoground", "folder": str(folder), "instances": len(rows), "fetched": 1, "present": 0}


def _parquet_rows(path: Path, images: Path) -> list[dict]:
    """A parquet file's examples, each image (the ``datasets`` Image feature: ``{bytes, path}``) written to
    ``images`` as ``ex_{id}_img_{k}.png`` and named in its row."""
    import pyarrow.parquet as pq
    from PIL import Image, UnidentifiedImageError

    try:
        table = pq.read_table(path).to_pylist()
    except Exception as err:  # noqa: BLE001 (pyarrow raises several kinds for a damaged file)
        raise FetchError(f"{path} is not a readable parquet file ({err}): rerun to fetch it again") from None
    rows = []
    for row in table:
        for k in (0, 1):
            cell = row.get(f"image_{k}")
            if not isinstance(cell, dict) or not cell.get("bytes"):
                raise FetchError(f"{path}: example {row.get('id')} has no image_{k} bytes")
            name = f"ex_{row['id']}_img_{k}.png"
            try:  # written as PNG whatever the source's format, so the name says what the file is
                Image.open(io.BytesIO(cell["bytes"])).save(images / name, format="PNG")
            except (UnidentifiedImageError, OSError) as err:
                raise FetchError(f"{path}: example {row.get('id')}'s image_{k} is not an image ({err})") from None
            row[f"image_{k}"] = name
        rows.append(row)
    return rows
