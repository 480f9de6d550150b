"""``euclip bench train`` runs both trainers and reports ratios computed from their own logs (no timing asserted)."""

import json
import statistics

import pytest
from typer.testing import CliRunner

from euclip_cli.bench import OPENCLIP_RATE
from euclip_cli.cli import app

pytestmark = pytest.mark.slow


def test_openclip_throughput_lines_are_parsed():
    line = "Train Epoch: 0 [ 512/2560 (20%)] Data (t): 0.001 Batch (t): 2.345, 109.200/s, 109.200/s/gpu LR: 0.000100"
    assert OPENCLIP_RATE.findall(line) == ["109.200"]


def test_bench_train_interleaves_rounds_and_takes_every_ratio_within_a_round(tmp_path):
    result = CliRunner().invoke(app, ["bench", "train", "--arch", "tiny-vit", "--batch-size", "16", "--steps", "2",
                                      "--warmup", "1", "--rounds", "2", "--threads", "2", "--no-compile",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for line in ("euclip / OpenCLIP as its users run it", "euclip / OpenCLIP with euclip's attention kernel",
                 "accumulation overhead", "measured in the same run", "euclip / measured peak",
                 "the embedded study's recipe (tiny-clip as shipped)", "study-geometries (30 runs"):
        assert line in text, line
    report = json.loads(next(tmp_path.glob("train-*.json")).read_text())
    m = report["measurements"]
    assert set(m) == {"euclip", "openclip", "openclip_math", "openclip_synthetic", "euclip_accum2", "tiny_recipe"}
    for v in m.values():
        assert len(v["per_round"]) == 2 and all(rate > 0 for rate in v["per_round"]) and v["peak_rss_mib"] > 100
        assert v["samples_per_s"] == pytest.approx(statistics.median(v["per_round"]))
        assert v["steps_timed"] == 4  # two timed steps in each of two rounds
    ratios = [a / b for a, b in zip(m["euclip"]["per_round"], m["openclip"]["per_round"])]
    assert report["speedup_vs_openclip"]["per_round"] == pytest.approx(ratios)
    assert report["speedup_vs_openclip"]["median"] == pytest.approx(statistics.median(ratios))
    assert report["speedup_vs_openclip"]["min"] == pytest.approx(min(ratios))
    overheads = [a / b for a, b in zip(m["euclip"]["per_round"], m["euclip_accum2"]["per_round"])]
    assert report["accumulation_overhead"]["median"] == pytest.approx(statistics.median(overheads))
    peaks = report["peak_tflops"]["per_round"]
    assert len(peaks) == 2 and all(0.001 < peak < 10_000 for peak in peaks)
    assert len(report["fp32_peak_tflops"]["per_round"]) == 2  # bf16 bench: fp32 measured as well
    shares = [report["flops_per_sample"] * rate / 1e12 / peak for rate, peak in zip(m["euclip"]["per_round"], peaks)]
    assert report["fraction_of_peak"]["per_round"] == pytest.approx(shares)
    study = report["study_training"]
    assert study["runs"] == 30 and study["training_s"] == pytest.approx(study["samples"] / m["tiny_recipe"]["samples_per_s"])
    assert report["flops_per_sample"] > 1e8


def test_openclip_reads_the_shards_euclip_reads_and_its_synthetic_run_is_apart(tmp_path, monkeypatch):
    from euclip_cli import bench

    world = tmp_path / "world" / "train"
    world.mkdir(parents=True)
    for name in ("00001.tar", "00000.tar"):
        (world / name).write_bytes(b"")
    commands = []

    def fake_child(command, env, cwd):
        commands.append(command)
        return "Batch (t): 0.1, 100.0/s, 100.0/s/gpu LR: 1\n" * 5, 500.0

    monkeypatch.setattr(bench, "run_child", fake_child)
    settings = bench.Settings(steps=3, warmup=1, workers=4)
    on_shards = bench.openclip_run(tmp_path, settings, world)
    synthetic = bench.openclip_run(tmp_path, settings, None)
    shards_cmd, synthetic_cmd = commands
    assert shards_cmd[shards_cmd.index("--dataset-type") + 1] == "webdataset"
    assert shards_cmd[shards_cmd.index("--train-data") + 1] == f"{world / '00000.tar'}::{world / '00001.tar'}"
    assert shards_cmd[shards_cmd.index("--workers") + 1] == "4"
    assert synthetic_cmd[synthetic_cmd.index("--dataset-type") + 1] == "synthetic" and "--train-data" not in synthetic_cmd
    assert (on_shards.name, synthetic.name) == ("openclip", "openclip-synthetic")
    assert on_shards.steps_timed == 4  # five rate lines, the first (warm-up) dropped


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


def test_bench_text_reads_the_captions_of_any_shard_folder(tmp_path):
    """Short captions (3 words: 5 tokens with start and end) run on 8 positions, long ones (40 words)
    on the full 32: the mean context of a half-and-half set is 20, taken from these shards' captions."""
    import io
    import tarfile

    shards = tmp_path / "shards"
    shards.mkdir()
    with tarfile.open(shards / "00000.tar", "w") as tar:
        for i in range(16):
            text = ("a red circle" if i % 2 else " ".join(["word"] * 40)).encode()
            info = tarfile.TarInfo(f"{i:09d}.txt")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    result = CliRunner().invoke(app, ["bench", "text", "--shards", str(shards), "--batch-size", "8", "--batches", "2",
                                      "--rounds", "1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    written = json.loads(next((tmp_path / "out").glob("text-*.json")).read_text())
    assert written["captions_from"] == str(shards) and written["batches"] == 2
    assert written["mean_trimmed_context"] == pytest.approx(20.0)
    assert not (tmp_path / "out" / "scratch").exists()  # no world generated when shards are given
    missing = CliRunner().invoke(app, ["bench", "text", "--shards", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert missing.exit_code == 2 and "--shards" in missing.output and "Traceback" not in missing.output
