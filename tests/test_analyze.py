"""``euclip analyze distances | isotropy`` on tiny trained runs: results, figures and invariants."""

import json

import pytest
from typer.testing import CliRunner

from euclip_cli.cli import app

pytestmark = pytest.mark.slow
runner = CliRunner()
TINY = ["data.batch_size=32", "optim.samples=128", "optim.warmup_steps=2", "train.precision=fp32",
        "train.tensorboard=false", "data.shuffle_buffer=100"]


@pytest.fixture(scope="module")
def runs(world, tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    for recipe in ("tiny-clip", "tiny-meru"):
        result = runner.invoke(app, ["train", "--recipe", recipe, f"data.train_dir={world / 'train'}", *TINY,
                                     "--runs-dir", str(folder)])
        assert result.exit_code == 0, result.output
    return folder


def analyze(runs, world, *args):
    result = runner.invoke(app, ["analyze", *args, "--world", str(world), "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    return result


def test_distances_write_results_and_figures(runs, world):
    analyze(runs, world, "distances", "tiny-meru")
    folder = runs / "tiny-meru" / "analysis"
    study = json.loads((folder / "distances.json").read_text())
    assert study["root_norm"] == 0.0  # hyperbolic [ROOT] is the origin
    assert set(study["arrays"]) == {"root", "average"} and study["references"]["average"]["norm"] > 0
    assert len(study["arrays"]["root"]["image"]) == len(study["arrays"]["root"]["text"]) == 120
    assert 0 <= study["auc_text_closer"] <= 1
    assert (folder / "distances.png").stat().st_size > 1000 and (folder / "distances.pdf").exists()
    analyze(runs, world, "distances", "tiny-clip")
    clip = json.loads((runs / "tiny-clip" / "analysis" / "distances.json").read_text())
    assert 0 < clip["root_norm"] <= 1  # the mean of unit vectors
    assert set(clip["arrays"]) == {"root"}  # for spherical geometries [ROOT] is the average


def test_isotropy_rows_obey_the_transforms_invariants(runs, world):
    analyze(runs, world, "isotropy", "tiny-clip", "--k", "16")
    study = json.loads((runs / "tiny-clip" / "analysis" / "isotropy.json").read_text())
    rows = study["transforms"]
    assert set(rows) == {"none", "whitening-16", "pca-16", "procrustes text->image", "lstsq text->image"}
    # For the clip geometry, cosine zero-shot on untransformed embeddings is the geometry's own rule.
    assert rows["none"]["zero_shot"] == pytest.approx(study["zero_shot_own_geometry"])
    assert len(rows["none"]["zero_shot"]) == 9  # every classification task of the world
    # Procrustes and least squares map captions only: the image rows are untouched.
    for name in ("procrustes text->image", "lstsq text->image"):
        assert rows[name]["I1_image"] == rows["none"]["I1_image"] and rows[name]["I2_image"] == rows["none"]["I2_image"]
    # Procrustes is fitted to bring captions onto their images: held-out pairs get closer.
    assert rows["procrustes text->image"]["pair_cosine"] > rows["none"]["pair_cosine"]
    assert all(0 <= r["I1_image"] <= 1 and r["I2_image"] >= 0 for r in rows.values())
    assert len(study["spectra"]["image"]) == 120  # min(pairs, embedding size)
    assert (runs / "tiny-clip" / "analysis" / "isotropy_spectra.png").exists()


def test_html_report_is_one_self_contained_page_with_every_table_and_figure(runs, world, tmp_path):
    from html.parser import HTMLParser

    result = runner.invoke(app, ["eval", str(runs / "tiny-clip"), str(runs / "tiny-meru"), "--tasks", "world:main",
                                 "--world", str(world)])
    assert result.exit_code == 0, result.output
    analyze(runs, world, "distances", "tiny-meru")
    out = tmp_path / "tables"
    result = runner.invoke(app, ["report", "--format", "html", "--runs-dir", str(runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert [p.name for p in out.iterdir()] == ["report.html"]
    page = (out / "report.html").read_text()

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.headings, self.images, self.tables, self.open = [], [], 0, None

        def handle_starttag(self, tag, attrs):
            self.open = tag
            if tag == "img":
                self.images.append(dict(attrs)["src"])
            self.tables += tag == "table"

        def handle_data(self, data):
            if self.open == "h2":
                self.headings.append(data)

    parsed = Collect()
    parsed.feed(page)
    for title in ("Embedded world", "Paper Table 1", "Paper Table 4", "Paper Table 5", "Paper Table 8"):
        assert any(h.startswith(title) for h in parsed.headings), title
    assert parsed.tables >= 5  # the embedded table plus the paper's four, published rows kept even without runs
    assert parsed.images and all(src.startswith("data:image/png;base64,") for src in parsed.images)
    assert len(parsed.images) >= 3  # training curves, per-group bars, the distance histogram
    assert "tiny-meru" in page and "missing" in page


def test_traverse_scores_traversals_against_the_worlds_hierarchy(runs, world):
    result = analyze(runs, world, "traverse", "tiny-meru", "--images", "20", "--entail", "0.1")
    study = json.loads((runs / "tiny-meru" / "analysis" / "traverse.json").read_text())
    assert set(study["filters"]) == {"none", "K=0.1"} and study["images"] == 20
    plain = study["filters"]["none"]
    assert plain["captions_per_image"] >= 1 and 0 <= plain["precision"] <= 1 and 0 <= plain["generic_order"] <= 1
    assert len(plain["examples"]) == 5 and all(e["captions"] for e in plain["examples"])
    test = study["entailment_test"]["K=0.1"]
    assert 0 <= test["precision"] <= 1 and 0 <= test["recall"] <= 1 and 0 < test["true_share"] < 1
    assert "image 0:" in result.output  # example traversals are printed

    refused = runner.invoke(app, ["analyze", "traverse", "tiny-clip", "--entail", "0.1", "--world", str(world),
                                  "--runs-dir", str(runs)])
    assert refused.exit_code == 2 and "no entailment cones" in refused.output


def test_distances_over_the_training_set(runs, world):
    analyze(runs, world, "distances", "tiny-clip", "--split", "train", "--samples", "100")
    study = json.loads((runs / "tiny-clip" / "analysis" / "distances_train.json").read_text())
    assert study["split"] == "train" and len(study["arrays"]["root"]["image"]) == 100
    assert (runs / "tiny-clip" / "analysis" / "distances_train.png").exists()


def test_traverse_a_folder_of_images_over_a_meru_style_vocabulary(runs, world, tmp_path):
    import tarfile

    images = tmp_path / "images"
    images.mkdir()
    with tarfile.open(world / "eval" / "shapes" / "test" / "0.tar") as tar:
        for member in [m for m in tar.getmembers() if m.name.endswith(".jpg")][:3]:
            (images / member.name).write_bytes(tar.extractfile(member).read())
    (tmp_path / "nouns.txt").write_text("star\ncircle\n# a comment\nshape\n")
    (tmp_path / "adjectives.txt").write_text("red\nsmall\n")
    analyze(runs, world, "traverse", "tiny-meru", "--image-dir", str(images), "--nouns", str(tmp_path / "nouns.txt"),
            "--adjectives", str(tmp_path / "adjectives.txt"), "--entail", "0.3")
    study = json.loads((runs / "tiny-meru" / "analysis" / "traverse_custom.json").read_text())
    assert study["images"] == 3 and study["vocabulary"] == 5
    vocabulary = {"a photo of a star.", "a photo of a circle.", "a photo of a shape.", "this photo is red.",
                  "this photo is small."}
    for name in ("none", "K=0.3"):
        traversals = study["filters"][name]["traversals"]
        assert len(traversals) == 3 and all(set(seq) <= vocabulary for seq in traversals.values())
    assert all(study["filters"]["none"]["traversals"].values())  # unfiltered, every step has a nearest caption
