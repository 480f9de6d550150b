"""A download's folder as the trainer reads it: its manifest (``OUT/manifest.json``, written by the
``download`` runner as each stage finishes) says what was asked for, what came and whether it is
complete, and the trainer logs it beside the run (stdlib only)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from euclip_cli.errors import UsageError
from euclip_cli.rundir import read_json

MANIFEST = "manifest.json"


def read_manifest(folder: Path) -> Optional[dict]:
    """The manifest of the download in ``folder``; None where there is none."""
    path = folder / MANIFEST
    return read_json(path) if path.exists() else None


def training_record(train_dir: Path) -> Optional[dict]:
    """What the trainer logs about a download whose shards are ``train_dir`` (None for other folders).

    Raises UsageError when the download is unfinished: training on part of a subset would
    silently change the experiment.
    """
    manifest = read_manifest(train_dir.parent)
    if manifest is None or manifest.get("identity", {}).get("source") not in ("datacomp", "urls", "redcaps", "grit"):
        return None
    if not manifest.get("complete"):
        raise UsageError(f"the download in {train_dir.parent} is unfinished ({manifest.get('shards', 0)} of "
                         f"{manifest.get('expected_shards', '?')} shards): rerun '{manifest['command']}' first")
    keys = ("pool", "threshold", "selected", "attempted", "downloaded", "success_rate", "shards", "bytes")
    # GRIT's: the pairs kept with boxes and the boxes, after HyCoCLIP's preparation (download.grit).
    kept = {"boxes": manifest["boxes"]} if "boxes" in manifest else {}
    return {**manifest["identity"], **{k: manifest.get(k) for k in keys}, **kept}

