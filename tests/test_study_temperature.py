"""A temperature study end to end: its noisy world generated before its runs, and Sun and Li's
published rows beside them (its own file, so that make test's workers run it beside the micro study)."""

import csv
import json

import pytest
from typer.testing import CliRunner

from euclip_cli.cli.main import app

runner = CliRunner()


@pytest.mark.slow
def test_a_temperature_study_generates_its_noisy_world_and_puts_the_paper_beside_its_runs(tmp_path, world):
    noisy = tmp_path / "world-mismatch-40"
    overrides = ["data.batch_size=32", "optim.samples=64", "optim.warmup_steps=1", "train.precision=fp32",
                 "train.tensorboard=false", "data.shuffle_buffer=100", "train.log_every=1",
                 "geometry.logit_scale_max=100"]
    path = tmp_path / "study-temp.toml"
    # Colour rather than Shapes: a study scoring Shapes also places every run's mistakes in the world's tree, an
    # analysis per run that tests/test_micro_study.py checks and this test does not read.
    path.write_text(f'[study]\nseeds = 1\ntasks = "world/colour"\nbaseline = "sphere"\n'
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
