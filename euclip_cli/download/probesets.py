"""MERU's linear-probe sets (its Table 7) in clip-benchmark's layout, made by clip-benchmark's own exporter
(``webdataset_builder.convert_dataset``) from the datasets its builder fetches (torchvision's, or
TensorFlow Datasets' through ``task_adaptation`` for ``vtab/`` names): each split of a probe set from the
export and split that give MERU's (``EXPORTS``; the table in docs/meru.md), written into the folder the
probe reads (``TASK.folder/{train,val,test}``). Each split is exported into a staging folder beside its own
and renamed into place once the exporter has written its ``nshards.txt`` (its last file), so that a split's
folder is whole or absent, a stop or a failure leaving none of it; a split that is there is kept.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from euclip_cli.errors import Failure, UsageError
from euclip_cli.protocol.tasks import Task
from euclip_cli.rundir import whole_folder


@dataclass(frozen=True)
class Export:
    """clip-benchmark's ``--dataset`` and, for each folder of the probe set, the ``--split`` that fills it."""

    dataset: str
    splits: dict[str, str]


_TRAIN_TEST = {"train": "train", "test": "test"}
_OWN_VAL = {"train": "train", "val": "val", "test": "test"}
# Read from clip-benchmark 1.6.2's builder and task_adaptation's split definitions against MERU's Table 6
# (docs/meru.md): "trainval" is train + val, from which euclip holds out MERU's share per class.
EXPORTS = {
    "food101": Export("food101", _TRAIN_TEST), "cifar10": Export("cifar10", _TRAIN_TEST),
    "cifar100": Export("cifar100", _TRAIN_TEST), "mnist": Export("mnist", _TRAIN_TEST),
    "stl10": Export("stl10", _TRAIN_TEST), "cars": Export("cars", _TRAIN_TEST),
    "pets": Export("pets", {"train": "trainval", "test": "test"}),
    "cub2011": Export("vtab/cub", {"train": "trainval", "test": "test"}),
    "caltech101": Export("vtab/caltech101", {"train": "trainval", "test": "test"}),
    "aircraft": Export("fgvc_aircraft", _OWN_VAL), "dtd": Export("dtd", _OWN_VAL),
    "flowers102": Export("flowers", _OWN_VAL), "pcam": Export("pcam", _OWN_VAL),
    "sst2": Export("renderedsst2", _OWN_VAL),
    "country211": Export("country211", {"train": "train", "val": "valid", "test": "test"}),
}
# No export gives MERU's split of these: SUN397's partition 1, and the subsets MERU drew itself.
WITHOUT_EXPORT = ("sun397", "eurosat", "resisc45", "clevr")


def export_for(task: Task) -> Export:
    """The export that makes ``task``'s probe set; a UsageError naming why where there is none."""
    dataset = task.key.split("/", 1)[1]
    if dataset not in EXPORTS:
        raise UsageError(f"{task.key}: no clip-benchmark export gives MERU's splits (docs/meru.md: SUN397's "
                         f"partition 1 and MERU's own subsets of EuroSAT, RESISC45 and CLEVR)")
    return EXPORTS[dataset]


def make_probe_set(task: Task, folder: Path, sources: Path, say: Callable[[str], None]) -> list[str]:
    """Export each missing split of ``task``'s probe set into ``folder``, the datasets fetched into
    ``sources`` by clip-benchmark's builder; returns the folders written."""
    export = export_for(task)
    try:
        from clip_benchmark.datasets.builder import build_dataset
        from clip_benchmark.webdataset_builder import PIL_to_bytes, convert_dataset
    except ImportError as err:
        raise UsageError(f"{task.key}: clip-benchmark's exporter does not import ({err})") from None
    written = []
    for part, split in export.splits.items():
        if (folder / part / "nshards.txt").exists():
            say(f"{task.key}: {folder / part} is there")
            continue
        say(f"{task.key}: {export.dataset} --split {split} into {folder / part}")
        try:
            dataset = build_dataset(export.dataset, root=str(sources), split=split, transform=PIL_to_bytes("webp"),
                                    download=True)
        except ImportError as err:  # vtab/ names need task_adaptation and tensorflow_datasets
            raise UsageError(f"{task.key}: clip-benchmark's {export.dataset} needs a package that is not installed "
                             f"({err}): install it (vtab/ sets: task_adaptation and tensorflow-datasets)") from None
        except OSError as err:  # the dataset's own host, through torchvision or TensorFlow Datasets
            raise Failure(f"{task.key}: {export.dataset} --split {split} could not be fetched into {sources} ({err}); "
                          f"the same command continues") from None
        if (folder / part).exists():  # half a split, from a version that exported in place
            shutil.rmtree(folder / part)
        with whole_folder(folder / part, _exported_elsewhere(folder / part)) as staging, warnings.catch_warnings(), \
                contextlib.redirect_stdout(io.StringIO()):
            # The exporter asks torch for 8 loader workers whatever the machine, and torch warns of it; it and
            # webdataset print the staging shards' names and sizes. Neither is the user's to act on.
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            # The exporter writes OUTPUT/SPLIT/ (and the class names into OUTPUT): SPLIT is the staging folder.
            convert_dataset(dataset, staging.name, str(folder), image_format="webp", verbose=False)
        written.append(part)
    return written


def _exported_elsewhere(split: Path) -> Callable[[str], UsageError]:
    """What ``whole_folder`` raises for a split that another euclip process is exporting (its pid)."""
    return lambda pid: UsageError(f"{split} is being exported by another euclip (pid {pid}): wait for it to finish")
