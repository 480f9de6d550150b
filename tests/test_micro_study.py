"""A micro study through the CLI: interrupted, resumed without retraining what it finished, and its
tables, claims, noise floor and report checked against the runs' own files (its own file, the
suite's longest test, so that make test hands it to a worker early rather than last)."""

import csv
import hashlib
import json
import math
import re
import statistics

import pytest
from typer.testing import CliRunner

from euclip_cli import stats
from euclip_cli.cli.main import app
from euclip_cli.study import jobs as R
from euclip_cli.protocol.hits import unpack_hits

runner = CliRunner()


def micro_study(tmp_path, world):
    path = tmp_path / "study-micro.toml"
    overrides = [f"data.train_dir={world / 'train'}", "data.batch_size=32", "optim.samples=64",
                 "optim.warmup_steps=1", "train.precision=fp32", "train.tensorboard=false", "data.shuffle_buffer=100"]
    path.write_text(f'[study]\nseeds = 2\ntasks = "world/shapes,world/colour,world/hard-negatives"\nbaseline = "clip"\n'
                    f'overrides = {json.dumps(overrides)}\n[configs.clip]\nrecipe = "tiny-clip"\n'
                    f'[configs.euclip]\nrecipe = "tiny-euclip"\n'
                    f'[configs.euclidean-d2-l0]\nrecipe = "tiny-euclip"\noverrides = ["loss.entail_weight=0"]\n')
    return path


@pytest.mark.slow
def test_a_micro_study_resumes_without_retraining_and_its_tables_parse(tmp_path, world, monkeypatch):
    path, out = micro_study(tmp_path, world), tmp_path / "out"
    real, executed = R.execute, []

    def interrupted_after_two(p, threads, log_dir, child=None):
        if len(executed) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the third run starts
        executed.append(p.name)
        return real(p, threads, log_dir, child)

    monkeypatch.setattr(R, "execute", interrupted_after_two)
    # Two jobs, as `make study` runs: the third run is interrupted while the second may still run.
    args = ["study", "--recipe", str(path), "--out", str(out), "--world", str(world), "--jobs", "2"]
    first = runner.invoke(app, args)
    assert first.exit_code == 1 and sorted(executed) == ["clip-seed0", "euclip-seed0"]
    assert re.search(r"\[1/6\] (clip|euclip)-seed0 done", first.output) and "left" in first.output

    monkeypatch.setattr(R, "execute", lambda p, t, d, c=None: (executed.append(p.name), real(p, t, d, c))[1])
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    # The finished runs were not trained again.
    assert sorted(executed[2:]) == ["clip-seed1", "euclidean-d2-l0-seed0", "euclidean-d2-l0-seed1", "euclip-seed1"]
    assert "2 already finished" in second.output

    rows = list(csv.DictReader((out / "study.csv").open()))
    main = {r["config"]: r for r in rows if r["metric"] == "main"}
    assert main["clip"]["n_seeds"] == "2" and float(main["clip"]["ci_low"]) <= float(main["clip"]["mean"])
    assert main["euclip"]["diff_mean"] != "" and "diff_mean" not in {k for k, v in main["clip"].items() if v}
    claims = list(csv.DictReader((out / "claims.csv").open()))
    # Only the claims whose configurations the study has, read against Table 8 (64 samples: the small scale).
    assert [c["claim"] for c in claims] == ["euclip-beats-clip", "entailment-helps-euclidean", "euclip-text-nearer-root",
                                            "entailment-nearer-mistakes-euclidean", "entailment-orders-captions-euclidean",
                                            "entailment-orders-captions-by-root-euclidean"]
    assert all(c["verdict"] in stats.VERDICTS for c in claims) and claims[0]["read_against"] == "Table 8 (small)"
    # No primary claims declared: one family, Holm's levels as its adjusted p-values order them.
    assert {c["family"] for c in claims} == {"all"}
    p_values = sorted((float(c["p_value"]), c["claim"]) for c in claims)
    rejected, running = set(), 0.0
    for k, (p, claim) in enumerate(p_values):
        running = max(running, (len(p_values) - k) * p)
        if running < 0.05:
            rejected.add(claim)
    assert {c["claim"] for c in claims if float(c["p_value"]) < 1 - float(c["family_level"])} == rejected
    # Every number of the tables is recomputed from seeds.csv, the per-seed values the study publishes.
    seeds = list(csv.DictReader((out / "seeds.csv").open()))
    by_config = {}
    for r in seeds:
        by_config.setdefault(r["config"], {}).setdefault(int(r["seed"]), {})[r["metric"]] = float(r["value"])
    from euclip_cli.study import verdicts as V
    from euclip_cli.study.spec import load_claims, load_study

    idle = frozenset(c for c, r in main.items() if r["learned"] == "False")
    again = V.evaluate_claims(load_study(str(path)), load_claims(), by_config,
                              json.loads((out / "regime.json").read_text()), idle)
    for mine, published in zip(again, claims):
        assert (mine["verdict"], mine["paper"]) == (published["verdict"], published["paper"])
        assert mine["claim"] == published["claim"]
        assert float(published["fw_low"]) == pytest.approx(mine["fw_low"], rel=1e-9)
    for r in rows:
        values = [by_config[r["config"]][s][r["metric"]] for s in (0, 1)]
        half = 12.706204736174707 * statistics.stdev(values) / math.sqrt(2)  # t(0.975, 1)
        assert float(r["ci_high"]) == pytest.approx(statistics.fmean(values) + half, abs=1e-9)

    def auc(run, state=""):
        return json.loads((out / "runs" / run / "analysis" / f"distances{state}.json").read_text())["auc_text_closer"]

    # Credited: the change training made in EuCLIP minus the change it made in its lambda = 0 control.
    changes = [(auc(f"euclip-seed{s}") - auc(f"euclip-seed{s}", "_init"))
               - (auc(f"euclidean-d2-l0-seed{s}") - auc(f"euclidean-d2-l0-seed{s}", "_init")) for s in (0, 1)]
    assert float(claims[2]["effect"]) == pytest.approx(statistics.fmean(changes))
    # The effect is the paired difference of the runs' own Shapes accuracies.
    shapes = {}
    for run in (out / "runs").iterdir():
        line = next(json.loads(l) for l in (run / "eval.jsonl").read_text().splitlines() if '"world/shapes"' in l)
        shapes[run.name] = 100 * line["metrics"]["acc1"]
    by_hand = statistics.fmean(shapes[f"euclip-seed{s}"] - shapes[f"clip-seed{s}"] for s in (0, 1))
    assert "## Regime" in (out / "study.md").read_text() and (out / "regime.json").exists()
    assert float(claims[0]["effect"]) == pytest.approx(by_hand)
    # seeds.csv holds each run's own score, with a digest of the answers it gave image by image.
    shapes_rows = {f"{r['config']}-seed{r['seed']}": r for r in seeds if r["metric"] == "world/shapes"}
    assert {k: float(r["value"]) for k, r in shapes_rows.items()} == pytest.approx(shapes)
    for run, r in shapes_rows.items():
        line = next(json.loads(l) for l in (out / "runs" / run / "eval.jsonl").read_text().splitlines()
                    if '"world/shapes"' in l)
        assert r["outcomes_sha256"] == hashlib.sha256(json.dumps(line["hits"], sort_keys=True).encode()).hexdigest()[:16]
    assert all(r["outcomes_sha256"] == "" for r in seeds if r["metric"] in ("main", "text_nearer_root"))
    # The noise floor: the paired differences' sd and the sampling error of the runs' own scores.
    noise = {r["metric"]: r for r in csv.DictReader((out / "noise.csv").open())}
    paired = [statistics.stdev(shapes[f"{c}-seed{s}"] - shapes[f"clip-seed{s}"] for s in (0, 1))
              for c in ("euclip", "euclidean-d2-l0")]
    assert "world/shapes" not in noise  # Shapes is the main group's only task: one row, the group's
    assert float(noise["main"]["paired_sd_median"]) == pytest.approx(statistics.median(paired))
    size = json.loads((world / "manifest.json").read_text())["eval_size"]
    sampling = statistics.median(100 * math.sqrt(a / 100 * (1 - a / 100) / size) for a in shapes.values())
    assert float(noise["main"]["sampling_se_median"]) == pytest.approx(sampling, rel=1e-5)
    # ... and of a run's difference to its seed's CLIP run on the same images, from the images each got right.
    def right(run):
        line = next(json.loads(l) for l in (out / "runs" / run / "eval.jsonl").read_text().splitlines()
                    if '"world/shapes"' in l)
        return unpack_hits(line["hits"]["acc1"])

    def paired(a, b):
        only_a, only_b = sum(x and not y for x, y in zip(a, b)), sum(y and not x for x, y in zip(a, b))
        return 100 * math.sqrt(((only_a + only_b) / size - ((only_a - only_b) / size) ** 2) / size)

    assert sum(right("clip-seed0")) == round(shapes["clip-seed0"] / 100 * size)
    pairs = [paired(right(f"{c}-seed{s}"), right(f"clip-seed{s}")) for c in ("euclip", "euclidean-d2-l0") for s in (0, 1)]
    assert float(noise["main"]["paired_sampling_se_median"]) == pytest.approx(statistics.median(pairs), rel=1e-5)
    # The ceilings, from the study's world: a classification label is what the image shows (retrieval's,
    # below 100, in test_ceiling.py).
    assert float(noise["main"]["ceiling"]) == 100 and float(noise["world/colour"]["ceiling"]) == 100
    # The same spread against the evaluation set's size: at full size it is the noise floor's, read from the
    # study's own accuracies; on the first half of the images, by hand from the per-image outcomes.
    curve = list(csv.DictReader((out / "eval_size.csv").open()))
    assert [int(r["images"]) for r in curve] == [size, size // 2]
    assert float(curve[0]["paired_sd_median"]) == pytest.approx(float(noise["main"]["paired_sd_median"]), rel=1e-6)
    half = size // 2
    spread = [statistics.stdev(100 * (sum(right(f"{c}-seed{s}")[:half]) - sum(right(f"clip-seed{s}")[:half])) / half
                               for s in (0, 1)) for c in ("euclip", "euclidean-d2-l0")]
    assert float(curve[1]["paired_sd_median"]) == pytest.approx(statistics.median(spread))
    assert "## Precision against the evaluation set's size" in (out / "study.md").read_text()
    assert "world/colour" in noise  # one attribute task of several: a row of its own
    # The world's hard negatives: each run's accuracy as its eval line has it, beside text alone (the world's).
    baseline = json.loads((world / "eval" / "hard-negatives" / "text_only.json").read_text())
    for run in (out / "runs").iterdir():
        line = next(json.loads(l) for l in (run / "eval.jsonl").read_text().splitlines() if "hard-negatives" in l)
        config, seed = run.name.rsplit("-seed", 1)
        found = {r["metric"]: float(r["value"]) for r in seeds if r["config"] == config and r["seed"] == seed}
        assert found["world/hard-negatives"] == pytest.approx(100 * line["metrics"]["acc"])
        assert found["hard_negatives_swap_att"] == pytest.approx(100 * line["metrics"]["acc_swap_att"])
        assert found["hard_negatives_text_only"] == pytest.approx(100 * baseline["acc"])
    assert "hard negatives" in (out / "study.md").read_text().split("\n## ")[0]  # a column of the first table
    # The caption pool's entailment score, as each run's hierarchy analysis has it, read into the study.
    for r in (r for r in seeds if r["metric"] == "pool_similarity_auc"):
        analysed = json.loads((out / "runs" / f"{r['config']}-seed{r['seed']}" / "analysis" / "hierarchy.json").read_text())
        assert float(r["value"]) == pytest.approx(analysed["entailment"]["caption-image"]["similarity"]["roc_auc"])
    assert sum(r["metric"] == "pool_similarity_auc" for r in seeds) == 6
    assert "| pool AUC, similarity | pool AUC, cone |" in (out / "study.md").read_text()
    section = (out / "study.md").read_text().split("## Compositional hard negatives")[1]
    assert f"| text alone | {100 * baseline['acc']:.1f} |" in section and "| chance | 50.0 |" in section
    assert section.count("\n| euclip") == 1 and float(noise["world/hard-negatives"]["ceiling"]) == 100
    assert "average" not in noise  # two of the ten tasks: no average, and no error of one
    assert "## Noise floor" in (out / "study.md").read_text()
    assert (out / "study.png").exists() and "## Claims" in (out / "study.md").read_text()
    assert (out / "study_temperature.png").exists()  # the learned temperature over training, one panel per geometry
    report = runner.invoke(app, ["report", "--studies-dir", str(tmp_path), "--runs-dir", str(tmp_path / "none"),
                                 "--out", str(tmp_path / "tables")])
    assert report.exit_code == 0, report.output
    assert "Study out: the paper's claims" in report.output and "EuCLIP matches or beats CLIP" in report.output
    assert "Study out: the noise floor (points)" in report.output
    page = runner.invoke(app, ["report", "--format", "html", "--studies-dir", str(tmp_path), "--runs-dir",
                               str(tmp_path / "none"), "--out", str(tmp_path / "tables")])
    assert page.exit_code == 0, page.output
    html = (tmp_path / "tables" / "report.html").read_text()
    assert html.index("Study out") < html.index("<details><summary>Published numbers") and "means and paired differences" in html
    assert "Study out: the learned temperature over training" in html
