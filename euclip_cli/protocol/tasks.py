"""The task registry: DataComp's 40 evaluation tasks, the embedded world's, MERU's (its 20 zero-shot
datasets and 2 retrieval sets, read from DataComp's evaluation sets with MERU's prompts) and the
compositional ones (SugarCrepe's seven splits and Winoground, as clip-benchmark reads them), one layout for all.

Each suite groups its tasks the same way, so one report layout serves both:
``main`` (ImageNet / Shapes), ``shifts`` (ImageNet distribution shifts / shifted
renderings), ``attributes`` (VTAB / attribute tasks) and ``retrieval``. The average is
over every task of the suite that produces a main metric (DataComp: 38 of 40).
Imports only the standard library and the world's task list (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from euclip_cli.errors import UsageError
from euclip_cli.worlddir import WorldDir


@dataclass(frozen=True)
class Task:
    key: str  # clip-benchmark style id, the results key ("imagenet1k", "world/shapes")
    name: str  # display name (DataComp's results "dataset")
    kind: str  # classification, retrieval, winogavil, wilds, fairness, probe, selection
    main_metric: Optional[str]  # None: produces no main metric (FairFace, UTKFace)
    group: Optional[str]  # main, shifts, attributes, retrieval, or None
    suite: str  # "datacomp", "world", "meru", "meru-probe" or "compositional"
    # meru suite: the DataComp task whose evaluation set it reads (None: a set of its own, ``folder``),
    # and the prompts that replace that set's own templates.
    source: Optional[str] = None
    folder: Optional[str] = None
    templates: tuple[str, ...] = ()
    # Class names that replace that set's, one per label in its order (MERU's own where they differ).
    classes: tuple[str, ...] = ()
    # Linear probes (kind "probe"): the share of the train split held out for validation where the set
    # has no val split of its own (MERU's catalog: 10% for Food-101 and CIFAR, 20% elsewhere).
    val_fraction: float = 0.2
    # How images meet the tower's size (towers.transforms_for): "crop" (the shorter side, then the centre:
    # DataComp's protocol and MERU's classification) or "squeeze" (both sides, aspect lost: MERU's retrieval).
    resize: str = "crop"
    # A set on no host (``folder``): the name clip-benchmark's exporter knows its dataset by.
    exporter_name: Optional[str] = None
    # Whether its main metric joins the suite's average (``averaged``): the world's hard negatives do not, so
    # the world's average stays the ten tasks that studies published before them compare.
    in_average: bool = True

    @property
    def images_key(self) -> str:
        """Whose images these are: the evaluation set the task reads."""
        return self.source or self.key

    @property
    def features_key(self) -> str:
        """Whose image features these are: tasks reading the same set the same way share cached features."""
        return self.images_key if self.resize == "crop" else f"{self.images_key}@{self.resize}"

    def class_names(self, found: list[str]) -> list[str]:
        """The names a classification task's prompts are filled with, one per label: its own, else the set's
        (``found``). MERU's suite writes underscores as spaces, as every list of MERU's does: VTAB's RESISC45
        export keeps TFDS's "baseball_diamond", which CLIP's tokenizer reads as other tokens."""
        names = list(self.classes) or list(found)
        return [name.replace("_", " ") for name in names] if self.suite == "meru" else names

    def data_dir(self, eval_root: Path, world_root: Path) -> Path:
        if self.source:
            return TASKS[self.source].data_dir(eval_root, world_root)
        if self.folder:
            return eval_root / self.folder
        if self.suite == "world":
            return WorldDir(world_root).task(self.key.split("/", 1)[1])
        if self.suite == "compositional":
            return eval_root / self.key.split("/", 1)[0]  # SugarCrepe's seven splits share one folder
        if self.kind == "winogavil":
            return eval_root / "winogavil"  # instances.jsonl + images/, see euclip_cli.evaluate.evalsets
        key = self.key.split("/", 1)[1] if self.key.startswith("fairness/") else self.key
        return eval_root / f"wds_{key.replace('/', '-')}_test"


SUITE_COLUMNS = {
    "datacomp": {"main": "ImageNet", "shifts": "ImageNet dist. shifts", "attributes": "VTAB",
                 "retrieval": "Retrieval", "average": "Average over 38 datasets"},
    "world": {"main": "Shapes", "shifts": "Shape shifts", "attributes": "Attributes",
              "retrieval": "Retrieval", "average": "Average over 10 tasks"},
    # MERU's Tables 1 and 2: ImageNet, its 19 other zero-shot datasets, COCO and Flickr30K.
    "meru": {"main": "ImageNet", "shifts": "(none)", "attributes": "19 other datasets",
             "retrieval": "Retrieval", "average": "Average over 22 tasks"},
    # MERU's Table 7: linear probes on the 19 datasets (train, val and test splits of each).
    "meru-probe": {"main": "(none)", "shifts": "(none)", "attributes": "19 datasets (linear probe)",
                   "retrieval": "(none)", "average": "Average over 19 datasets"},
    # Image-caption selection: Winoground's group score, and SugarCrepe's seven splits (their mean).
    "compositional": {"main": "Winoground", "shifts": "(none)", "attributes": "SugarCrepe",
                      "retrieval": "(none)", "average": "Average over 8 tasks"},
}
GROUPS = ("main", "shifts", "attributes", "retrieval")

_C, _R = "classification", "retrieval"
_DATACOMP = [
    # key, name, kind, main metric, group
    ("vtab/caltech101", "Caltech-101", _C, "mean_per_class_recall", "attributes"),
    ("cifar10", "CIFAR-10", _C, "acc1", None),
    ("vtab/cifar100", "CIFAR-100", _C, "acc1", "attributes"),
    ("vtab/clevr_count_all", "CLEVR Counts", _C, "acc1", "attributes"),
    ("vtab/clevr_closest_object_distance", "CLEVR Distance", _C, "acc1", "attributes"),
    ("country211", "Country211", _C, "acc1", None),
    ("vtab/dtd", "Describable Textures", _C, "acc1", "attributes"),
    ("vtab/eurosat", "EuroSAT", _C, "acc1", "attributes"),
    ("fgvc_aircraft", "FGVC Aircraft", _C, "mean_per_class_recall", None),
    ("food101", "Food-101", _C, "acc1", None),
    ("gtsrb", "GTSRB", _C, "acc1", None),
    ("imagenet1k", "ImageNet 1k", _C, "acc1", "main"),
    ("imagenet_sketch", "ImageNet Sketch", _C, "acc1", "shifts"),
    ("imagenetv2", "ImageNet v2", _C, "acc1", "shifts"),
    ("imagenet-a", "ImageNet-A", _C, "acc1", "shifts"),
    ("imagenet-o", "ImageNet-O", _C, "acc1", "shifts"),
    ("imagenet-r", "ImageNet-R", _C, "acc1", "shifts"),
    ("vtab/kitti_closest_vehicle_distance", "KITTI Vehicle Distance", _C, "acc1", "attributes"),
    ("mnist", "MNIST", _C, "acc1", None),
    ("objectnet", "ObjectNet", _C, "acc1", "shifts"),
    ("vtab/flowers", "Oxford Flowers-102", _C, "mean_per_class_recall", "attributes"),
    ("vtab/pets", "Oxford-IIIT Pet", _C, "mean_per_class_recall", "attributes"),
    ("voc2007", "Pascal VOC 2007", _C, "acc1", None),
    ("vtab/pcam", "PatchCamelyon", _C, "acc1", "attributes"),
    ("renderedsst2", "Rendered SST2", _C, "acc1", None),
    ("vtab/resisc45", "RESISC45", _C, "acc1", "attributes"),
    ("cars", "Stanford Cars", _C, "acc1", None),
    ("stl10", "STL-10", _C, "acc1", None),
    ("sun397", "SUN397", _C, "acc1", "attributes"),
    ("vtab/svhn", "SVHN", _C, "acc1", "attributes"),
    ("retrieval/flickr_1k_test_image_text_retrieval", "Flickr", _R, "mean_recall@1", "retrieval"),
    ("retrieval/mscoco_2014_5k_test_image_text_retrieval", "MSCOCO", _R, "mean_recall@1", "retrieval"),
    ("misc/winogavil", "WinoGAViL", "winogavil", "jaccard_score_10-12", "retrieval"),
    ("wilds/iwildcam", "iWildCam", "wilds", "F1-macro_all", None),
    ("wilds/camelyon17", "Camelyon17", "wilds", "acc1", None),
    ("wilds/fmow", "FMoW", "wilds", "acc_worst_region", None),
    ("fairness/dollar_street", "Dollar Street", "fairness", "acc_top5_wg", None),
    ("fairness/geode", "GeoDE", "fairness", "acc_wg", None),
    ("fairness/fairface", "FairFace", "fairness", None, None),
    ("fairness/utkface", "UTKFace", "fairness", None, None),
]


def _world_tasks() -> list[Task]:
    from euclip_cli.data.world_tasks import WORLD_TASKS

    def kind(t) -> tuple[str, Optional[str]]:
        return ("selection", "acc") if t.selection else (_R, "mean_recall@1") if t.classes is None else (_C, "acc1")

    return [Task(f"world/{t.name}", t.title, *kind(t), t.group, "world", in_average=not t.selection)
            for t in WORLD_TASKS]


# MERU's evaluation (its Tables 1 and 2; catalog in its meru/evaluation/catalog.py): (task, name, the
# DataComp task whose test set is MERU's, or None, and the prompts of MERU's Table 8 it uses). Scored by
# mean per-class accuracy on every dataset, as MERU scores them.
_MERU = [
    ("imagenet", "ImageNet", "imagenet1k", "imagenet"), ("food101", "Food-101", "food101", "food101"),
    ("cifar10", "CIFAR-10", "cifar10", "cifar10"), ("cifar100", "CIFAR-100", "vtab/cifar100", "cifar10"),
    ("cub2011", "CUB-2011", None, "cub2011"), ("sun397", "SUN397", "sun397", "sun397"),
    ("cars", "Stanford Cars", "cars", "cars"), ("aircraft", "FGVC Aircraft", "fgvc_aircraft", "aircraft"),
    ("dtd", "DTD", "vtab/dtd", "dtd"), ("pets", "Oxford-IIIT Pets", "vtab/pets", "pets"),
    ("caltech101", "Caltech-101", "vtab/caltech101", "caltech101"),
    ("flowers102", "Flowers", "vtab/flowers", "flowers102"), ("stl10", "STL-10", "stl10", "stl10"),
    ("eurosat", "EuroSAT", "vtab/eurosat", "eurosat"), ("resisc45", "RESISC", "vtab/resisc45", "resisc45"),
    ("country211", "Country211", "country211", "country211"), ("mnist", "MNIST", "mnist", "mnist"),
    ("clevr", "CLEVR Counts", "vtab/clevr_count_all", "clevr"), ("pcam", "PCAM", "vtab/pcam", "pcam"),
    ("sst2", "SST2", "renderedsst2", "sst2"),
]
MERU_PROMPTS = Path(__file__).with_name("meru-prompts.toml")
# MERU names CLEVR's counts by digits ("a photo of 3 objects."), DataComp's set by words ("three"); label i of
# VTAB's count_all task, which DataComp's set is, counts i + 3 objects. Every other list of MERU's compared
# is the set's up to case and spacing, which CLIP's tokenizer drops, and underscores (``Task.class_names``),
# or differs where docs/meru.md says (tools/class_lists.py compares them).
MERU_CLASSES = {"clevr": tuple(str(count) for count in range(3, 11))}


# The sets MERU's suite reads that no host serves in DataComp's layout, by clip-benchmark's dataset name:
# CUB-2011 is VTAB's (task_adaptation's caltech_birds2011); clip-benchmark has no plain "cub".
UNHOSTED = {"cub2011": "vtab/cub"}
# clip-benchmark's VTAB exports name the classes as TFDS does, and TFDS's caltech_birds2011 declares only a
# count of labels, so the export's classnames.txt holds "0".."199": the species come from the dataset's own
# list (MERU's names are its lines without the number and with spaces for underscores; docs/meru.md).
NAMES_FROM = {"cub2011": "CUB_200_2011/classes.txt"}
# The evaluation sets whose classes are the digits themselves (class i is "i"); any other set whose class
# names are its label indices has lost its names.
DIGIT_SETS = frozenset({"mnist"})


def _meru_tasks() -> list[Task]:
    import tomllib

    prompts = tomllib.loads(MERU_PROMPTS.read_text())
    tasks = [Task(f"meru/{key}", name, _C, "mean_per_class_recall", "main" if key == "imagenet" else "attributes",
                  "meru", source=source, folder=None if source else f"wds_{key}_test",
                  templates=tuple(prompts[prompt]), classes=MERU_CLASSES.get(key, ()),
                  exporter_name=None if source else UNHOSTED[key])
             for key, name, source, prompt in _MERU]
    # Table 1's retrieval, on DataComp's sets: Flickr30K's is MERU's; COCO's is the 2014 Karpathy test
    # split, not MERU's val2017 (5,000 images each). MERU's retrieval squeezes each image to 224 x 224.
    tasks += [Task(f"meru/{key}", name, _R, "image_retrieval_recall@5", "retrieval", "meru", source=source,
                   resize="squeeze")
              for key, name, source in (("coco", "COCO", "retrieval/mscoco_2014_5k_test_image_text_retrieval"),
                                        ("flickr30k", "Flickr30K", "retrieval/flickr_1k_test_image_text_retrieval"))]
    return tasks


def _meru_probe_tasks() -> list[Task]:
    """Table 7's 19 datasets (ImageNet is not among them): each a folder of its own with train, test and
    (where the dataset has one) val splits in clip-benchmark's layout, made with its exporter."""
    return [Task(f"meru-probe/{key}", name, "probe", "mean_per_class_recall", "attributes", "meru-probe",
                 folder=f"wds_{key}_probe", val_fraction=0.1 if key in ("food101", "cifar10", "cifar100") else 0.2)
            for key, name, _, _ in _MERU if key != "imagenet"]


def _compositional_tasks() -> list[Task]:
    """clip-benchmark's image-caption selection tasks. Their main metric is clip-benchmark's ``acc``: a
    SugarCrepe pair is right when the image is closer to its caption than to the negative; a Winoground
    instance when each of its two images and each of its two captions picks its own partner (the group
    score). SugarCrepe's splits are its kinds of negative (``world_tasks.NEGATIVE_KINDS``)."""
    from euclip_cli.data.world_tasks import NEGATIVE_KINDS

    tasks = [Task(f"sugar_crepe/{split}", f"SugarCrepe {split.replace('_', '-')}", "selection", "acc", "attributes",
                  "compositional") for split in NEGATIVE_KINDS]
    return tasks + [Task("winoground", "Winoground", "selection", "acc", "main", "compositional")]


TASKS: dict[str, Task] = {t[0]: Task(*t, suite="datacomp") for t in _DATACOMP}
TASKS.update({t.key: t for t in _world_tasks()})
TASKS.update({t.key: t for t in _meru_tasks()})
TASKS.update({t.key: t for t in _meru_probe_tasks()})
TASKS.update({t.key: t for t in _compositional_tasks()})


# The embedded world's hard negatives (``world_tasks.hard_negative``), which the study and the report read.
HARD_NEGATIVES = "world/hard-negatives"


def list_tasks(suite: Optional[str] = None) -> list[Task]:
    return [t for t in TASKS.values() if suite is None or t.suite == suite]


def averaged(suite: str) -> list[Task]:
    """The tasks of ``suite`` its groups and average are means of: those with a main metric (DataComp drops
    FairFace and UTKFace) that join the average (``Task.in_average``)."""
    return [t for t in list_tasks(suite) if t.main_metric is not None and t.in_average]


def select(spec: str) -> list[Task]:
    """Tasks named by a suite ("datacomp", "world"), a suite group ("world:attributes"), or comma-separated keys.

    Raises ValueError naming the unknown entries.
    """
    chosen: list[Task] = []
    unknown = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        suite, _, group = item.partition(":")
        if suite in SUITE_COLUMNS and (not group or group in GROUPS):
            chosen += [t for t in list_tasks(suite) if not group or t.group == group]
        elif item in TASKS:
            chosen.append(TASKS[item])
        else:
            unknown.append(item)
    if unknown:
        raise UsageError(f"unknown task(s) {', '.join(unknown)}: use a suite ({', '.join(SUITE_COLUMNS)}), "
                         f"SUITE:GROUP (groups: {', '.join(GROUPS)}) or task keys ('euclip eval --list-tasks')")
    return list(dict.fromkeys(chosen))
