"""``euclip bench train`` runs both trainers and reports ratios computed from their own logs (no timing asserted)."""

import json

import pytest
from typer.testing import CliRunner

from euclip_cli.bench import OPENCLIP_RATE
from euclip_cli.cli import app

pytestmark = pytest.mark.slow


def test_openclip_throughput_lines_are_parsed():
    line = "Train Epoch: 0 [ 512/2560 (20%)] Data (t): 0.001 Batch (t): 2.345, 109.200/s, 109.200/s/gpu LR: 0.000100"
    assert OPENCLIP_RATE.findall(line) == ["109.200"]


def test_bench_train_runs_both_trainers_on_a_small_model(tmp_path):
    result = CliRunner().invoke(app, ["bench", "train", "--arch", "tiny-vit", "--batch-size", "16", "--steps", "2",
                                      "--warmup", "1", "--threads", "2", "--no-compile", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "euclip / OpenCLIP samples/s" in result.output and "accumulation overhead" in result.output
    report = json.loads(next(tmp_path.glob("train-*.json")).read_text())
    m = report["measurements"]
    assert set(m) == {"euclip", "euclip_accum2", "openclip"}
    assert all(v["samples_per_s"] > 0 and v["steps_timed"] == 2 and v["peak_rss_mib"] > 100 for v in m.values())
    assert report["speedup_vs_openclip"] == pytest.approx(m["euclip"]["samples_per_s"] / m["openclip"]["samples_per_s"])
    assert report["accumulation_overhead"] == pytest.approx(
        m["euclip"]["samples_per_s"] / m["euclip_accum2"]["samples_per_s"])
    assert report["flops_per_sample"] > 1e8


def test_a_second_bench_in_the_same_folder_is_refused(tmp_path):
    import fcntl

    work = tmp_path / "scratch"
    work.mkdir()
    with (work / ".lock").open("w") as held:  # a bench already running there
        fcntl.flock(held, fcntl.LOCK_EX)
        result = CliRunner().invoke(app, ["bench", "train", "--out", str(tmp_path), "--steps", "3"])
    assert result.exit_code == 1
    assert "another euclip bench is running in" in " ".join(result.output.split())
    assert sorted(p.name for p in work.iterdir()) == [".lock"]  # nothing of the running bench touched


def test_bench_text_times_full_and_trimmed_contexts_on_the_worlds_captions(tmp_path):
    result = CliRunner().invoke(app, ["bench", "text", "--batch-size", "16", "--batches", "2", "--rounds", "2",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = json.loads(next(tmp_path.glob("text-*.json")).read_text())
    assert written["batches"] == 2 and written["rounds"] == 2 and written["context"] == 32
    # The world's captions mostly end well before the 32-token context: trimming shortens them.
    assert 8 <= written["mean_trimmed_context"] < written["context"]
    assert written["ratio_min"] <= written["ratio_median"] <= written["ratio_max"]
    assert "median ratio" in result.output
