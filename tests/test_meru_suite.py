"""MERU's evaluation suite (``euclip eval --tasks meru``): its 20 zero-shot datasets and 2 retrieval sets
read from DataComp's evaluation sets with MERU's prompts, on stand-ins made from the embedded world."""

from __future__ import annotations

import json
import tomllib

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


@pytest.mark.slow
def test_the_whole_suite_scores_with_merus_prompts_and_shares_the_image_features(trained, meru_sets, monkeypatch):
    import euclip_cli.evaluate.runner as evaluation

    embedded = []
    real = evaluation.embed_texts
    monkeypatch.setattr(evaluation, "embed_texts", lambda model, tok, texts: embedded.append(texts) or real(model, tok, texts))
    result = runner.invoke(app, ["eval", str(trained), "--tasks", "food101", "--eval-root", str(meru_sets)])
    assert result.exit_code == 0, result.output
    cached = {p.name for p in (trained / "features").rglob("*.pt")}
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
    after = {p.name for p in (trained / "features").rglob("*.pt")}
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
