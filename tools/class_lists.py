"""Compare MERU's zero-shot class lists with the lists clip-benchmark's exporter writes for the same datasets.

    python tools/class_lists.py --meru PATH/meru/evaluation/class_names.py --tfds PATH/tensorflow_datasets

MERU's lists are its ``meru/evaluation/class_names.py`` (CC BY-NC: supply a copy, euclip ships none).
``--tfds`` is an unpacked ``tensorflow_datasets`` package (``pip download tensorflow-datasets --no-deps``,
then unzip the wheel): it carries copies of the datasets' own label files, which the exporter's sources
read at export time. The exporter's list for each dataset is rebuilt as its builder builds it
(clip-benchmark 1.6.2's ``datasets/builder.py``): torchvision's classes from the dataset's file with
clip-benchmark's clean-up (Food-101: sorted, underscores as spaces; SUN397: underscores and slashes), or, for
VTAB's sets, TFDS's label names as they are. A dataset whose file neither package carries (CIFAR,
FGVC Aircraft, STL-10) is listed as not compared. Prints a Markdown table: exactly equal, equal as CLIP's
tokenizer reads them (case and runs of whitespace dropped), or the first differences. Exit 2 for a
missing file.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path


def assigned_list(source: Path, name: str) -> list[str]:
    """The string list a module assigns to ``name`` at its top level, read without importing it."""
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise SystemExit(f"{source}: no top-level {name} = [...]")


def meru_lists(path: Path) -> dict[str, list[str]]:
    """MERU's ``CLASS_NAMES = dict(dataset=[...], ...)``, read without running its module."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CLASS_NAMES":
            return {k.arg: list(ast.literal_eval(k.value)) for k in node.value.keywords}
    raise SystemExit(f"{path}: no CLASS_NAMES = dict(...)")


def lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def exporter_lists(tfds: Path) -> dict[str, tuple[str, list[str] | None]]:
    """Each dataset's list as clip-benchmark's exporter writes it, with where it was rebuilt from (None: no
    source here)."""
    import torchvision.datasets.rendered_sst2 as sst2

    ic, ds = tfds / "image_classification", tfds / "datasets"
    # torchvision's SUN397 drops the "/a/" of each ClassName.txt line; clip-benchmark then spaces "_" and "/".
    sun = [c[3:].replace("_", " ").replace("/", " ") for c in lines(ic / "sun397_labels.txt")]
    sst = re.search(r"self\.classes = (\[[^\]]*\])", Path(sst2.__file__).read_text())[1]
    return {
        # torchvision's Food101 sorts the names of the archive's meta/*.json (TFDS's copy keeps another order).
        "food101": ("Food-101's names (TFDS's copy), sorted as torchvision sorts them, underscores as spaces",
                    [c.replace("_", " ") for c in sorted(lines(ic / "food-101_classes.txt"))]),
        "sun397": ("SUN397's ClassName.txt (TFDS's copy), as torchvision and clip-benchmark clean it", sun),
        "cars": ("Stanford Cars' devkit names (TFDS's cars196 list)", assigned_list(ic / "cars196.py", "_NAMES")),
        "dtd": ("DTD's 47 attributes (TFDS's names file, VTAB's route)", lines(ic / "dtd_key_attributes.txt")),
        "resisc45": ("TFDS's resisc45 labels, as VTAB's route keeps them",
                     assigned_list(ds / "resisc45" / "resisc45_dataset_builder.py", "_LABELS")),
        "cub2011": ("TFDS's caltech_birds2011 declares 200 labels by count: its names are the numbers",
                    [str(i) for i in range(200)]),
        "sst2": ("torchvision's RenderedSST2", ast.literal_eval(sst)),
        "cifar10": ("CIFAR-10's batches.meta: not in either package", None),
        "cifar100": ("CIFAR-100's meta: not in either package", None),
        "aircraft": ("FGVC Aircraft's variants.txt: not in either package", None),
        "stl10": ("STL-10's class_names.txt: not in either package", None),
    }


def tokenizer_form(name: str) -> str:
    """What CLIP's tokenizer keeps of a class name: lower case, whitespace runs as one space."""
    return " ".join(name.lower().split())


def compare(ours: list[str], theirs: list[str]) -> str:
    if ours == theirs:
        return "equal"
    if len(ours) != len(theirs):
        return f"{len(ours)} names against MERU's {len(theirs)}"
    if [tokenizer_form(a) for a in ours] == [tokenizer_form(b) for b in theirs]:
        return "equal up to case and spacing"
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(ours, theirs)) if tokenizer_form(a) != tokenizer_form(b)]
    shown = "; ".join(f"{i}: '{a}' / '{b}'" for i, a, b in differ[:3])
    if sorted(map(tokenizer_form, ours)) == sorted(map(tokenizer_form, theirs)):
        # The same names at other labels: a prompt list in MERU's order names those labels' images wrongly.
        return f"the same names, {len(differ)} at other labels (label: exporter / MERU): {shown}"
    return f"{len(differ)} of {len(ours)} differ (label: exporter / MERU): {shown}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meru", type=Path, required=True, help="MERU's meru/evaluation/class_names.py")
    parser.add_argument("--tfds", type=Path, required=True, help="an unpacked tensorflow_datasets package")
    args = parser.parse_args(argv)
    for path in (args.meru, args.tfds / "image_classification" / "food-101_classes.txt"):
        if not path.exists():
            print(f"error: {path} is missing: give MERU's class_names.py and an unpacked tensorflow_datasets",
                  file=sys.stderr)
            return 2
    meru = meru_lists(args.meru)
    print("| dataset | the exporter's list, rebuilt from | against MERU's |\n|---|---|---|")
    for dataset, (source, names) in exporter_lists(args.tfds).items():
        print(f"| {dataset} | {source} | {'not compared' if names is None else compare(names, meru[dataset])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
