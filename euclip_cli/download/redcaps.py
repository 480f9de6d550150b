"""RedCaps (Desai et al., NeurIPS 2021: 12M image-caption pairs from 350 subreddits), the data MERU trained
on, into the same folder layout, manifest and shards as DataComp's (``webshards``).

RedCaps is released as annotations only: one JSON file per subreddit and year (``annotations/*.json``, each
``{"info": ..., "annotations": [{"image_id", "subreddit", "url", "caption", "raw_caption", ...}]}``) in one
ZIP archive, and users fetch the images themselves. Here the archive is fetched (resumably) into
``OUT/metadata/``, every annotation becomes a row of the download list (the caption as RedCaps cleaned it,
the ``image_id`` as uid, the subreddit kept in each sample's json), and img2dataset fetches the images with
DataComp's settings. What differs from the RedCaps downloader MERU used: img2dataset's resizing
(longest side at most 512 px, DataComp's) rather than the downloader's shorter side 512; the downloader's
own filters were applied to the annotations before their release, so none are applied again. MERU's
training-time augmentation, the word-segmented subreddit prefixed to half the captions, is the core's
(``data.redcaps.SubredditPrefix``, ``data.subreddit_prefix``), applied by the loader as it reads each sample.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Callable, Optional

from euclip_cli.data.fetch import FetchError, fetch_file, sha256_of
from euclip_cli.download.webshards import (LIST_DIR, ImageOptions, Say, check_distributor, claim_output, fetch_images,
                                       write_manifest)
from euclip_cli.errors import UsageError

# The annotations of RedCaps v1.0, as the dataset's download page (redcaps.xyz/download) links them.
ANNOTATIONS_URL = "https://www.dropbox.com/s/cqtdpsl4hewlli1/redcaps_v1.0_annotations.zip?dl=1"
ARCHIVE = "redcaps_v1.0_annotations.zip"
# The sample's json keeps which subreddit it came from (MERU's caption prefix needs it).
COLUMNS = ("subreddit",)


def annotation_rows(archive: Path, subreddits: Optional[set[str]] = None) -> dict[str, list[str]]:
    """``{url, text, uid, subreddit}`` columns of every annotation in the archive (of ``subreddits`` only,
    when given), in the archive's file order. A file that is not RedCaps' JSON is a ``FetchError``."""
    columns: dict[str, list[str]] = {"url": [], "text": [], "uid": [], "subreddit": []}
    try:
        with zipfile.ZipFile(archive) as z:
            names = sorted(n for n in z.namelist() if n.startswith("annotations/") and n.endswith(".json"))
            if not names:
                raise FetchError(f"{archive} holds no annotations/*.json: is it RedCaps' annotations archive?")
            for name in names:
                try:
                    annotations = json.loads(z.read(name))["annotations"]
                except (ValueError, KeyError, TypeError) as err:
                    raise FetchError(f"{archive}: {name} is not RedCaps' annotation format ({err})") from None
                for ann in annotations:
                    if subreddits is not None and ann["subreddit"] not in subreddits:
                        continue
                    columns["url"].append(ann["url"])
                    columns["text"].append(ann["caption"])
                    columns["uid"].append(ann["image_id"])
                    columns["subreddit"].append(ann["subreddit"])
    except zipfile.BadZipFile:
        raise FetchError(f"{archive} is not a ZIP archive: delete it and rerun to fetch it again") from None
    return columns


def download_redcaps(out: Path, options: ImageOptions, command: str, say: Say, url: str = ANNOTATIONS_URL,
                     subreddits: Optional[list[str]] = None,
                     on_bytes: Callable[[int], None] = lambda n: None) -> dict:
    """RedCaps' annotations, then its images, into ``out`` (a rerun continues; a finished one does nothing).
    ``subreddits``: only these (RedCaps names them in lower case), for a smaller download."""
    check_distributor(options)
    chosen = sorted({s.lower() for s in subreddits}) if subreddits else None
    identity = {"source": "redcaps", "annotations": url, "subreddits": chosen, **options.identity()}
    manifest = claim_output(out, identity, command)
    if manifest["complete"]:
        return manifest
    archive = out / "metadata" / ARCHIVE
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        say(f"annotations: fetching {url}")
        fetch_file(url, archive, None, on_bytes)
    list_dir = out / LIST_DIR
    if not (list_dir / ".complete").exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = annotation_rows(archive, set(chosen) if chosen else None)
        if not rows["url"]:
            raise UsageError(f"no annotation in {archive} is of the subreddits {', '.join(chosen or [])}")
        list_dir.mkdir(parents=True, exist_ok=True)
        tmp = list_dir / ".00000000.parquet.tmp"
        pq.write_table(pa.table(rows), tmp)
        tmp.replace(list_dir / "00000000.parquet")
        manifest.update({"pool": len(rows["url"]), "selected": len(rows["url"]), "annotations_sha256": sha256_of(archive)})
        write_manifest(out, manifest)
        (list_dir / ".complete").touch()
    return fetch_images(out, manifest, options, bbox=False, say=say, columns=COLUMNS)
