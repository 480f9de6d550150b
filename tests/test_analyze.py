"""``euclip analyze distances | isotropy`` on tiny trained runs: results, figures and invariants."""

import io
import json
import math
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from euclip_cli.cli.main import app

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
    folder = runs / "tiny-meru" / "analysis"
    analyze(runs, world, "distances", "tiny-meru", "--protocol", "euclip")
    geodesic = json.loads((folder / "distances.json").read_text())
    analyze(runs, world, "distances", "tiny-meru")
    study = json.loads((folder / "distances.json").read_text())
    assert study["protocol"] == "paper" and study["root_norm"] == 0.0  # hyperbolic [ROOT] is the origin
    assert set(study["arrays"]) == {"root", "average"} and study["references"]["average"]["norm"] > 0
    assert len(study["arrays"]["root"]["image"]) == len(study["arrays"]["root"]["text"]) == 120
    assert 0 <= study["auc_text_closer"] <= 1
    assert (folder / "distances.png").stat().st_size > 1000 and (folder / "distances.pdf").exists()
    # MERU's axis is ||x_space|| = sinh(sqrt(c) d) / sqrt(c) of the geodesic d = ||v||.
    c = json.loads((runs / "tiny-meru" / "metrics.jsonl").read_text().splitlines()[-1])["curvature"]
    for modality in ("image", "text"):
        expected = [math.sinh(math.sqrt(c) * d) / math.sqrt(c) for d in geodesic["arrays"]["root"][modality]]
        assert study["arrays"]["root"][modality] == pytest.approx(expected, rel=1e-4)

    analyze(runs, world, "distances", "tiny-clip", "--protocol", "euclip")
    clip = json.loads((runs / "tiny-clip" / "analysis" / "distances.json").read_text())
    assert 0 < clip["root_norm"] < 1  # the plain mean of the analysed unit vectors
    assert set(clip["arrays"]) == {"root"}  # for spherical geometries [ROOT] is the average
    analyze(runs, world, "distances", "tiny-clip")
    clip = json.loads((runs / "tiny-clip" / "analysis" / "distances.json").read_text())
    assert clip["root_norm"] == pytest.approx(1) and 0 < clip["average_norm"] < 1  # normalised training mean
    assert clip["root_pairs"] == 1500  # the session world has fewer training pairs than the 5,000 asked for
    assert all(0 <= d <= 1 for m in ("image", "text") for d in clip["arrays"]["root"][m])  # the papers' scale


def test_the_paper_root_of_clip_is_the_normalised_mean_of_training_embeddings(runs, world):
    """Recomputed from the first training shard read with tarfile, independently of the loader."""
    import tarfile

    import torch
    from PIL import Image

    from euclip_cli.analysis.embeddings import paper_root
    from euclip_cli.encode import embed_texts, load_model
    from euclip_cli.rundir import RunDir
    from euclip_cli.towers import tokenizer_for, transforms_for

    run = runs / "tiny-clip"
    root, reference = paper_root(run, torch.device("cpu"), 40)
    model, cfg, _, _ = load_model(RunDir(run), torch.device("cpu"))
    _, transform = transforms_for(model.clip)
    samples: dict[str, dict] = {}
    with tarfile.open(sorted((world / "train").glob("*.tar"))[0]) as tar:
        for member in tar.getmembers():
            key, ext = member.name.split(".", 1)
            if len(samples) == 40 and key not in samples:
                break
            samples.setdefault(key, {})[ext] = tar.extractfile(member).read()
    images = torch.stack([transform(Image.open(io.BytesIO(s["jpg"])).convert("RGB")) for s in samples.values()])
    with torch.no_grad():
        image = model.encode_image(images)
        text = embed_texts(model, tokenizer_for(cfg.model.arch), [s["txt"].decode() for s in samples.values()])
    mean = torch.cat([image, text]).mean(dim=0)
    torch.testing.assert_close(root, mean / mean.norm(), atol=1e-5, rtol=1e-5)
    assert len(reference) == 80


def test_isotropy_rows_obey_the_transforms_invariants(runs, world):
    analyze(runs, world, "isotropy", "tiny-clip", "--k", "16")
    study = json.loads((runs / "tiny-clip" / "analysis" / "isotropy.json").read_text())
    rows = study["transforms"]
    assert study["protocol"] == "paper" and study["eigenvector_signs"] == "one"
    assert set(rows) == {"none", "centering", "whitening-16", "pca-16", "procrustes text->image", "lstsq text->image"}
    # Table 2's rows: the CLIP loss on both halves; the modalities are told apart by both classifiers.
    assert all(r["clip_loss_fit"] > 0 and r["clip_loss_test"] > 0 for r in rows.values())
    assert rows["none"]["separability"] > 0.9 and rows["none"]["separability_svc"] > 0.9
    # Centering only moves each point: the pairs' loss changes, the spectrum of the centred set is flatter.
    assert rows["centering"]["I1_image"] > rows["none"]["I1_image"]
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
    # No studies (the working tree's results/studies may hold some).
    result = runner.invoke(app, ["report", "--format", "html", "--runs-dir", str(runs), "--out", str(out),
                                 "--studies-dir", str(tmp_path / "no-studies")])
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
    # The paper's tables have no rows with a run of ours here: they sit whole in the closed reference section.
    assert parsed.headings[0].startswith("Embedded world") and not any("Paper Table" in h for h in parsed.headings)
    assert "Figures of your runs" in parsed.headings and "<details><summary>Published numbers" in page
    assert parsed.tables >= 2
    assert parsed.images and all(src.startswith("data:image/png;base64,") for src in parsed.images)
    assert len(parsed.images) >= 3  # training curves, per-group bars, the distance histogram
    assert "tiny-meru" in page and "ViT-B-16 EuCLIP" in page


def test_traverse_scores_traversals_against_the_worlds_hierarchy(runs, world):
    result = analyze(runs, world, "traverse", "tiny-meru", "--images", "20", "--entail", "0.1")
    study = json.loads((runs / "tiny-meru" / "analysis" / "traverse.json").read_text())
    assert set(study["filters"]) == {"none", "K=0.1"} and study["images"] == 20
    plain = study["filters"]["none"]
    assert study["protocol"] == "paper" and study["root_in_pool"]
    assert 0 <= plain["captions_per_image"] and 0 <= plain["precision"] <= 1 and 0 <= plain["generic_order"] <= 1
    # [ROOT] is a candidate: every walk meets it (the last point is [ROOT] itself), and it is not counted.
    assert len(plain["examples"]) == 5 and all("[ROOT]" in e["captions"] for e in plain["examples"])
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


def test_traverse_a_folder_of_images_over_merus_text_pool_beside_tables_6_and_7(runs, world, tmp_path):
    import tarfile

    images = tmp_path / "images"
    images.mkdir()
    with tarfile.open(world / "eval" / "shapes" / "test" / "0.tar") as tar:
        for member in [m for m in tar.getmembers() if m.name.endswith(".jpg")][:3]:
            (images / member.name).write_bytes(tar.extractfile(member).read())
    pool = tmp_path / "pexels_text.json"
    pool.write_text(json.dumps({"captions": ["a red star on a grey background "], "nouns": ["star", "circle", "shape"],
                                "adjectives": ["red", "small"]}))
    analyze(runs, world, "traverse", "tiny-meru", "--image-dir", str(images), "--text-pool", str(pool),
            "--entail", "0.3")
    study = json.loads((runs / "tiny-meru" / "analysis" / "traverse_custom.json").read_text())
    assert study["images"] == 3 and study["vocabulary"] == 6 and study["protocol"] == "paper"
    vocabulary = {"a red star on a grey background ", "a photo of a star.", "a photo of a circle.",
                  "a photo of a shape.", "this photo is red.", "this photo is small.", "[ROOT]"}
    for name in ("none", "K=0.3"):
        row = study["filters"][name]
        traversals = row["traversals"]
        assert len(traversals) == 3 and all(set(seq) <= vocabulary and "[ROOT]" in seq for seq in traversals.values())
        assert row["captions_per_image"] == pytest.approx(sum(len(seq) - 1 for seq in traversals.values()) / 3)

    result = runner.invoke(app, ["report", "--table", "traversal", "--runs-dir", str(runs), "--out",
                                 str(tmp_path / "tables")])
    assert result.exit_code == 0, result.output
    table = (tmp_path / "tables" / "traversal.md").read_text()
    meru = [line for line in table.splitlines() if "Table 6: MERU" in line and "| none " in line]
    folder = [line for line in meru if "images (3)" in line]  # beside the world's traversal, named apart
    assert len(folder) == 1
    cells = [c.strip() for c in folder[0].strip("|").split("|")]
    assert cells[2] == "1.783" and cells[3] == "tiny-meru" and cells[5] == "paper"  # published, run, protocol
    assert float(cells[6]) == pytest.approx(study["filters"]["none"]["captions_per_image"], abs=5e-4)
    assert any("Table 7" in line and "missing" in line for line in table.splitlines())
    assert any("K=0.3" in line and "tiny-meru" in line for line in table.splitlines())  # no published row: kept

    refused = runner.invoke(app, ["analyze", "traverse", "tiny-meru", "--image-dir", str(images), "--nouns",
                                  str(pool), "--text-pool", str(pool), "--runs-dir", str(runs)])
    assert refused.exit_code == 2 and "one or the other" in refused.output


EXPECTED = Path(__file__).parent / "expected" / "analyses.json"


def _key_numbers(runs: Path) -> dict:
    """The analyses' headline numbers on the fixture runs, as the README's tables quote them."""
    def read(run, name):
        return json.loads((runs / run / "analysis" / f"{name}.json").read_text())

    numbers = {}
    for run in ("tiny-clip", "tiny-meru"):
        d = read(run, "distances")["references"]
        numbers[f"{run} distances"] = {f"{ref} {k}": v for ref, r in d.items()
                                       for k, v in (("image", r["image"]["mean"]), ("text", r["text"]["mean"]),
                                                    ("auc", r["auc_text_closer"]), ("norm", r["norm"]))}
    iso = read("tiny-clip", "isotropy")["transforms"]
    numbers["tiny-clip isotropy"] = {f"{t} {k}": row[k] for t, row in iso.items()
                                     for k in ("I1_image", "I2_image", "I1_text", "I2_text", "pair_cosine",
                                               "clip_loss_test", "zero_shot_mean")}
    walk = read("tiny-meru", "traverse")["filters"]
    numbers["tiny-meru traverse"] = {f"{f} {k}": row[k] for f, row in walk.items()
                                     for k in ("captions_per_image", "no_caption")}
    return numbers


def test_the_analyses_numbers_match_the_stored_expected_file(runs, world):
    """A regression check: a change to an analysis that moves its numbers must update this file
    (``EUCLIP_WRITE_EXPECTED=1 pytest tests/test_analyze.py``) and the README's quoted numbers with it.
    Tolerances allow for float rounding across CPUs (the fixture trains for four steps)."""
    for run in ("tiny-clip", "tiny-meru"):
        analyze(runs, world, "distances", run)
    analyze(runs, world, "isotropy", "tiny-clip", "--k", "16")
    analyze(runs, world, "traverse", "tiny-meru", "--images", "20", "--entail", "0.1")
    numbers = _key_numbers(runs)
    if os.environ.get("EUCLIP_WRITE_EXPECTED") == "1":
        EXPECTED.write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")
    expected = json.loads(EXPECTED.read_text())
    assert set(numbers) == set(expected)
    for group, values in expected.items():
        assert set(numbers[group]) == set(values), group
        for key, value in values.items():
            # Traversal counts move in steps of 1/20 when one near-tied step flips.
            tolerance = {"abs": 0.1} if "traverse" in group else {"rel": 1e-2, "abs": 1e-4}
            assert numbers[group][key] == pytest.approx(value, **tolerance), f"{group}: {key}"


def test_equilibrium_writes_curves_per_shuffle_and_batch_size_and_a_figure(runs):
    result = runner.invoke(app, ["analyze", "equilibrium", "tiny-clip", "--batch-sizes", "16,32", "--samples", "64",
                                 "--batches", "2", "--temperatures", "1,100,5", "--shuffle", "0,50",
                                 "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    folder = runs / "tiny-clip" / "analysis"
    study = json.loads((folder / "equilibrium.json").read_text())
    assert [(c["shuffle_percent"], c["batch_size"]) for c in study["curves"]] == [(0, 16), (50, 16), (0, 32), (50, 32)]
    # The grid's 5 points and the run's own temperature.
    assert all(len(c["points"]) == 6 for c in study["curves"]) and study["pairs"] == 64
    for curve in study["curves"]:
        for p in curve["points"]:
            assert p["align"] + p["uniform"] == pytest.approx(p["loss"], rel=1e-9, abs=1e-9)
    beta = json.loads((runs / "tiny-clip" / "metrics.jsonl").read_text().splitlines()[-1])["logit_scale"]
    assert study["learned_temperature"] == pytest.approx(beta, rel=1e-5)
    assert (folder / "equilibrium.png").stat().st_size > 1000
    # The report reads it back as numbers: one row per curve, the run's own β and its ratio there.
    out = runs.parent / "equilibrium-tables"
    report = runner.invoke(app, ["report", "--table", "equilibrium", "--runs-dir", str(runs), "--out", str(out)])
    assert report.exit_code == 0, report.output
    lines = [l for l in (out / "equilibrium.md").read_text().splitlines() if l.startswith("| tiny-clip")]
    assert len(lines) == 4
    first = study["curves"][0]
    ratio = next(p["ratio"] for p in first["points"] if p["temperature"] == study["learned_temperature"])
    eq = first["equilibrium_temperature"]
    learned, shuffled, batch, equilibrium, at = [c.strip() for c in lines[0].strip("|").split("|")][2:]
    assert float(learned) == pytest.approx(study["learned_temperature"], abs=0.005)
    assert (shuffled, batch) == ("0", "16") and float(at) == pytest.approx(ratio, abs=5e-4)
    assert equilibrium == "above the grid" if eq is None else float(equilibrium) == pytest.approx(eq, abs=0.005)


@pytest.mark.parametrize("args,needle", [(["--shuffle", "0,150"], "--shuffle"), (["--batch-sizes", "1"], "--batch-sizes"),
                                         (["--temperatures", "100,1,5"], "--temperatures"),
                                         (["--batch-sizes", "128", "--samples", "64"], "--samples 64"),
                                         (["--batch-sizes", "a,b"], "--batch-sizes")])
def test_equilibrium_refuses_bad_options_in_one_line(runs, args, needle):
    result = runner.invoke(app, ["analyze", "equilibrium", "tiny-clip", *args, "--runs-dir", str(runs)])
    assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output


def test_distances_with_init_write_what_the_two_commands_write(runs, world, tmp_path):
    """One process for a study's pair (the trained model, then its control): the same two results as the command
    without and with --at-init, figures included; both flags at once is a usage error."""
    copy = tmp_path / "runs"
    shutil.copytree(runs / "tiny-meru", copy / "tiny-meru")
    analyze(copy, world, "distances", "tiny-meru", "--with-init")
    folder = copy / "tiny-meru" / "analysis"
    analyze(runs, world, "distances", "tiny-meru")
    analyze(runs, world, "distances", "tiny-meru", "--at-init")
    for name in ("distances.json", "distances_init.json"):
        assert json.loads((folder / name).read_text()) == json.loads((runs / "tiny-meru" / "analysis" / name).read_text())
        assert (folder / name).with_suffix(".png").exists()
    both = runner.invoke(app, ["analyze", "distances", "tiny-meru", "--at-init", "--with-init", "--runs-dir", str(runs)])
    assert both.exit_code == 2 and "--with-init" in both.output


def test_distances_at_init_measure_the_model_the_run_started_from(runs, world, tmp_path):
    import torch

    from euclip_cli import config as C
    from euclip_cli.model import initial_model

    analyze(runs, world, "distances", "tiny-meru", "--at-init")
    folder = runs / "tiny-meru" / "analysis"
    untrained = json.loads((folder / "distances_init.json").read_text())
    assert untrained["at_init"] is True and (folder / "distances_init.png").exists()
    analyze(runs, world, "distances", "tiny-meru")
    trained = json.loads((folder / "distances.json").read_text())
    assert untrained["arrays"]["root"]["image"] != trained["arrays"]["root"]["image"]
    # The trainer starts from initial_model: one step at a learning rate of 1e-30 (AdamW moves a weight
    # by about the rate, and scales its decay by it) leaves the weights where initial_model puts them.
    tiny = [o for o in TINY if not o.startswith("optim.samples")]
    result = runner.invoke(app, ["train", "--recipe", "tiny-meru", f"data.train_dir={world / 'train'}", *tiny,
                                 "optim.samples=32", "optim.lr=1e-30", "train.seed=3", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    from euclip_cli.rundir import RunDir

    (ckpt,) = RunDir(tmp_path / "tiny-meru-seed3").checkpoints()
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    start = initial_model(C.from_dict(state["config"])).state_dict()
    assert start.keys() == state["model"].keys()
    assert all(torch.allclose(start[k], state["model"][k], rtol=0, atol=1e-20) for k in start)
    other = initial_model(C.from_dict({**state["config"], "train": {**state["config"]["train"], "seed": 4}})).state_dict()
    assert any(not torch.equal(other[k], start[k]) for k in start)  # the seed fixes the start


@pytest.mark.parametrize("run", ["tiny-clip", "tiny-meru"])
def test_hierarchy_scores_the_runs_own_predictions_in_the_worlds_tree(runs, world, run):
    """Its accuracy is the evaluator's (a separate path: clip-benchmark's loader and euclip's zero-shot
    classifier), and its tree metrics lie between a perfect classifier's and the bounds of the tree."""
    from euclip_cli.rundir import RunDir

    analyze(runs, world, "hierarchy", run)
    found = json.loads((runs / run / "analysis" / "hierarchy.json").read_text())
    assert list(found["tasks"]) == ["world/shapes", "world/shapes-outline", "world/shapes-palette",
                                    "world/shapes-clutter"]
    result = runner.invoke(app, ["eval", str(runs / run), "--tasks", "world/shapes", "--world", str(world)])
    assert result.exit_code == 0, result.output
    scored = {line["key"]: line["metrics"] for line in RunDir(runs / run).eval_lines()}
    shapes = found["tasks"]["world/shapes"]
    assert shapes["accuracy"] == pytest.approx(scored["world/shapes"]["acc1"])
    for row in found["tasks"].values():
        assert 0 <= row["tie"] <= 4 and 1 <= row["lca_error"] <= 3 and 0.2 <= row["jaccard"] <= 1
        assert (row["accuracy"] == 1) == (row["tie"] == 0)
    assert found["chance"]["world/shapes"]["accuracy"] == pytest.approx(1 / 12)
    # Entailment as a score: every geometry's similarity; a cone score where the geometry has cones.
    images = found["tasks"]["world/shapes"]["n"]
    assert set(found["entailment"]["text-image"]) == ({"similarity", "cone"} if run == "tiny-meru" else {"similarity"})
    # The world's caption pool against the retrieval images, each pair related where hierarchy.json says the
    # caption is true of the image.
    pool = json.loads((world / "eval" / "hierarchy.json").read_text())["captions"]
    scenes = len(json.loads((world / "eval" / "retrieval" / "scenes.json").read_text()))
    true = sum(len(c["entails"]) for c in pool)
    assert set(found["entailment"]["caption-image"]) == set(found["entailment"]["text-image"])
    for pairs, (related, total) in (("text-image", (images, 3 * images)), ("text-text", (12, 36)),
                                    ("caption-image", (true, len(pool) * scenes))):
        for row in found["entailment"][pairs].values():
            assert 0 <= row["roc_auc"] <= 1 and 0 <= row["average_precision"] <= 1
            assert (row["positives"], row["pairs"]) == (related, total)
    # The order of the world's caption pairs against their reverses: [ROOT]-order for every geometry, cones where
    # the geometry has them; the convention is HyCoCLIP's, and the mistakes are scored beside uniform ones.
    from euclip_cli.data.world import caption_order_pairs

    order = found["order"]
    assert order["pairs"] == len(caption_order_pairs()[1]) == sum(order["levels"].values())
    assert {k for k in order if k in ("root_order", "cone")} == ({"root_order", "cone"} if run == "tiny-meru" else {"root_order"})
    assert all(0 <= order[k]["roc_auc"] <= 1 for k in ("root_order", "cone") if k in order)
    assert found["convention"] == "hycoclip" and shapes["mistakes"] == round((1 - shapes["accuracy"]) * shapes["n"])


def test_entailment_scores_a_pool_larger_than_one_block_of_cones_as_one_broadcast_would():
    import torch
    from sklearn.metrics import roc_auc_score

    from euclip_cli.analysis.studies import CONE_ROWS, entailment_study
    from euclip_cli.geometry.registry import get_geometry

    g, curv = get_geometry("hyperbolic"), torch.tensor(1.0)
    generator = torch.Generator().manual_seed(0)
    generic, specific = torch.randn(CONE_ROWS * 2 + 5, 6, generator=generator), torch.randn(40, 6, generator=generator)
    related = torch.rand(len(generic), len(specific), generator=generator) < 0.3
    whole = -g.cone_violation(generic[:, None], specific[None], 0.1, curv)  # every pair at once
    found = entailment_study(g, curv, generic, specific, related, 0.1)
    assert found["cone"]["roc_auc"] == pytest.approx(roc_auc_score(related.flatten().numpy(), whole.flatten().numpy()))
