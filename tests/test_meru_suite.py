"""MERU's evaluation suite (``euclip eval --tasks meru``): its 20 zero-shot datasets and 2 retrieval sets
read from DataComp's evaluation sets with MERU's prompts, on stand-ins made from the embedded world."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.protocol.tasks import MERU_PROMPTS, TASKS, list_tasks, select
from euclip_cli.published import meru_tables
from tests.test_datacomp_eval import TINY
from tests.wdsfixtures import first_samples

runner = CliRunner()
CLEVR_WORDS = ["three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def test_the_suite_is_merus_tables_one_and_two():
    tasks = list_tasks("meru")
    assert len(tasks) == 22 and {t.kind for t in tasks} == {"classification", "retrieval"}
    published = meru_tables()
    names = set(published.loc[published["table"].isin([1, 2]), "dataset"])
    assert {t.name for t in tasks} == names
    # Each reads the DataComp set the published table names for its dataset (CUB-2011: a folder of its own).
    of_dataset = dict(zip(published["dataset"], published["datacomp_task"]))
    assert all((t.source or "") == of_dataset[t.name] for t in tasks)
    assert all(t.source in TASKS and TASKS[t.source].suite == "datacomp" for t in tasks if t.source)
    # Every prompt of MERU's Table 8 is a template with one slot, and every classification task has some.
    prompts = tomllib.loads(MERU_PROMPTS.read_text())
    assert all(p.count("{c}") == 1 for ps in prompts.values() for p in ps)
    assert all(t.templates for t in tasks if t.kind == "classification")
    assert TASKS["meru/cifar100"].templates == TASKS["meru/cifar10"].templates  # one list for both (Table 8)
    assert TASKS["meru/imagenet"].templates[0] == "i took a picture : itap of a {c}."


def test_merus_retrieval_squeezes_the_whole_image_where_classification_crops_its_centre():
    """A 2:1 image, red on its left quarter, blue on its right: squeezed to the tower's square both edges
    stay; cropped, the centre square holds neither."""
    from PIL import Image

    from euclip_cli.model import EuclipModel
    from euclip_cli.towers import transforms_for
    from euclip_cli import config as C

    clip = EuclipModel(C.load_config("tiny-meru")).clip
    image = Image.new("RGB", (128, 64), (128, 128, 128))
    image.paste((255, 0, 0), (0, 0, 32, 64))
    image.paste((0, 0, 255), (96, 0, 128, 64))
    squeezed, cropped = (transforms_for(clip, resize=r)[1](image) for r in ("squeeze", "crop"))
    assert squeezed.shape == cropped.shape and squeezed.shape[-1] == squeezed.shape[-2]
    left, right = squeezed[:, :, 0], squeezed[:, :, -1]
    assert (left[0] > left[2]).all() and (right[2] > right[0]).all()  # red at the left edge, blue at the right
    assert torch.allclose(cropped[:, :, 0], cropped[:, :, -1])  # the grey centre only
    assert {t.resize for t in list_tasks("meru") if t.kind == "retrieval"} == {"squeeze"}
    assert {t.resize for t in list_tasks("meru") if t.kind == "classification"} == {"crop"}


def test_evalsets_fetches_the_datacomp_sets_the_suite_reads(tmp_path):
    from euclip_cli.evaluate.runner import fetch_command

    assert fetch_command(select("meru/food101,meru/imagenet")) == "euclip download evalsets --tasks food101,imagenet1k"
    # clip-benchmark knows CUB-2011 as VTAB's "vtab/cub" only: its builder has no plain "cub" (read from it here).
    assert ("clip_benchmark_export_wds --dataset vtab/cub --split test --output EVAL_ROOT/wds_cub2011_test"
            in fetch_command(select("meru/cub2011")))
    import inspect

    from clip_benchmark.datasets import builder
    assert 'dataset_name == "cub"' in inspect.getsource(builder.build_vtab_dataset)
    assert 'elif dataset_name == "cub"' not in inspect.getsource(builder.build_dataset)
    result = runner.invoke(app, ["download", "evalsets", "--tasks", "meru/cub2011", "--root", str(tmp_path)])
    said = "".join(result.output.split())  # the terminal may wrap the long path anywhere
    assert result.exit_code == 0 and f"--datasetvtab/cub--splittest--output{tmp_path}/wds_cub2011_test" in said
    # Its classes: the CUB branch of clip-benchmark's VTAB builder names none, so the export writes TFDS's names,
    # which caltech_birds2011 declares by count alone ("0".."199"); the command says where the species come from.
    vtab = inspect.getsource(builder.build_vtab_dataset)
    cub = vtab[vtab.index('elif dataset_name == "cub"'):vtab.index("elif", vtab.index('elif dataset_name == "cub"') + 5)]
    assert "classes" not in cub.replace("CUB2011Data", "") and "classes=classes" in vtab
    assert ", then its classnames.txt from CUB_200_2011/classes.txt" in fetch_command(select("meru/cub2011"))


@pytest.mark.slow
def test_a_set_whose_class_names_are_its_label_numbers_is_refused_in_one_line(trained, meru_sets, tmp_path):
    """As clip-benchmark's CUB-2011 export writes it: prompts such as "a photo of a 7, a type of bird" would score
    a model on nothing; MNIST's digits are its names."""
    import shutil

    shutil.copytree(meru_sets / "wds_cub2011_test", tmp_path / "wds_cub2011_test")
    n = len((tmp_path / "wds_cub2011_test" / "classnames.txt").read_text().split())
    (tmp_path / "wds_cub2011_test" / "classnames.txt").write_text("".join(f"{i}\n" for i in range(n)))
    result = runner.invoke(app, ["eval", str(trained), "--tasks", "meru/cub2011", "--eval-root", str(tmp_path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"names the classes by their label numbers 0..{n - 1}" in said and "CUB_200_2011/classes.txt" in said
    shutil.copytree(tmp_path / "wds_cub2011_test", tmp_path / "wds_mnist_test")
    result = runner.invoke(app, ["eval", str(trained), "--tasks", "mnist", "--eval-root", str(tmp_path)])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def meru_sets(world, tmp_path_factory):
    """The folders the suite reads, made from the first 24 images of the world's Shapes and retrieval sets
    in DataComp's layout (the suite's wiring is under test here, not its numbers)."""
    root = tmp_path_factory.mktemp("evalsets")
    for task in list_tasks("meru"):
        dest = task.data_dir(root, world)
        if not dest.exists():
            # DataComp's CLEVR Counts names its eight classes by words, where MERU's suite names them by digits.
            words = CLEVR_WORDS if task.key == "meru/clevr" else None
            first_samples(world / "eval" / ("retrieval" if task.kind == "retrieval" else "shapes"), dest, 24, words)
    return root


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    result = runner.invoke(app, ["train", "--recipe", "tiny-meru", f"data.train_dir={world / 'train'}", *TINY,
                                 "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    return runs / "tiny-meru"


def cached_features(run) -> set[str]:
    """The names of a run's cached image features, less the identity of the set each was read from."""
    return {re.sub(r"@[0-9a-f]{16}\.pt$", ".pt", p.name) for p in (run / "features").rglob("*.pt")}


@pytest.mark.slow
def test_the_whole_suite_scores_with_merus_prompts_and_shares_the_image_features(trained, meru_sets, monkeypatch):
    import euclip_cli.evaluate.runner as evaluation

    embedded = []
    real = evaluation.embed_texts
    monkeypatch.setattr(evaluation, "embed_texts", lambda model, tok, texts: embedded.append(texts) or real(model, tok, texts))
    result = runner.invoke(app, ["eval", str(trained), "--tasks", "food101", "--eval-root", str(meru_sets)])
    assert result.exit_code == 0, result.output
    cached = cached_features(trained)
    result = runner.invoke(app, ["eval", str(trained), "--tasks", "meru", "--eval-root", str(meru_sets)])
    assert result.exit_code == 0, result.output
    assert "meru (22/22 tasks)" in " ".join(result.output.split())
    lines = {line["key"]: line for line in map(json.loads, (trained / "eval.jsonl").read_text().splitlines())}
    assert all(not lines[t.key].get("failed") for t in list_tasks("meru"))
    # MERU's own prompts, not the set's: Food-101's two, filled with the set's class names.
    classes = (meru_sets / "wds_food101_test" / "classnames.txt").read_text().splitlines()
    food_prompts = [texts for texts in embedded if texts[0].startswith("food :")]
    assert food_prompts == [[p.format(c=c) for c in classes for p in ("food : {c}.", "food porn : {c}.")]]
    # Food-101's images were embedded once, for DataComp's task, and read from the cache for MERU's; only
    # CUB-2011, a set of the suite's own, has features under its own name.
    after = cached_features(trained)
    assert "food101.pt" in cached and {name for name in after if name.startswith("meru__")} == {"meru__cub2011.pt"}
    # MERU's retrieval squeezes its images where DataComp's crops them: features of their own.
    assert {name for name in after if "@" in name} == {
        "retrieval__mscoco_2014_5k_test_image_text_retrieval@squeeze.pt",
        "retrieval__flickr_1k_test_image_text_retrieval@squeeze.pt"}
    # CLEVR Counts: MERU's digits in the set's label order (label 0 counts three objects), not the set's words.
    clevr = [texts for texts in embedded if texts[0].startswith("a photo of") and texts[0].endswith("objects.")]
    assert clevr == [[f"a photo of {n} objects." for n in range(3, 11)]]
    food = lines["meru/food101"]["metrics"]
    assert food["main_metric"] == food["mean_per_class_recall"]
    coco = lines["meru/coco"]["metrics"]
    assert coco["main_metric"] == coco["image_retrieval_recall@5"]


def test_merus_suite_spaces_the_underscores_of_a_sets_class_names_where_datacomps_keeps_them():
    """VTAB's RESISC45 export names "baseball_diamond" (TFDS's label), MERU's list "baseball diamond"; CLIP's
    tokenizer reads the two as different tokens. DataComp's task scores the set as it is."""
    (meru,), (datacomp,) = select("meru/resisc45"), select("vtab/resisc45")
    found = ["airplane", "baseball_diamond", "ground_track_field"]
    assert meru.class_names(found) == ["airplane", "baseball diamond", "ground track field"]
    assert datacomp.class_names(found) == found
    (clevr,) = select("meru/clevr")
    assert clevr.class_names(["three"] * 8) == [str(n) for n in range(3, 11)]  # MERU's own list replaces the set's


def test_the_class_list_comparison_rebuilds_the_exporters_lists_as_its_builder_does(tmp_path):
    """tools/class_lists.py on a made-up TFDS tree and MERU file: Food-101 sorted as torchvision sorts it,
    SUN397's prefix cut and separators spaced, VTAB's RESISC45 kept as TFDS names it, CUB by number."""
    import subprocess
    import sys

    ic, ds = tmp_path / "tfds" / "image_classification", tmp_path / "tfds" / "datasets" / "resisc45"
    ic.mkdir(parents=True)
    ds.mkdir(parents=True)
    (ic / "food-101_classes.txt").write_text("cheesecake\ncheese_plate\napple_pie\n")
    (ic / "sun397_labels.txt").write_text("/a/abbey\n/j/jail/indoor\n/j/jail_cell\n")
    (ic / "cars196.py").write_text("_NAMES = ['AM General Hummer SUV 2000']\n")
    (ic / "dtd_key_attributes.txt").write_text("banded\n")
    (ds / "resisc45_dataset_builder.py").write_text("_LABELS = ['airplane', 'baseball_diamond']\n")
    meru = tmp_path / "class_names.py"
    meru.write_text("CLASS_NAMES = dict(food101=['apple pie', 'cheese plate', 'cheesecake'], "
                    "sun397=['abbey', 'jail cell', 'jail indoor'], cars=['am general hummer suv 2000'], "
                    f"dtd=['Banded'], resisc45=['airplane', 'baseball diamond'], cub2011={['a bird'] * 200!r}, "
                    "sst2=['negative', 'positive'], cifar10=[], cifar100=[], aircraft=[], stl10=[])\n")
    tool = Path(__file__).resolve().parents[1] / "tools" / "class_lists.py"
    out = subprocess.run([sys.executable, str(tool), "--meru", str(meru), "--tfds", str(tmp_path / "tfds")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in out.stdout.splitlines()[2:]}
    assert rows["food101"] == "equal" and rows["sst2"] == "equal" and rows["cifar10"] == "not compared"
    assert rows["sun397"] == ("the same names, 2 at other labels (label: exporter / MERU): 1: 'jail indoor' / "
                              "'jail cell'; 2: 'jail cell' / 'jail indoor'")
    assert rows["cars"] == rows["dtd"] == "equal up to case and spacing"
    assert rows["resisc45"].startswith("1 of 2 differ") and rows["cub2011"].startswith("200 of 200 differ")
    missing = subprocess.run([sys.executable, str(tool), "--meru", str(tmp_path / "nope.py"), "--tfds", str(tmp_path)],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "nope.py is missing" in missing.stderr
