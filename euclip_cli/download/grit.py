"""GRIT (Peng et al., 2023, Kosmos-2: 20.5M grounded image-text pairs from COYO-700M), the data HyCoCLIP trained
on, into the layout of HyCoCLIP's prepared shards, which ``loss.kind = "hycoclip"`` reads.

GRIT is released as metadata only (``grit-20m/coyo_{0..20}_snappy.parquet`` in the Hub's dataset ``zzliang/GRIT``):
per pair its url, caption, COYO ``id``, and the caption's noun chunks and referring expressions, each
``[start, end, x_min, y_min, x_max, y_max, score]`` with the box in fractions of the image. Stages, each kept
when finished, so the same command continues:

1. metadata: those files through huggingface_hub into ``OUT/metadata/`` (``parts``: the first N of the 21);
2. download list: url, caption, the COYO id as uid, and both span lists (JSON text) into each sample's json;
3. images: img2dataset into ``OUT/raw/`` with GRIT's own settings (its dataset card's command: the shortest side
   at most 256, never enlarged), DataComp's retries and shard size otherwise;
4. boxes: each raw shard into ``OUT/shards/`` as HyCoCLIP's ``utils/prepare_GRIT_webdataset.py`` prepares it.
   Per sample, the noun chunks and then the referring expressions: the phrase is the caption's characters
   ``[start, end)``; a phrase already taken is skipped; the box in pixels is each fraction times the image's
   width or height, truncated; a box of at most 32 x 32 pixels of area is dropped; the crop is scaled so its
   longest side is 224 and padded white to 224 x 224 (img2dataset's resize mode "border", whose resizer
   HyCoCLIP's script copies). The sample's own image is scaled and padded the same way. A sample left without
   a box is dropped, as HyCoCLIP's script drops it. The files are ``KEY.jpg``, ``KEY.txt`` and ``KEY.json``
   (img2dataset's names, which euclip's loader reads; HyCoCLIP's script renames the first two ``child.*``),
   ``KEY.numparents.txt`` and ``KEY.parentNNN.jpg`` / ``KEY.parentNNN.txt`` per box, as the embedded world
   writes them.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Optional

from euclip_cli.data.fetch import FetchError
from euclip_cli.download.webshards import (LIST_DIR, RAW_DIR, SHARD_DIGITS, SHARDS_DIR, ImageOptions, Say,
                                       check_distributor, claim_output, fetch_images, fetch_metadata,
                                       write_manifest)
from euclip_cli.errors import UsageError
from euclip_cli.rundir import read_json
from euclip_cli.workers import worker_pool

REPO = "zzliang/GRIT"
PARTS = 21  # coyo_0 ... coyo_20
# The dataset card's img2dataset command: --image_size 256 --resize_mode keep_ratio --resize_only_if_bigger.
IMAGE_SIZE, RESIZE_MODE = 256, "keep_ratio"
# The sample's json keeps its spans for the box stage.
COLUMNS = ("noun_chunks", "ref_exps")
# HyCoCLIP's preparation: boxes of at most this many pixels are dropped; crops and images go to this square.
MIN_BOX_AREA = 32 * 32
BOX_SIDE = 224
JPEG_QUALITY = 95
# What cutting a shard counts: pairs read, pairs kept with a box, boxes, pairs that could not be read.
COUNTS = ("samples", "with_boxes", "boxes", "unreadable")


def part_file(i: int) -> str:
    return f"grit-20m/coyo_{i}_snappy.parquet"


def grit_options(options: ImageOptions) -> ImageOptions:
    """img2dataset's settings for GRIT: its dataset card's image size and resize mode, the rest as given;
    GRIT carries no face boxes to blur."""
    return replace(options, image_size=IMAGE_SIZE, resize_mode=RESIZE_MODE, blur_faces=False)


def download_list(metadata: Path, parts: int, list_dir: Path) -> int:
    """One download-list file per metadata part (url, text, uid, and the spans as JSON text); returns the rows.
    A file that is not GRIT's metadata is a ``FetchError`` naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    list_dir.mkdir(parents=True, exist_ok=True)
    rows = 0
    for i in range(parts):
        source = metadata / part_file(i)
        try:
            table = pq.read_table(source, columns=["id", "url", "caption", *COLUMNS])
        except (OSError, pa.ArrowException, KeyError) as err:
            raise FetchError(f"{source} is not GRIT's metadata ({str(err).splitlines()[0]}): delete it and rerun "
                             f"to fetch it again") from None
        listing = pa.table({"url": table["url"], "text": table["caption"],
                            "uid": pa.array([str(v) for v in table["id"].to_pylist()]),
                            **{c: pa.array([json.dumps(v) for v in table[c].to_pylist()]) for c in COLUMNS}})
        tmp = list_dir / f".{i:08d}.parquet.tmp"
        pq.write_table(listing, tmp)
        tmp.replace(list_dir / f"{i:08d}.parquet")
        rows += len(listing)
    return rows


def _resizer():
    import os

    # albumentations (imported by img2dataset) would check PyPI for updates.
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    from img2dataset.resizer import Resizer

    return Resizer(BOX_SIDE, "border", resize_only_if_bigger=False, encode_quality=JPEG_QUALITY)


def _letterboxed(resizer, image) -> bytes:
    """``image`` (PIL, RGB) scaled to a longest side of 224 and padded white to 224 x 224, as JPEG."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")  # lossless on the way into the resizer, which decodes what it is given
    buffer.seek(0)
    data, *_, error = resizer(buffer)
    if error is not None:
        raise ValueError(error)
    return data


def phrase_boxes(caption: str, spans: list[list[float]], width: int, height: int) -> list[tuple[tuple[int, ...], str]]:
    """HyCoCLIP's boxes of one sample: ``spans`` (its noun chunks, then its referring expressions, each
    ``[start, end, x0, y0, x1, y1, score]``) as ``((x0, y0, x1, y1) in pixels, phrase)``, a phrase taken once,
    boxes of at most ``MIN_BOX_AREA`` pixels dropped."""
    taken: list[str] = []
    boxes = []
    for span in spans:
        phrase = caption[int(span[0]):int(span[1])]
        if phrase in taken:
            continue
        taken.append(phrase)
        # int() truncates as HyCoCLIP's script does; the score (last) is not used.
        box = (int(span[2] * width), int(span[3] * height), int(span[4] * width), int(span[5] * height))
        if (box[2] - box[0]) * (box[3] - box[1]) > MIN_BOX_AREA:
            boxes.append((box, phrase))
    return boxes


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def cut_boxes(raw: Path, out: Path) -> dict:
    """One raw shard into its shard of boxes (written whole, then renamed); returns its counts."""
    from PIL import Image

    resizer = _resizer()
    counts = dict.fromkeys(COUNTS, 0)
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(raw) as tar:
        for member in tar.getmembers():
            if member.isfile():
                key, _, ext = member.name.partition(".")
                samples.setdefault(key, {})[ext] = tar.extractfile(member).read()
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w") as tar:
        for key, files in samples.items():
            if "jpg" not in files or "json" not in files:
                continue  # img2dataset writes a failed sample's json (and parquet row) only
            counts["samples"] += 1
            try:
                meta = json.loads(files["json"])
                caption = files["txt"].decode("utf-8")
                spans = [span for column in COLUMNS for span in json.loads(meta[column] or "[]")]
                image = Image.open(io.BytesIO(files["jpg"])).convert("RGB")
                boxes = [(_letterboxed(resizer, image.crop(box)), phrase)
                         for box, phrase in phrase_boxes(caption, spans, *image.size)]
                whole = _letterboxed(resizer, image)
            except (ValueError, KeyError, OSError, TypeError, IndexError):
                counts["unreadable"] += 1
                continue
            if not boxes:
                continue
            counts["with_boxes"] += 1
            counts["boxes"] += len(boxes)
            for ext, data in (("jpg", whole), ("txt", files["txt"]), ("json", files["json"]),
                              ("numparents.txt", str(len(boxes)).encode())):
                _add(tar, f"{key}.{ext}", data)
            for i, (data, phrase) in enumerate(boxes):
                _add(tar, f"{key}.parent{i:03d}.jpg", data)
                _add(tar, f"{key}.parent{i:03d}.txt", phrase.encode("utf-8"))
    tmp.replace(out)
    out.with_name(f"{out.stem}_boxes.json").write_text(json.dumps(counts))
    return counts


def cut_all(out: Path, processes: int, say: Say) -> dict:
    """Every raw shard not yet cut, ``processes`` at a time; returns the counts over all shards."""
    raw_dir, shards_dir = out / RAW_DIR, out / SHARDS_DIR
    shards_dir.mkdir(exist_ok=True)
    raws = sorted(raw_dir.glob(f"{'[0-9]' * SHARD_DIGITS}.tar"))
    todo = [(raw, shards_dir / raw.name) for raw in raws if not (shards_dir / f"{raw.stem}_boxes.json").exists()]
    if todo:
        say(f"boxes: cutting {len(todo)} of {len(raws)} shard(s) into {shards_dir}, as HyCoCLIP prepares GRIT")
        if processes > 1 and len(todo) > 1:
            with worker_pool(processes, len(todo)) as pool:
                list(pool.map(cut_boxes, *zip(*todo)))
        else:
            for raw, shard in todo:
                cut_boxes(raw, shard)
    totals = dict.fromkeys(COUNTS, 0)
    for raw in raws:
        for k, v in read_json(shards_dir / f"{raw.stem}_boxes.json").items():
            totals[k] += v
    return totals


def download_grit(out: Path, options: ImageOptions, command: str, say: Say, parts: int = PARTS,
                  endpoint: Optional[str] = None) -> dict:
    """GRIT's metadata, images and boxes into ``out`` (a rerun continues; a finished one does nothing).
    ``parts``: the first N of its 21 metadata files, for a smaller download (each about 1M pairs)."""
    if not 1 <= parts <= PARTS:
        raise UsageError(f"--parts {parts}: GRIT has {PARTS} metadata files; give 1 to {PARTS}")
    options = grit_options(options)
    check_distributor(options)
    identity = {"source": "grit", "repo": REPO, "parts": parts, **options.identity()}
    manifest = claim_output(out, identity, command)
    if manifest["complete"]:
        return manifest
    fetch_metadata(REPO, out / "metadata", [part_file(i) for i in range(parts)], endpoint, say,
                   hint="check --hub-url (GRIT's metadata is grit-20m/coyo_N_snappy.parquet)")
    list_dir = out / LIST_DIR
    if not (list_dir / ".complete").exists():
        rows = download_list(out / "metadata", parts, list_dir)
        if not rows:
            raise FetchError(f"GRIT's metadata in {out / 'metadata'} holds no pairs: delete it and rerun")
        manifest.update({"pool": rows, "selected": rows})
        write_manifest(out, manifest)
        (list_dir / ".complete").touch()
    fetch_images(out, manifest, options, bbox=False, say=say, columns=COLUMNS, shards=RAW_DIR, last_stage=False)
    manifest["boxes"] = cut_all(out, options.processes, say)
    manifest["complete"] = True
    write_manifest(out, manifest)
    return manifest
