"""Studies: statistics against hand computations, the claims file against the study recipes, and a
micro study through the CLI that resumes without retraining what it finished."""

import csv
import json
import math
import re
import statistics

import pytest
from typer.testing import CliRunner

from euclip_cli import stats
from euclip_cli.cli import app
from euclip_cli.config import list_recipes
from euclip_cli.study import runner as R
from euclip_cli.config import is_study_recipe
from euclip_cli.study.spec import load_claims, load_study

runner = CliRunner()


# ---------------------------------------------------------------- statistics

def test_t_interval_matches_a_hand_computation():
    values = [40.0, 43.0, 41.5, 44.5]
    est = stats.estimate(values, "t")
    mean, sd = sum(values) / 4, math.sqrt(sum((v - 41.0 - 1.25) ** 2 for v in values) / 3)
    half = 3.182446305284263 * sd / 2  # t(0.975, 3) from a table, times sd / sqrt(4)
    assert est.n == 4 and est.mean == pytest.approx(mean) and est.sd == pytest.approx(sd)
    assert (est.low, est.high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    one = stats.estimate([3.0])
    assert one.mean == 3.0 and one.sd is None and one.low is None  # one seed: no interval at all


def test_bootstrap_interval_is_reproducible_and_brackets_the_mean():
    values = [1.0, 2.0, 4.0, 7.0, 11.0]
    a, b = stats.estimate(values, "bootstrap", seed=5), stats.estimate(values, "bootstrap", seed=5)
    assert (a.low, a.high) == (b.low, b.high)  # a fixed generator: the same interval every time
    assert min(values) <= a.low < statistics.fmean(values) < a.high <= max(values)
    # A resampled mean of 5 values can only be a multiple of 1/5 of their sum's parts: check one is.
    assert any(math.isclose(a.low * 5, sum(c)) for c in _multisets(values, 5))


def _multisets(values, k):
    from itertools import combinations_with_replacement

    return combinations_with_replacement(values, k)


def test_paired_difference_uses_common_seeds_only():
    a = {0: 50.0, 1: 52.0, 2: 55.0, 3: 60.0}
    b = {0: 48.0, 1: 51.0, 2: 52.0}
    diff = stats.paired_difference(a, b)
    assert diff.n == 3 and diff.mean == pytest.approx((2 + 1 + 3) / 3)
    assert diff.sd == pytest.approx(1.0)
    assert stats.paired_difference({0: 1.0}, {1: 2.0}) is None


def test_the_binomial_standard_error_matches_a_simulation_of_the_evaluation_set():
    """An independent computation: the spread of accuracies over many simulated evaluation sets."""
    import random as rnd

    gen, n, p = rnd.Random(3), 400, 0.3
    accuracies = [sum(gen.random() < p for _ in range(n)) / n for _ in range(4000)]
    assert stats.binomial_se(p, n) == pytest.approx(statistics.stdev(accuracies), rel=0.05)
    assert stats.binomial_se(0.3, 400) == pytest.approx(math.sqrt(0.21 / 400))
    assert stats.binomial_se(1.0, 10) == 0.0
    with pytest.raises(ValueError):
        stats.binomial_se(0.5, 0)


def test_sampling_errors_of_tasks_groups_and_the_average_by_hand(tmp_path):
    from euclip_cli.evaluate.tasks import list_tasks

    world = tmp_path / "world"
    world.mkdir()
    (world / "manifest.json").write_text(json.dumps({"eval_size": 400}))
    run = tmp_path / "run"
    run.mkdir()
    keys = [t.key for t in list_tasks("world")]
    lines = []
    for i, key in enumerate(keys):
        metrics = {"main_metric": 0.1 + 0.08 * i}
        if key == "world/retrieval":
            metrics = {"image_retrieval_recall@1": 0.2, "text_retrieval_recall@1": 0.4, "main_metric": 0.3}
        lines.append(json.dumps({"key": key, "checkpoint": "checkpoints/step_1.pt", "step": 1, "metrics": metrics}))
    (run / "eval.jsonl").write_text("\n".join(lines) + "\n")
    errors = R.sampling_errors(R.RunPlan("clip", 0, run, ()), keys, world)
    shapes = 0.1 + 0.08 * keys.index("world/shapes")
    assert errors["world/shapes"] == pytest.approx(100 * math.sqrt(shapes * (1 - shapes) / 400))
    # Text-to-image R@1 over 800 captions (two per image), image-to-text over 400 images, averaged.
    assert errors["world/retrieval"] == pytest.approx(100 * math.sqrt(0.2 * 0.8 / 800 + 0.4 * 0.6 / 400) / 2)
    assert errors["retrieval"] == pytest.approx(errors["world/retrieval"])  # a group of one task
    by_hand = math.sqrt(sum(errors[k] ** 2 for k in keys)) / len(keys)
    assert errors["average"] == pytest.approx(by_hand) and errors["average"] < min(errors[k] for k in keys)
    assert R.sampling_errors(R.RunPlan("clip", 0, run, ()), keys, tmp_path / "no-world") == {}


def test_seeds_needed_by_hand_from_a_t_table():
    # t(0.975, n - 1) / sqrt(n) from a printed table, n = 2..7: 12.706/1.414, 4.303/1.732, 3.182/2,
    # 2.776/2.236, 2.571/2.449, 2.447/2.646 = 8.98, 2.48, 1.59, 1.24, 1.05, 0.925.
    assert stats.seeds_needed(1.0, 1.0) == 7
    assert stats.seeds_needed(1.0, 1.06) == 6
    assert stats.seeds_needed(2.0, 5.0) == 3  # 2.48 * 2 = 4.97
    assert stats.seeds_needed(2.0, 4.9) == 4
    assert stats.seeds_needed(0.0, 1.0) == 2  # no spread: the fewest seeds with an interval at all
    assert stats.seeds_needed(None, 1.0) is None and stats.seeds_needed(1.0, 0.0) is None
    assert stats.seeds_needed(100.0, 0.1, most=50) is None  # more seeds than anyone would run


@pytest.mark.parametrize("low,high,sign,expected", [
    (0.5, 2.0, +1, "reproduced"), (-2.0, -0.5, +1, "opposite"), (-0.5, 2.0, +1, "inconclusive"),
    (-2.0, -0.5, -1, "reproduced"), (0.0, 1.0, +1, "inconclusive")])
def test_verdicts(low, high, sign, expected):
    assert stats.verdict(stats.Estimate(3, (low + high) / 2, 1.0, low, high), sign) == expected
    assert stats.verdict(stats.Estimate(1, 1.0, None, None, None), +1) == "inconclusive"


# ---------------------------------------------------------------- recipes and claims

def test_every_claim_names_configurations_of_a_shipped_study():
    studies = [load_study(name) for name in list_recipes() if is_study_recipe(name)]
    assert studies, "no study recipe is shipped"
    for claim in load_claims():
        # One study must have both configurations, or no study tests the claim.
        assert any(set(claim.configs) <= set(s.configs) for s in studies), f"claim {claim.id} names {claim.configs}"
        if claim.paper:  # and its published rows exist
            effect, source = R.paper_effect(claim)
            if claim.metric == "main":
                assert effect is not None and "ImageNet" in source, claim.id
            else:  # Sun and Li's temperatures: the source of the direction, no effect
                assert effect is None and source.startswith("Sun and Li"), claim.id


def test_the_paper_effects_are_read_from_the_published_tables():
    claim = next(c for c in load_claims() if c.id == "no-final-ln-helps-euclip")
    effect, _ = R.paper_effect(claim)
    assert effect == pytest.approx(28.97 - 22.22)  # Table 5, ViT-B/32: no-ln vs ln
    claim = next(c for c in load_claims() if c.id == "learnable-temperature-helps-ps-inner")
    effect, source = R.paper_effect(claim)
    assert effect == pytest.approx(30.50 - 21.20) and "Table 7" in source  # Sun and Li: learnable vs frozen at 1
    claim = next(c for c in load_claims() if c.id == "product-sphere-settles-below-sphere")
    assert R.paper_effect(claim) == (None, "Sun and Li Table 7: sphere-init2.659 4.033 vs ps-inner-init2.659 2.231, "
                                           "final temperature as printed")


def test_a_temperature_claim_compares_the_learned_beta_paired_by_seed():
    study = load_study("study-temperature-noise")
    finals = {"sphere-m40": {0: 21.0, 1: 21.0, 2: 22.5}, "sphere-m0": {0: 18.0, 1: 18.5, 2: 19.0}}
    by_config = {c: {seed: {"temperature_final": v} for seed, v in values.items()} for c, values in finals.items()}
    (row,) = [r for r in R.evaluate_claims(study, load_claims(), by_config) if r["n_seeds"]]
    assert row["claim"] == "noisier-captions-raise-the-temperature" and row["metric"] == "temperature_final"
    diffs = [3.0, 2.5, 3.5]
    assert row["effect"] == pytest.approx(statistics.fmean(diffs))
    half = 4.302652729911275 * statistics.stdev(diffs) / math.sqrt(3)  # t(0.975, 2)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((statistics.fmean(diffs) - half, statistics.fmean(diffs) + half))
    assert row["verdict"] == "reproduced" and row["paper_effect"] is None
    assert row["seeds_for_paper_effect"] is None  # no published value to measure the spread against
    assert row["paper_source"] == "Sun and Li, sections 2.1 (Figure 1) and 2.4: a direction, no value"


def test_a_claim_with_a_published_effect_says_how_many_seeds_resolve_one_that_large():
    study = load_study("study-geometries")
    shapes = {"euclip": {0: 30.0, 1: 34.0, 2: 38.0}, "euclip-ln": {0: 30.0, 1: 30.0, 2: 30.0}}  # paired: 0, 4, 8
    by_config = {c: {seed: {"main": v} for seed, v in values.items()} for c, values in shapes.items()}
    (row,) = [r for r in R.evaluate_claims(study, load_claims(), by_config) if r["n_seeds"]]
    assert row["claim"] == "no-final-ln-helps-euclip" and row["paper_effect"] == pytest.approx(6.75)
    # sd 4: three seeds give ± 4.303 * 4 / sqrt(3) = 9.94, four ± 3.182 * 4 / 2 = 6.36, within 6.75.
    assert row["seeds_for_paper_effect"] == 4
    assert "| 4 |" in R.to_markdown(study, {"rows": [], "claims": [row], "noise": [], "seeds": [0, 1, 2]})


def test_an_unusable_study_folder_is_refused_before_any_world_is_generated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the noise study's worlds would go to ./data/world-mismatch-P
    (tmp_path / "file").write_text("x")
    result = runner.invoke(app, ["study", "--recipe", "study-temperature-noise", "--out", str(tmp_path / "file")])
    assert result.exit_code == 2 and "is a file where a folder is needed" in " ".join(result.output.split())
    assert not (tmp_path / "data").exists()


def test_a_bad_study_recipe_lists_every_problem(tmp_path):
    path = tmp_path / "study-bad.toml"
    path.write_text('[study]\nseeds = 0\nbaseline = "nope"\ninterval = "z"\ntasks = "world/colr"\n[configs.a]\nrecipe = "tiny-clip"\n'
                    'overrides = ["optim.lr=fast"]\n[configs.b]\nrecipe = "tiny-clip"\n')
    result = runner.invoke(app, ["study", "--recipe", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    for text in ("seeds must be a positive integer", "baseline 'nope'", "interval 'z'", "optim.lr", "world/colr"):
        assert text in result.output


# ---------------------------------------------------------------- a micro study, end to end

def micro_study(tmp_path, world):
    path = tmp_path / "study-micro.toml"
    overrides = [f"data.train_dir={world / 'train'}", "data.batch_size=32", "optim.samples=64",
                 "optim.warmup_steps=1", "train.precision=fp32", "train.tensorboard=false", "data.shuffle_buffer=100"]
    path.write_text(f'[study]\nseeds = 2\ntasks = "world/shapes,world/colour"\nbaseline = "clip"\n'
                    f'overrides = {json.dumps(overrides)}\n[configs.clip]\nrecipe = "tiny-clip"\n'
                    f'[configs.euclip]\nrecipe = "tiny-euclip"\n')
    return path


@pytest.mark.slow
def test_a_micro_study_resumes_without_retraining_and_its_tables_parse(tmp_path, world, monkeypatch):
    path, out = micro_study(tmp_path, world), tmp_path / "out"
    real, executed = R.execute, []

    def interrupted_after_two(p, threads, log_dir):
        if len(executed) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the third run starts
        executed.append(p.name)
        return real(p, threads, log_dir)

    monkeypatch.setattr(R, "execute", interrupted_after_two)
    # Two jobs, as `make study` runs: the third run is interrupted while the second may still run.
    args = ["study", "--recipe", str(path), "--out", str(out), "--world", str(world), "--jobs", "2"]
    first = runner.invoke(app, args)
    assert first.exit_code == 1 and sorted(executed) == ["clip-seed0", "euclip-seed0"]
    assert re.search(r"\[1/4\] (clip|euclip)-seed0 done", first.output) and "left" in first.output

    monkeypatch.setattr(R, "execute", lambda p, t, d: (executed.append(p.name), real(p, t, d))[1])
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert sorted(executed[2:]) == ["clip-seed1", "euclip-seed1"]  # the finished runs were not trained again
    assert "2 already finished" in second.output

    rows = list(csv.DictReader((out / "study.csv").open()))
    main = {r["config"]: r for r in rows if r["metric"] == "main"}
    assert main["clip"]["n_seeds"] == "2" and float(main["clip"]["ci_low"]) <= float(main["clip"]["mean"])
    assert main["euclip"]["diff_mean"] != "" and "diff_mean" not in {k for k, v in main["clip"].items() if v}
    claims = list(csv.DictReader((out / "claims.csv").open()))
    # Only the claims whose configurations the study has: EuCLIP vs CLIP, and EuCLIP's [ROOT] distances.
    assert [c["claim"] for c in claims] == ["euclip-beats-clip", "euclip-text-nearer-root"]
    assert all(c["verdict"] in ("reproduced", "opposite", "inconclusive") for c in claims)
    aucs = [json.loads((out / "runs" / f"euclip-seed{s}" / "analysis" / "distances.json").read_text())["auc_text_closer"]
            for s in (0, 1)]
    assert float(claims[1]["effect"]) == pytest.approx(statistics.fmean(aucs) - 0.5)
    # The effect is the paired difference of the runs' own Shapes accuracies.
    shapes = {}
    for run in (out / "runs").iterdir():
        line = next(json.loads(l) for l in (run / "eval.jsonl").read_text().splitlines() if '"world/shapes"' in l)
        shapes[run.name] = 100 * line["metrics"]["acc1"]
    by_hand = statistics.fmean(shapes[f"euclip-seed{s}"] - shapes[f"clip-seed{s}"] for s in (0, 1))
    assert float(claims[0]["effect"]) == pytest.approx(by_hand)
    # The noise floor: the paired differences' sd and the sampling error of the runs' own scores.
    noise = {r["metric"]: r for r in csv.DictReader((out / "noise.csv").open())}
    diffs = [shapes[f"euclip-seed{s}"] - shapes[f"clip-seed{s}"] for s in (0, 1)]
    assert "world/shapes" not in noise  # Shapes is the main group's only task: one row, the group's
    assert float(noise["main"]["paired_sd_median"]) == pytest.approx(statistics.stdev(diffs))
    size = json.loads((world / "manifest.json").read_text())["eval_size"]
    sampling = statistics.median(100 * math.sqrt(a / 100 * (1 - a / 100) / size) for a in shapes.values())
    assert float(noise["main"]["sampling_se_median"]) == pytest.approx(sampling, rel=1e-5)
    assert "world/colour" in noise  # one attribute task of several: a row of its own
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
    assert html.index("Study out") < html.index("Published numbers without") and "means and paired differences" in html
    assert "Study out: the learned temperature over training" in html


def test_the_study_figures_legend_hides_no_configuration():
    from euclip_cli.report.figures import study_canvas

    configs = [f"config-{i}" for i in range(10)]
    # The last configuration's intervals reach the axes' corners, where a legend inside would sit.
    rows = [{"config": c, "metric": m, "mean": 5.0 + 5 * i, "ci_low": 0.0, "ci_high": 60.0, "diff_mean": 0.0,
             "diff_low": -30.0, "diff_high": 15.0} for i, c in enumerate(configs) for m in ("main", "average")]
    fig = study_canvas(rows, configs, "config-0", {"main": "Shapes", "average": "Average"})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    box = legend.get_window_extent(renderer)
    assert [t.get_text() for t in legend.get_texts()] == ["Shapes", "Average"]
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_the_temperature_figure_draws_each_configurations_mean_and_seed_range_in_its_geometrys_panel():
    from euclip_cli.report.figures import temperature_canvas

    curves = {"a": {0: [(8, 1.0), (16, 2.0), (24, 4.0)], 1: [(8, 3.0), (16, 4.0), (24, 8.0)]},
              "b": {0: [(8, 10.0), (16, 10.0)], 1: [(8, 20.0), (16, 30.0), (24, 40.0)]},  # seed 0 stopped early
              "c": {0: [(8, 5.0), (16, 6.0)]}}
    fig = temperature_canvas({"curves": curves, "panels": {"clip (cos)": ["a", "b"], "euclidean (d)": ["c"]}})
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["clip (cos)", "euclidean (d)"]
    (a, b), (c,) = (ax.get_lines() for ax in shown)
    assert list(a.get_xdata()) == [8, 16, 24] and list(a.get_ydata()) == [2.0, 3.0, 6.0]
    assert list(b.get_xdata()) == [8, 16] and list(b.get_ydata()) == [15.0, 20.0]  # only the steps every seed logged
    assert list(c.get_ydata()) == [5.0, 6.0] and a.get_label() == "a (2 seeds)"
    band = shown[0].collections[0].get_paths()[0].vertices  # a's shaded range: from the lowest seed to the highest
    assert {tuple(v) for v in band} >= {(8.0, 1.0), (24.0, 4.0), (8.0, 3.0), (24.0, 8.0)}


def test_the_temperature_converges_where_it_stays_within_two_percent_of_its_final_value():
    steps = [8, 16, 24, 32, 40, 48]
    assert R.converged_step(steps, [1.0, 2.0, 3.0, 3.9, 4.05, 4.0]) == 40  # 3.9 is 2.5% off
    assert R.converged_step(steps, [1.0, 2.0, 3.0, 3.95, 4.05, 4.0]) == 32
    assert R.converged_step(steps, [1.0, 2.0, 3.0, 3.9, 4.05, 4.0], within=0.01) == 48  # 4.05 is 1.25% off
    assert R.converged_step(steps, [4.0] * 6) == 8  # never moved (a frozen temperature)
    assert R.converged_step(steps, [4.0, 4.0, 1.0, 4.0, 4.0, 4.0]) == 32  # a later excursion counts


def test_a_configuration_naming_an_unknown_published_row_is_refused(tmp_path):
    path = tmp_path / "study-bad.toml"
    path.write_text('[configs.a]\nrecipe = "tiny-clip"\npaper = "sphere-init3"\n[configs.b]\nrecipe = "tiny-clip"\n')
    with pytest.raises(Exception, match="sphere-init3"):
        load_study(str(path))


@pytest.mark.slow
def test_a_temperature_study_generates_its_noisy_world_and_puts_the_paper_beside_its_runs(tmp_path, world):
    noisy = tmp_path / "world-mismatch-40"
    overrides = ["data.batch_size=32", "optim.samples=64", "optim.warmup_steps=1", "train.precision=fp32",
                 "train.tensorboard=false", "data.shuffle_buffer=100", "train.log_every=1",
                 "geometry.logit_scale_max=100"]
    path = tmp_path / "study-temp.toml"
    path.write_text(f'[study]\nseeds = 1\ntasks = "world/shapes"\nbaseline = "sphere"\n'
                    f'overrides = {json.dumps(overrides)}\n'
                    f'[configs.sphere]\nrecipe = "tiny-clip"\npaper = "sphere-init1"\n'
                    f'overrides = ["data.train_dir={world / "train"}", "geometry.logit_scale_init=0"]\n'
                    f'[configs.frozen-noisy]\nrecipe = "tiny-product-sphere"\npaper = "ps-inner-frozen1"\n'
                    f'overrides = ["data.train_dir={noisy / "train"}", "data.world_mismatch=0.4", '
                    f'"data.world_samples=300", "data.world_eval_size=50", "geometry.logit_scale_init=0", "geometry.learn_logit_scale=false"]\n')
    out = tmp_path / "out"
    result = runner.invoke(app, ["study", "--recipe", str(path), "--out", str(out), "--world", str(world)])
    assert result.exit_code == 0, result.output
    unwrapped = result.output.replace("\n", "")  # rich folds long paths at 80 columns, inside words too
    assert "generating the embedded world of frozen-noisy" in unwrapped and "world-mismatch-40" in unwrapped
    assert "2 configurations x 1 seed = 2 runs; 0 already finished" in unwrapped
    manifest = json.loads((noisy / "manifest.json").read_text())
    assert manifest["mismatch"] == 0.4 and manifest["samples"] == 300 and manifest["eval_size"] == 50
    rows = {(r["config"], r["metric"]): r for r in csv.DictReader((out / "study.csv").open())}
    assert float(rows[("frozen-noisy", "temperature_final")]["mean"]) == 1.0  # frozen at beta = 1
    assert float(rows[("frozen-noisy", "temperature_converged_step")]["mean"]) == 1.0  # never moved
    records = [json.loads(l) for l in (out / "runs" / "sphere-seed0" / "metrics.jsonl").read_text().splitlines()]
    assert float(rows[("sphere", "temperature_final")]["mean"]) == pytest.approx(records[-1]["logit_scale"])
    text = (out / "study.md").read_text()
    assert "## Temperature" in text and "Table 7 sphere-init1" in text and "Table 7 ps-inner-frozen1" in text
    assert "| 1.000 → 1.000 | detach | 21.20 | 30.3 / 18.48 |" in text  # the published frozen PS row
    assert "| frozen-noisy | 1.00 | frozen |" in text and "| frozen |" not in text.split("| sphere |")[1].split("\n")[0]
    report = runner.invoke(app, ["report", "--studies-dir", str(tmp_path), "--runs-dir", str(tmp_path / "none"),
                                 "--out", str(tmp_path / "tables")])
    assert report.exit_code == 0, report.output
    assert "β final" in report.output and "Table 7 ps-inner-frozen1: 21.20, final temperature as printed 1.000" in report.output
