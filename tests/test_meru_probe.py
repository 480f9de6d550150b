"""MERU's linear probes (its Table 7): the cost search against hand arithmetic, the probe on toy sets whose
answer is known, the features before the projection against each tower's own forward, and
``euclip eval --tasks meru-probe/...`` end to end on probe sets made from the embedded world."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.evaluate.probe import FIRST_PASS, linear_probe, search_cost, stratified_holdout
from tests.test_datacomp_eval import TINY
from tests.test_meru_suite import cached_features

runner = CliRunner()


def test_the_search_refines_around_the_first_passs_best_as_worked_out_by_hand():
    # Validation score peaking at C = 300 in log space. First pass: 1e2 is nearest (0.48 decades).
    # Steps: 10 and 1e3 lose to 1e2; 10^1.5 and 10^2.5 -> 10^2.5 (0.02 decades off); 10^2.25, 10^2.75 and
    # 10^2.375, 10^2.625 lose to it.
    best, score, tried = search_cost(lambda c: -abs(math.log10(c) - math.log10(300)))
    assert best == pytest.approx(10 ** 2.5) and score == pytest.approx(-abs(2.5 - math.log10(300)))
    assert len(tried) == len(FIRST_PASS) + 2 * 4
    # A flat score keeps the first C tried: a later one must be strictly better.
    assert search_cost(lambda c: 0.5)[0] == FIRST_PASS[0] == 1e-6


def blobs(n_per_class: int, noise_seed: int, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Three classes around fixed centres 10 apart on average, each point 0.5 from its centre per axis."""
    centres = np.random.default_rng(0).normal(size=(classes, 8)) * 10
    rng = np.random.default_rng(noise_seed)
    x = np.concatenate([c + 0.5 * rng.normal(size=(n_per_class, 8)) for c in centres])
    return x, np.repeat(np.arange(classes), n_per_class)


def test_a_separable_set_is_probed_perfectly_and_random_labels_at_chance():
    # Same centres, fresh noise per split: separable by a margin of many standard deviations.
    found = linear_probe(blobs(20, 1), blobs(20, 2), blobs(20, 3))
    assert found["mean_per_class_recall"] == 1.0 and found["acc1"] == 1.0
    assert (found["train"], found["val"], found["test"]) == (60, 60, 60)
    rng = np.random.default_rng(3)
    noise = [(rng.normal(size=(300, 8)), rng.integers(0, 2, 300)) for _ in range(3)]
    assert abs(linear_probe(*noise)["mean_per_class_recall"] - 0.5) < 0.12


def test_the_held_out_validation_keeps_every_class_on_both_sides_of_a_class_ordered_set():
    """Stored class by class (as Food-101's exporter writes it), a "last 10%" split would validate on the last
    class alone; the stratified draw holds out 10% of each, and the probe chooses C as on the shuffled set."""
    x, y = blobs(30, 1, classes=10)  # class-ordered: 30 of class 0, then 30 of class 1, ...
    held = stratified_holdout(y, 0.1)
    assert np.bincount(y[held]).tolist() == [3] * 10 and np.bincount(y[~held]).tolist() == [27] * 10
    assert (held == stratified_holdout(y, 0.1)).all()  # seeded: a rerun holds out the same images
    last = np.arange(len(y)) >= len(y) - 30
    assert set(y[last]) == {9}  # what the stored order's tail holds
    found = linear_probe((x[~held], y[~held]), (x[held], y[held]), blobs(30, 3, classes=10))
    order = np.random.default_rng(5).permutation(len(y))
    shuffled = linear_probe((x[order][~held], y[order][~held]), (x[order][held], y[order][held]), blobs(30, 3, classes=10))
    assert found["val_classes"] == shuffled["val_classes"] == 10
    assert found["mean_per_class_recall"] == shuffled["mean_per_class_recall"] == 1.0
    # A class of one image trains: it cannot be on both sides.
    assert not stratified_holdout(np.array([0, 1, 1, 1]), 0.5)[0]


def test_a_probe_sets_sizes_are_held_to_merus_table_6():
    """A set with its own val split matches split by split; one without, by train + val (euclip draws its own
    validation from it) and test."""
    from euclip_cli.evaluate.runner import meru_sizes
    from euclip_cli.protocol.tasks import TASKS, list_tasks
    from euclip_cli.published import meru_split_sizes

    table = meru_split_sizes()
    assert set(table) == {t.key.split("/", 1)[1] for t in list_tasks("meru-probe")}
    assert (table["food101"]["test"], table["caltech101"]["test"], table["flowers102"]["test"]) == (25250, 6084, 6149)
    food, cifar = TASKS["meru-probe/food101"], TASKS["meru-probe/cifar10"]
    assert meru_sizes(food, {"train": 68000, "val": 7750, "test": 25250}, own_val=False)["sizes_match_meru"]
    assert not meru_sizes(food, {"train": 68000, "val": 7750, "test": 25249}, own_val=False)["sizes_match_meru"]
    assert meru_sizes(cifar, {"train": 45000, "val": 5000, "test": 10000}, own_val=True)["sizes_match_meru"]
    assert not meru_sizes(cifar, {"train": 44000, "val": 6000, "test": 10000}, own_val=True)["sizes_match_meru"]


def test_the_features_before_the_projection_are_what_each_tower_projects():
    from euclip_cli import config as C
    from euclip_cli.model import initial_model
    from euclip_cli.towers import image_trunk_features

    images = torch.randn(2, 3, 224, 224)
    for recipe in ("tiny-meru", "meru-vit-s"):
        clip = initial_model(C.load_config(recipe)).clip.eval()
        with torch.no_grad():
            trunk = image_trunk_features(clip, images if recipe == "meru-vit-s" else images[:, :, :64, :64])
            projected = clip.visual(images if recipe == "meru-vit-s" else images[:, :, :64, :64])
            # The tower's own projection of these features is its output: a ViT's ``proj``, a timm head.
            mapped = trunk @ clip.visual.proj if recipe == "tiny-meru" else clip.visual.head(trunk)
        assert torch.allclose(mapped, projected, atol=1e-5)
        assert recipe == "tiny-meru" or trunk.shape[1] == 384 != projected.shape[1]  # ViT-S's width, not 512
        assert recipe == "meru-vit-s" or clip.visual.proj is not None  # put back after use


@pytest.fixture(scope="module")
def probe_sets(world, tmp_path_factory):
    """Food-101's probe set with train and test only, CIFAR-10's with its own val split: the world's Shapes
    images (train) and its shifted renderings (test), in clip-benchmark's layout."""
    root = tmp_path_factory.mktemp("probes")
    renderings = {"train": "shapes-outline", "val": "shapes-palette"}  # the same 12 classes, other images
    for key, splits in (("food101", ("train", "test")), ("cifar10", ("train", "val", "test"))):
        dest = root / f"wds_{key}_probe"
        shutil.copytree(world / "eval" / "shapes", dest)  # classnames and the test split
        for split in splits:
            if split != "test":
                shutil.copytree(world / "eval" / renderings[split] / "test", dest / split)
    # SUN397 as clip-benchmark's plain exporter writes it: the whole dataset as every split.
    shutil.copytree(world / "eval" / "shapes", root / "wds_sun397_probe")
    shutil.copytree(world / "eval" / "shapes" / "test", root / "wds_sun397_probe" / "train")
    return root


@pytest.mark.slow
def test_probes_run_through_eval_with_their_splits_and_cached_features(world, probe_sets, tmp_path):
    result = runner.invoke(app, ["train", "--recipe", "tiny-clip", f"data.train_dir={world / 'train'}", *TINY,
                                 "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = tmp_path / "tiny-clip"
    result = runner.invoke(app, ["eval", str(run), "--tasks", "meru-probe/food101,meru-probe/cifar10",
                                 "--eval-root", str(probe_sets)])
    assert result.exit_code == 0, result.output
    lines = {line["key"]: line["metrics"] for line in map(json.loads, (run / "eval.jsonl").read_text().splitlines())}
    food, cifar = lines["meru-probe/food101"], lines["meru-probe/cifar10"]
    n = food["test"]
    # Food-101 holds out 10% of each class of train for validation (each of the world's 12 shapes on both sides,
    # each class's share rounded: at most one image more per class); CIFAR-10's set has a val split of its own.
    assert food["val_classes"] == food["train_classes"] == 12 and food["train"] + food["val"] == n
    assert round(0.1 * n) <= food["val"] <= round(0.1 * n) + 12
    assert (cifar["train"], cifar["val"], cifar["test"]) == (n, n, n)
    assert food["test_in_train"] == cifar["test_in_train"] == 0
    # Beside MERU's Table 6: the world's stand-ins are not Food-101's 68,175 + 7,575 / 25,250.
    assert food["meru_sizes"] == {"train": 68175, "val": 7575, "test": 25250} and food["sizes_match_meru"] is False
    assert food["costs_tried"] == 15 and food["main_metric"] == food["mean_per_class_recall"] > 1 / 12
    features = cached_features(run)
    assert {"meru-probe__food101-train.pt", "meru-probe__food101-test.pt", "meru-probe__cifar10-val.pt"} <= features
    # A probe set whose train split is its test split is refused, naming the cause: it would score memory.
    result = runner.invoke(app, ["eval", str(run), "--tasks", "meru-probe/sun397", "--eval-root", str(probe_sets)])
    sun = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()][-1]
    assert result.exit_code == 1 and sun["key"] == "meru-probe/sun397" and sun["failed"]
    assert f"{n} of the {n} test images" in sun["error"] and "--dataset vtab/sun397" in sun["error"]
    result = runner.invoke(app, ["eval", str(run), "--tasks", "meru-probe/pets", "--eval-root", str(probe_sets)])
    assert "euclip download probesets --tasks meru-probe/pets --root EVAL_ROOT" in " ".join(result.output.split())


def test_check_sets_counts_each_split_against_merus_table_6_before_any_model(probe_sets, monkeypatch):
    """The world's stand-ins: 120 images a split, the world's 12 shapes; SUN397's as the plain exporter writes
    it (its test images are its train images); Pets not made."""
    from euclip_cli.evaluate import sets

    result = runner.invoke(app, ["eval", "--check-sets", "--tasks", "meru-probe/food101,meru-probe/cifar10,"
                                 "meru-probe/sun397,meru-probe/pets", "--eval-root", str(probe_sets)])
    out = " ".join(result.output.split())
    assert result.exit_code == 1 and "3 of 3 probe sets differ from MERU's Table 6" in out
    assert ("meru-probe/food101: train 120 (euclip holds out its val), test 120; MERU's 68,175 + 7,575 / 25,250: "
            "sizes DIFFER; 12 classes (MERU's 101); 0 test images also in train or val") in out
    assert "meru-probe/cifar10: train 120, val 120, test 120;" in out
    assert "meru-probe/sun397: train 120 (euclip holds out its val), test 120;" in out
    assert "120 test images also in train or val" in out
    assert "meru-probe/pets: missing in" in out and "euclip download probesets --tasks meru-probe/pets" in out
    # A set of MERU's sizes and classes passes: train + val against train alone where euclip holds out val.
    monkeypatch.setattr(sets, "meru_split_sizes", lambda: {"food101": {"classes": 12, "train": 108, "val": 12,
                                                                        "test": 120}})
    result = runner.invoke(app, ["eval", "--check-sets", "--tasks", "meru-probe/food101", "--eval-root", str(probe_sets)])
    assert result.exit_code == 0 and "sizes match; 12 classes (MERU's 12)" in result.output, result.output
    result = runner.invoke(app, ["eval", "--check-sets", "--tasks", "meru-probe/pets", "--eval-root", str(probe_sets)])
    assert result.exit_code == 2 and "no probe set of --tasks 'meru-probe/pets'" in result.output


def test_a_cut_shard_in_a_probe_set_is_named_with_what_to_do(probe_sets, tmp_path):
    copy = tmp_path / "probes"
    shutil.copytree(probe_sets / "wds_food101_probe", copy / "wds_food101_probe")
    (copy / "wds_food101_probe" / "train" / "0.tar").write_bytes(b"not a tar")
    result = runner.invoke(app, ["eval", "--check-sets", "--tasks", "meru-probe/food101", "--eval-root", str(copy)])
    assert result.exit_code == 2 and "train/0.tar is not a readable tar" in result.output
    assert "export the split again" in result.output and "Traceback" not in result.output


def test_probe_sets_are_made_by_clip_benchmarks_exporter_from_the_export_that_gives_merus_splits(tmp_path, monkeypatch):
    """clip-benchmark's builder stood in for (no dataset host here): its exporter writes the sets, each folder
    from the export docs/meru.md names, and --check-sets reads them back."""
    from clip_benchmark.datasets import builder
    from PIL import Image

    sizes, calls = {"trainval": 12, "train": 9, "val": 3, "test": 6}, []

    class StandIn(list):
        classes = ["a", "b", "c"]

    def build_dataset(name, root, split, transform, download):
        calls.append((name, split))
        if name == "cars":
            raise OSError("connection refused")
        start = 1000 * list(sizes).index(split)  # no image in two splits
        return StandIn((transform(Image.new("RGB", (8, 8), (i % 256, i // 256, 7))), i % 3)
                       for i in range(start, start + sizes[split]))

    monkeypatch.setattr(builder, "build_dataset", build_dataset)
    root, sources = tmp_path / "eval", tmp_path / "sources"
    args = ["download", "probesets", "--tasks", "meru-probe/pets,meru-probe/aircraft,meru-probe/sun397",
            "--root", str(root), "--sources", str(sources)]
    result = runner.invoke(app, args)
    out = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert calls == [("pets", "trainval"), ("pets", "test"), ("fgvc_aircraft", "train"), ("fgvc_aircraft", "val"),
                     ("fgvc_aircraft", "test")]
    assert "meru-probe/pets: 12 / 0 / 6 images, 3 classes; MERU's sizes DIFFER" in out
    assert "meru-probe/aircraft: 9 / 3 / 6 images, 3 classes" in out
    assert "meru-probe/sun397: no clip-benchmark export gives MERU's splits" in out
    assert (root / "wds_pets_probe" / "classnames.txt").read_text().split() == ["a", "b", "c"]
    result = runner.invoke(app, ["eval", "--check-sets", "--tasks", "meru-probe/pets", "--eval-root", str(root)])
    assert "train 12 (euclip holds out its val), test 6;" in result.output
    assert "0 test images also in train or val" in result.output
    # Made splits are kept; a set no export makes, asked for alone, is a usage error; a host that fails, a failure.
    calls.clear()
    assert runner.invoke(app, args).exit_code == 0 and calls == []
    result = runner.invoke(app, ["download", "probesets", "--tasks", "meru-probe/sun397", "--root", str(root)])
    assert result.exit_code == 2 and "docs/meru.md" in result.output
    result = runner.invoke(app, ["download", "probesets", "--tasks", "meru-probe/cars", "--root", str(root),
                                 "--sources", str(sources)])
    assert result.exit_code == 1 and "cars --split train could not be fetched" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_a_split_stopped_as_its_last_file_is_written_is_not_there_and_the_next_download_makes_it(tmp_path, monkeypatch):
    """The exporter writes a split's nshards.txt last, the mark of a made split, but in place: a stop between the
    file's opening and its write left it empty, and the split counted as made."""
    from clip_benchmark import webdataset_builder
    from clip_benchmark.datasets import builder
    from PIL import Image

    class StandIn(list):
        classes = ["a", "b"]

    monkeypatch.setattr(builder, "build_dataset", lambda name, root, split, transform, download: StandIn(
        (transform(Image.new("RGB", (8, 8), (i, 0, 0))), i % 2) for i in range(4)))
    convert = webdataset_builder.convert_dataset

    def stopped_as_it_marks_the_split(dataset, split, output_folder, **kwargs):
        convert(dataset, split, output_folder, **kwargs)
        (Path(output_folder) / split / "nshards.txt").write_text("")  # opened, not yet written
        raise KeyboardInterrupt()

    root = tmp_path / "eval"
    args = ["download", "probesets", "--tasks", "meru-probe/pets", "--root", str(root), "--sources", str(tmp_path)]
    with monkeypatch.context() as stopped:
        stopped.setattr(webdataset_builder, "convert_dataset", stopped_as_it_marks_the_split)
        result = runner.invoke(app, args)
    assert result.exit_code == 1 and "interrupted" in result.output
    assert not any((root / "wds_pets_probe").rglob("nshards.txt")), sorted((root / "wds_pets_probe").rglob("*"))
    assert not any(p.name.endswith(".partial") for p in (root / "wds_pets_probe").iterdir())
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [(root / "wds_pets_probe" / part / "nshards.txt").read_text() for part in ("train", "test")] == ["1\n"] * 2


def test_every_export_and_every_set_without_one_is_in_the_docs_table():
    from pathlib import Path

    from euclip_cli.download.probesets import EXPORTS, WITHOUT_EXPORT
    from euclip_cli.published import meru_split_sizes

    assert set(EXPORTS) | set(WITHOUT_EXPORT) == set(meru_split_sizes())
    table = (Path(__file__).resolve().parents[1] / "docs" / "meru.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    for export in EXPORTS.values():
        row = next(r for r in rows if f"`{export.dataset}`" in r.split("|")[2])
        assert all(f"`{split}`" in row.split("|")[3] for split in export.splits.values()), row
