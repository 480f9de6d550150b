"""MERU's published Tables 1, 2, 3 and 7 (``euclip_cli/published/meru-tables.csv``) and ``euclip report --table
meru``, which puts MERU-comparable runs beside their own rows."""

from __future__ import annotations

from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.protocol.tasks import TASKS
from euclip_cli.published import meru_imagenet, meru_tables
from euclip_cli.report.tables import MISSING, Run, meru_model, meru_table

runner = CliRunner()
COCO = "retrieval/mscoco_2014_5k_test_image_text_retrieval"


def test_every_published_model_has_every_column_of_each_table():
    rows = meru_tables()
    assert len(rows.groupby(["arch", "model"])) == 6
    for table, columns in ((1, 8), (2, 20), (7, 19)):
        per_model = rows[rows["table"] == table].groupby(["arch", "model"]).size()
        assert (per_model == columns).all(), table
    # Table 3: ViT-L's two models at five widths, COCO recall@5 both ways and ImageNet.
    widths = rows[rows["table"] == 3].groupby(["arch", "model", "embed_dim"]).size()
    assert len(widths) == 2 * 5 and (widths == 3).all()
    assert set(rows.loc[rows["table"] != 3, "embed_dim"]) == {512}
    # Each dataset's DataComp task is one the registry knows (CUB-2011 alone has none).
    tasks = set(rows["datacomp_task"]) - {""}
    assert tasks <= set(TASKS) and set(rows.loc[rows["datacomp_task"] == "", "dataset"]) == {"CUB-2011"}
    assert rows["value"].between(0, 100).all()


def test_the_near_chance_columns_are_near_chance():
    """The check on the column order (the headings are not in the paper's text): Table 2's caption says its
    last four datasets are near random for every model; chance is 1/classes."""
    rows = meru_tables()
    zero_shot = rows[rows["table"] == 2]
    for dataset, classes in (("MNIST", 10), ("CLEVR Counts", 8), ("PCAM", 2), ("SST2", 2)):
        values = zero_shot.loc[zero_shot["dataset"] == dataset, "value"]
        assert (abs(values - 100 / classes) < 10).all(), dataset


def test_table_threes_widest_models_are_the_vit_l_rows_of_tables_one_and_two():
    """Table 3's 512 column is the ViT-L/16 models the narrower ones start from: the same numbers transcribed
    from Tables 1 and 2 (a check on either transcription)."""
    rows = meru_tables()
    key = ["model", "dataset", "metric"]
    widest = rows[(rows["table"] == 3) & (rows["embed_dim"] == 512)].set_index(key)["value"]
    full = rows[rows["table"].isin([1, 2]) & (rows["arch"] == "meru-vit-l")].set_index(key)["value"]
    assert len(widest) == 6 and (full.loc[widest.index] == widest).all()


def test_imagenet_is_table_twos_first_column():
    imagenet = meru_imagenet().set_index(["arch", "model"])["imagenet"]
    assert imagenet[("meru-vit-s", "MERU")] == 34.4 and imagenet[("meru-vit-l", "CLIP baseline")] == 38.4
    assert len(imagenet) == 6


def run(name, arch, geometry, results, imported=None, model=None, **towers):
    config = {"model": {"arch": arch, **towers}, "geometry": {"name": geometry}}
    meta = {"format": imported, "model": model} if imported else None
    return Run(name, "", config, {}, imported, meta, results)


def test_a_meru_run_sits_beside_its_own_rows_of_each_table():
    imported = run("meru-s", "meru-vit-s", "hyperbolic",
                   {"imagenet1k": {"mean_per_class_recall": 0.35, "acc1": 0.5},
                    COCO: {"image_retrieval_recall@5": 0.3}}, imported="meru", model="MERU")
    trained = run("clip-b", "meru-vit-b", "clip", {})
    other = run("tiny", "world-vit", "hyperbolic", {"imagenet1k": {"mean_per_class_recall": 0.1}})
    assert [meru_model(r) for r in (imported, trained, other)] == ["MERU", "CLIP baseline", None]
    table = meru_table([imported, trained, other])
    assert set(table["run"]) == {"meru-s", "clip-b"} and set(table["table"]) == {"Table 1", "Table 2", "Table 7"}
    mine = table[table["run"] == "meru-s"].set_index(["dataset", "metric"])
    assert len(mine) == 8 + 20 + 19
    imagenet = mine.loc[("ImageNet", "mean_per_class_recall")]
    assert imagenet["MERU"] == 34.4 and imagenet["ours"] == "35.00" and imagenet["Δ"] == "+0.60"
    coco = mine.loc[("COCO", "image_retrieval_recall@5")]
    assert coco["MERU"] == 30.5 and coco["Δ"] == "-0.50"
    assert mine.loc[("CUB-2011", "mean_per_class_recall"), "ours"] == MISSING  # DataComp has no CUB task
    assert (table.loc[table["run"] == "clip-b", "ours"] == MISSING).all()


def test_without_a_meru_run_the_report_writes_the_published_rows_and_says_what_fills_them(tmp_path):
    result = runner.invoke(app, ["report", "--table", "meru", "--runs-dir", str(tmp_path / "runs"),
                                 "--studies-dir", str(tmp_path), "--out", str(tmp_path / "tables")])
    assert result.exit_code == 0, result.output
    assert "euclip import meru" in " ".join(result.output.split())
    written = (tmp_path / "tables" / "meru.md").read_text()
    assert written.count("| missing") >= 282 and "CUB-2011" in written
    assert len(meru_table([])) == len(meru_tables()) == 282 + 30


def test_the_report_pages_reference_holds_meru_with_one_row_per_dataset_and_metric_and_a_column_per_model():
    from euclip_cli.report.tables import published_reference

    (title, folded), = [(t, df) for t, df in published_reference() if t.startswith("MERU's")]
    assert len(folded) == 8 + 20 + 19 + 3 * 5 and len(folded.columns) == 4 + 6
    assert folded.columns.name is None  # a named column axis renders as a header cell over nothing
    row = folded[(folded["table"] == "Table 2") & (folded["dataset"] == "ImageNet")].iloc[0]
    assert row["MERU meru-vit-b"] == 37.5 and row["CLIP baseline meru-vit-s"] == 34.3


def test_a_run_of_frozen_towers_sits_beside_table_threes_row_of_its_width():
    results = {"meru/imagenet": {"mean_per_class_recall": 0.31}, "meru/coco": {"image_retrieval_recall@5": 0.27}}
    frozen = dict(init_from="meru-vit-l", freeze_towers=True)
    narrow = run("meru-w64", "meru-vit-l", "hyperbolic", results, embed_dim=64, **frozen)
    widest = run("clip-w512", "meru-vit-l", "clip", results, **frozen)
    odd = run("meru-w200", "meru-vit-l", "hyperbolic", results, embed_dim=200, **frozen)
    whole = run("meru-l-64", "meru-vit-l", "hyperbolic", results, embed_dim=64)  # trained whole: in no table
    table = meru_table([narrow, widest, odd, whole])
    assert set(table["run"]) == {"meru-w64", "clip-w512"} and set(table["table"]) == {"Table 3"}
    mine = table[table["run"] == "meru-w64"].set_index(["dataset", "metric"])
    assert len(mine) == 3 and set(mine["embed_dim"]) == {64}
    assert mine.loc[("ImageNet", "mean_per_class_recall"), ["MERU", "ours", "Δ"]].tolist() == [32.3, "31.00", "-1.30"]
    assert mine.loc[("COCO", "image_retrieval_recall@5"), ["MERU", "Δ"]].tolist() == [26.5, "+0.50"]
    assert mine.loc[("COCO", "text_retrieval_recall@5"), "ours"] == MISSING
    assert table.loc[table["run"] == "clip-w512", "MERU"].tolist() == [31.7, 40.6, 38.4]


def test_merus_own_suite_is_preferred_to_datacomps_task_where_the_run_has_both():
    results = {"imagenet1k": {"mean_per_class_recall": 0.30}, "meru/imagenet": {"mean_per_class_recall": 0.36},
               "food101": {"mean_per_class_recall": 0.70}, "meru-probe/food101": {"mean_per_class_recall": 0.86}}
    table = meru_table([run("meru-s", "meru-vit-s", "hyperbolic", results, imported="meru", model="MERU")])
    rows = table.set_index(["dataset", "metric"])
    assert rows.loc[("ImageNet", "mean_per_class_recall"), ["ours", "protocol"]].tolist() == ["36.00", "MERU's"]
    assert rows.loc[("Food-101", "mean_per_class_recall"), ["ours", "protocol"]].tolist() == ["70.00", "DataComp's"]
    assert rows.loc[("CUB-2011", "mean_per_class_recall"), "protocol"] == MISSING
    # Table 7: the probe of MERU's suite, beside its 85.2 (MERU ViT-S/16, Food-101); no DataComp stand-in.
    probe = rows.loc[("Food-101", "linear_probe_mean_per_class")]
    assert probe[["ours", "protocol", "Δ"]].tolist() == ["86.00", "MERU's", "+0.80"]
    assert rows.loc[("CIFAR-10", "linear_probe_mean_per_class"), "ours"] == MISSING
