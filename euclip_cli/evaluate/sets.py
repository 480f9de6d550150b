"""An evaluation set read before any model: how many samples each split of a probe set holds, its classes,
and the images its splits share, against MERU's Table 6 (``euclip eval --check-sets``). Reads the shards'
bytes only (tarfile; no torch, no decoding), so a set made by hand with clip-benchmark's exporter can be
checked in seconds before hours of features."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

from euclip_cli.errors import UsageError
from euclip_cli.protocol.tasks import Task
from euclip_cli.published import meru_split_sizes

# The image members clip-benchmark's exporter writes (``webp``) or others' tools do.
IMAGE_EXTENSIONS = ("webp", "jpg", "jpeg", "png")
SPLITS = ("train", "val", "test")


def split_images(split_dir: Path) -> list[str]:
    """The sha256 of each sample's image in one split (``split_dir/nshards.txt``, ``0.tar``...), in order."""
    try:
        shards = int((split_dir / "nshards.txt").read_text().strip())
    except ValueError:
        raise UsageError(f"{split_dir / 'nshards.txt'} does not hold a shard count: export the split again") from None
    digests = []
    for i in range(shards):
        path = split_dir / f"{i}.tar"
        if not path.is_file():
            raise UsageError(f"{path} is missing ({shards} shards are listed in nshards.txt): export the split again")
        try:
            with tarfile.open(path) as tar:
                for member in tar:
                    if member.isfile() and member.name.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS:
                        digests.append(hashlib.sha256(tar.extractfile(member).read()).hexdigest())
        except tarfile.TarError as err:
            raise UsageError(f"{path} is not a readable tar ({err}): export the split again") from None
    return digests


def sizes_match_meru(found: dict, published: dict, own_val: bool) -> bool:
    """Whether a probe set's split sizes (``found``: train, val, test) are MERU's Table 6 row ``published``:
    split by split where the set has a val split of its own; else train + val and test (euclip draws its
    validation from train, ``probe.stratified_holdout``)."""
    ours = (found["train"], found["val"], found["test"])
    theirs = (published["train"], published["val"], published["test"])
    return ours == theirs if own_val else (ours[0] + ours[1], ours[2]) == (theirs[0] + theirs[1], theirs[2])


def check_probe_set(task: Task, data_dir: Path) -> dict:
    """What a probe set in ``data_dir`` holds against its row of MERU's Table 6 (``meru``: classes, train,
    val, test): each split's samples, the classes, the test images also in train or val, and whether
    the sizes are MERU's (``sizes_match_meru``)."""
    published = meru_split_sizes()[task.key.split("/", 1)[1]]
    images = {s: split_images(data_dir / s) for s in SPLITS if (data_dir / s / "nshards.txt").exists()}
    classes = data_dir / "classnames.txt"
    found = {s: len(images.get(s, [])) for s in SPLITS}
    seen = set(images.get("train", [])) | set(images.get("val", []))
    own_val = "val" in images
    n_classes = len([line for line in classes.read_text().splitlines() if line.strip()]) if classes.exists() else 0
    return {"task": task.key, "folder": str(data_dir), **found, "own_val": own_val,
            "test_in_train": sum(d in seen for d in images.get("test", [])), "classes": n_classes,
            "meru": published, "sizes_match_meru": sizes_match_meru(found, published, own_val), "classes_match_meru": n_classes == published["classes"]}
