"""``euclip bench train`` runs both trainers and reports ratios computed from their own logs (no timing asserted)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from euclip_bench.measure import OPENCLIP_RATE
from euclip_cli.cli.main import app
from euclip_cli.study.spec import load_study

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def generated_bench_world(tmp_path_factory) -> Path:
    """The bench's 10,000-sample world, generated once for this file (seconds each time)."""
    from euclip_bench.measure import ensure_world

    return ensure_world(tmp_path_factory.mktemp("bench")).parent


@pytest.fixture
def world_in_scratch(tmp_path, generated_bench_world) -> None:
    """tmp_path as an --out whose scratch folder holds the bench's world already, as a user's second bench in
    the same --out finds it (the bench reuses the world it generated there)."""
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / generated_bench_world.name).symlink_to(generated_bench_world)


def test_openclip_throughput_lines_are_parsed():
    line = "Train Epoch: 0 [ 512/2560 (20%)] Data (t): 0.001 Batch (t): 2.345, 109.200/s, 109.200/s/gpu LR: 0.000100"
    assert OPENCLIP_RATE.findall(line) == ["109.200"]


def test_bench_train_runs_every_stage_for_real_and_reports_them(tmp_path, world_in_scratch):
    # One thread per trainer: the other test worker holds the other core, and two threads would spin for it.
    result = CliRunner().invoke(app, ["bench", "train", "--arch", "tiny-vit", "--batch-size", "16", "--steps", "2",
                                      "--warmup", "1", "--rounds", "1", "--threads", "1", "--no-compile",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    study = load_study("study-geometries")
    study_runs = len(study.configs) * len(study.seeds)
    for line in ("euclip / OpenCLIP as its users run it", "euclip / OpenCLIP with euclip's attention kernel",
                 "accumulation overhead", "measured in the same run", "euclip / measured peak",
                 "OpenCLIP as its users run it / measured peak", "at 100% of the measured peak",
                 "the embedded study's recipe (tiny-clip as shipped)", f"study-geometries ({study_runs} runs",
                 "euclip waited for data", "its loaders could give"):
        assert line in text, line
    report = json.loads(next(tmp_path.glob("train-*.json")).read_text())
    m = report["measurements"]
    assert set(m) == {"euclip", "openclip", "openclip_math", "openclip_synthetic", "euclip_accum2", "tiny_recipe"}
    for v in m.values():
        assert v["name"] in result.output  # whole, however narrow the terminal: two OpenCLIP rows differ at the end
        assert len(v["per_round"]) == 1 and v["per_round"][0] > 0 and v["peak_rss_mib"] > 100
        assert v["steps_timed"] == 2
        assert 0.0 <= v["data_wait_share"] <= 1.0  # every trainer's, OpenCLIP's read from its own log
        # euclip's loaders report what they could deliver; OpenCLIP's log does not say.
        assert (v["loader_samples_per_s"] is not None) == v["name"].startswith(("euclip", "tiny"))
    assert report["speedup_vs_openclip"]["median"] == pytest.approx(m["euclip"]["per_round"][0] / m["openclip"]["per_round"][0])
    peaks = report["peak_tflops"]["per_round"]
    assert len(peaks) == 1 and 0.001 < peaks[0] < 10_000
    # --precision defaults to auto, resolved on this device before either trainer sees it.
    assert report["settings"]["precision"] in ("fp32", "bf16")
    assert len(report["fp32_peak_tflops"]["per_round"]) == 1  # measured whatever the bench's precision
    # euclip's fraction counts the FLOPs it computes (trimmed text), OpenCLIP's the model's.
    assert report["euclip_flops_per_sample"] < report["flops_per_sample"]
    assert report["fraction_of_peak"]["median"] == pytest.approx(
        report["euclip_flops_per_sample"] * m["euclip"]["per_round"][0] / 1e12 / peaks[0])
    assert report["openclip_fraction_of_peak"]["median"] == pytest.approx(
        report["flops_per_sample"] * m["openclip"]["per_round"][0] / 1e12 / peaks[0])
    study = report["study_training"]
    assert study["runs"] == study_runs and study["training_s"] == pytest.approx(study["samples"] / m["tiny_recipe"]["samples_per_s"])
    assert report["flops_per_sample"] > 1e8


def test_rounds_interleave_the_stages_and_every_ratio_is_taken_within_a_round(tmp_path, monkeypatch):
    """Stand-in stages (the real ones run above) whose rates drift across rounds, as a machine's do."""
    from euclip_bench import measure as bench

    calls = []
    # Rates per round; the per-round ratios (2.0, 1.0, 3.0) have median 2.0, the medians' ratio 60/40 = 1.5.
    rates = {"euclip": [40.0, 60.0, 90.0], "openclip": [20.0, 60.0, 30.0], "openclip-math": [50.0, 50.0, 50.0],
             "openclip-synthetic": [70.0, 70.0, 70.0], "euclip-accum2": [20.0, 40.0, 90.0], "tiny": [5.0, 6.0, 7.0],
             "euclip-hycoclip": [10.0, 40.0, 30.0]}

    def stand_in(name):
        calls.append(name)
        r = sum(c == name for c in calls) - 1
        return bench.Measurement(name, rates[name][r], [rates[name][r]], 3, 500.0)

    monkeypatch.setattr(bench, "ensure_world", lambda work: work)
    monkeypatch.setattr(bench, "euclip_run", lambda work, w, s, k, loss="infonce": stand_in(
        "euclip-hycoclip" if loss == "hycoclip" else "euclip" if k == 1 else f"euclip-accum{k}"))
    monkeypatch.setattr(bench, "openclip_run", lambda work, s, w, math_attention=False: stand_in(
        "openclip-math" if math_attention else "openclip" if w is not None else "openclip-synthetic"))
    monkeypatch.setattr(bench, "tiny_recipe_run", lambda work, w, s: stand_in("tiny"))
    peaks = iter([1.0, 4.0, 2.0, 8.0, 3.0, 12.0])  # bf16, fp32 of each round
    monkeypatch.setattr(bench, "matmul_peak_tflops", lambda work, s, precision=None: (
        calls.append(f"peak-{precision or s.precision}"), next(peaks))[1])
    monkeypatch.setattr(bench, "shard_captions", lambda shards, count: ["a star"] * count)
    # The model's FLOPs (OpenCLIP's) and the fewer euclip computes on the shards' captions.
    monkeypatch.setattr(bench, "flops_per_sample", lambda arch, captions=None: 8e9 if captions else 1e10)

    report = bench.bench_train(tmp_path, bench.Settings(rounds=3), hycoclip=True)
    one_round = ["euclip", "openclip", "openclip-math", "openclip-synthetic", "euclip-accum2", "tiny",
                 "euclip-hycoclip", "peak-bf16", "peak-fp32"]
    assert calls == one_round * 3
    assert report["speedup_vs_openclip"] == {"median": 2.0, "min": 1.0, "max": 3.0, "per_round": [2.0, 1.0, 3.0]}
    assert report["speedup_vs_openclip_math"]["per_round"] == pytest.approx([0.8, 1.2, 1.8])
    assert report["accumulation_overhead"]["per_round"] == pytest.approx([2.0, 1.5, 1.0])
    assert report["hycoclip_step_cost"]["per_round"] == pytest.approx([4.0, 1.5, 3.0])
    assert report["measurements"]["euclip"]["samples_per_s"] == 60.0
    assert report["measurements"]["euclip"]["steps_timed"] == 9
    assert report["peak_tflops"] == {"median": 2.0, "per_round": [1.0, 2.0, 3.0]}
    assert report["fp32_peak_tflops"]["per_round"] == [4.0, 8.0, 12.0]
    # euclip's TFLOP/s per round (0.32, 0.48, 0.72) over that round's peak.
    assert report["fraction_of_peak"]["per_round"] == pytest.approx([0.32, 0.24, 0.24])
    # OpenCLIP's (0.2, 0.6, 0.3) over the same peaks.
    assert report["openclip_fraction_of_peak"]["per_round"] == pytest.approx([0.2, 0.3, 0.1])
    # At each round's peak euclip would do 125, 250 and 375 samples/s: over OpenCLIP's 20, 60 and 30.
    assert report["speedup_ceiling"]["per_round"] == pytest.approx([6.25, 250 / 60, 12.5])


def test_openclip_reads_the_shards_euclip_reads_and_its_synthetic_run_is_apart(tmp_path, monkeypatch):
    from euclip_bench import measure as bench

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
    assert on_shards.data_wait_share is None  # these lines carry no data time


def test_openclip_data_time_becomes_the_share_of_each_step_spent_waiting(tmp_path, monkeypatch):
    from euclip_bench import measure as bench

    lines = ["Data (t): 0.900 Batch (t): 1.000, 128.0/s, 128.0/s/gpu LR: 1",  # warm-up: dropped
             "Data (t): 0.050 Batch (t): 0.200, 640.0/s, 640.0/s/gpu LR: 1",
             "Data (t): 0.100 Batch (t): 0.200, 640.0/s, 640.0/s/gpu LR: 1",
             "Data (t): 0.020 Batch (t): 0.400, 320.0/s, 320.0/s/gpu LR: 1"]
    monkeypatch.setattr(bench, "run_child", lambda command, env, cwd: ("\n".join(lines) + "\n", 500.0))
    measured = bench.openclip_run(tmp_path, bench.Settings(steps=3, warmup=1), None)
    assert measured.data_wait_share == pytest.approx(0.25)  # the median of 0.25, 0.5 and 0.05
    assert measured.samples_per_s == 640.0


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


def test_openclips_trainer_reads_past_the_end_of_a_shard(tmp_path):
    """open_clip_train 3.3's pipeline fails on the end-of-shard marker of the pinned webdataset
    (KeyError 'fname') unless ``openclip_compatible`` turns it off: 12 batches of 16 from a world of
    one 100-sample shard cross its end more than once, in the bench's OpenCLIP child."""
    from euclip_bench import measure as bench
    from euclip_cli.data.world_files import generate
    from euclip_cli.worlddir import WorldSettings

    generate(tmp_path / "w", WorldSettings(seed=1, samples=100, eval_size=8), workers=1)
    settings = bench.Settings(arch="tiny", batch_size=16, steps=10, warmup=2, threads=1, precision="fp32", workers=1)
    measured = bench.openclip_run(tmp_path, settings, tmp_path / "w" / "train")
    assert measured.steps_timed == 10 and measured.overall_samples_per_s > 0


def test_bench_text_times_full_and_trimmed_contexts_on_the_worlds_captions(tmp_path, world_in_scratch):
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


def test_synthetic_captions_have_the_asked_mean_word_count_and_one_token_per_word():
    """Against open_clip's own tokenizer: each caption is its word count plus start and end tokens,
    and the word counts' mean is the one asked for (20,000 draws: the log-normal's standard error
    of the mean is about 0.06 words at a mean of 10)."""
    import numpy as np
    import open_clip

    from euclip_cli.data.photo_shards import synthetic_captions

    captions = synthetic_captions(10, 20_000)
    words = np.array([len(c.split()) for c in captions])
    assert words.mean() == pytest.approx(10, abs=0.3) and words.min() >= 1
    assert np.median(words) < words.mean()  # right-skewed, as web alt-text lengths are
    tokens = open_clip.get_tokenizer("ViT-B-32")(captions[:500])
    ends = tokens.argmax(dim=-1)  # end-of-text has the largest id
    assert ends.tolist() == [min(len(c.split()) + 1, 76) for c in captions[:500]]
    assert synthetic_captions(10, 50) == synthetic_captions(10, 50)  # seeded: a rerun times the same captions


def test_bench_text_on_a_datacomp_like_length_distribution(tmp_path):
    result = CliRunner().invoke(app, ["bench", "text", "--caption-words", "10", "--batch-size", "16", "--batches", "2",
                                      "--rounds", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = json.loads(next(tmp_path.glob("text-*.json")).read_text())
    assert written["captions_from"].startswith("synthetic captions, word counts log-normal with mean 10")
    # 32 captions of about 12 tokens on a 32-token context: trimmed to about 16 on average.
    assert 8 < written["mean_caption_tokens"] < 20 and written["mean_trimmed_context"] < written["context"]
    assert not (tmp_path / "scratch").exists()  # no world generated for synthetic captions
    both = CliRunner().invoke(app, ["bench", "text", "--caption-words", "10", "--shards", str(tmp_path),
                                    "--out", str(tmp_path)])
    assert both.exit_code == 2 and "--shards and --caption-words" in both.output
    unknown = CliRunner().invoke(app, ["bench", "text", "--arch", "ViT-Q-99", "--out", str(tmp_path)])
    assert unknown.exit_code == 2 and "--arch: 'ViT-Q-99'" in " ".join(unknown.output.split())


def test_bench_profile_accounts_for_every_matrix_product_of_the_step(tmp_path, world_in_scratch):
    """The profile's matrix-product FLOPs (torch's profiler counts them per op) against an independent
    count of the same step's products (torch's FlopCounterMode over both encoders' forward and
    backward on the same trimmed captions, attention as the trainer runs it on a CPU)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from euclip_bench.measure import ensure_world, shard_captions
    from euclip_cli.towers import build_clip, tokenizer_for
    from euclip_cli.towers.text import text_features

    callers = torch.get_num_threads()
    torch.set_num_threads(1)  # the profile takes every core, for itself alone: the caller's one thread comes back
    try:
        result = CliRunner().invoke(app, ["bench", "profile", "--arch", "tiny-vit", "--batch-size", "16", "--steps", "1",
                                          "--out", str(tmp_path)])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(callers)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "linear layers (mm, addmm)" in text and "of the step at" in text and "USDT" not in text
    written = json.loads(next(tmp_path.glob("profile-*.json")).read_text())

    clip = build_clip("tiny-vit")
    tokens = tokenizer_for("tiny-vit")(shard_captions(ensure_world(tmp_path / "scratch"), 16))
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        (clip.encode_image(torch.randn(16, 3, 64, 64)).sum() + text_features(clip, tokens).sum()).backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    linear, attention = counts["aten.mm"] + counts["aten.addmm"], counts["aten.bmm"]
    # The loss's 16 x 16 logits are a few products more in the profile: under 0.1%.
    assert written["kinds_gflop"]["linear layers (mm, addmm)"] == pytest.approx(linear / 1e9, rel=1e-3)
    assert written["kinds_gflop"]["attention products (bmm)"] == pytest.approx(attention / 1e9, rel=1e-3)
    assert 0 < written["matrix_tflops"] and 0 < written["peak_tflops"]
    assert json.loads(Path(written["trace"]).read_text())["traceEvents"]  # a trace chrome://tracing opens


@pytest.mark.parametrize("args, named", [
    (["text", "--caption-words", "0"], "--caption-words: 0.0 is not a mean of at least one word"),
    (["profile", "--arch", "ViT-Q-99"], "--arch: 'ViT-Q-99' is not one of"),
    (["train", "--arch", "ViT-Q-99"], "--arch: 'ViT-Q-99' is neither one of"),
])
def test_a_bad_bench_option_is_one_line_naming_it(tmp_path, args, named):
    result = CliRunner().invoke(app, ["bench", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2 and named in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output and not any(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["train", "text", "profile"])
def test_an_unknown_precision_is_one_line_naming_the_option(tmp_path, command):
    result = CliRunner().invoke(app, ["bench", command, "--precision", "fp8", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--precision: 'fp8' is not one of auto, fp32, bf16, fp16" in " ".join(result.output.split())
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_euclip_flops_count_each_caption_on_its_trimmed_context(monkeypatch):
    """Against independent counts: a caption filling the context costs the model's full count, and
    a short one what the same tower built with an 8-token context costs."""
    import dataclasses

    from euclip_bench import measure as bench
    from euclip_cli.towers import archs

    arch = "tiny-vit"
    cfg = archs.ARCHS[arch]
    short = dataclasses.replace(cfg, name="tiny-vit-ctx8", text_cfg=dict(cfg.text_cfg, context_length=8))
    monkeypatch.setitem(archs.ARCHS, short.name, short)
    full = bench.flops_per_sample(arch)
    eight = bench.flops_per_sample("tiny-vit-ctx8")
    assert eight < full
    # "a star": start, two words, end: pooled at position 3, rounded up to 8.
    assert bench.flops_per_sample(arch, ["a star", "a picture of a circle"]) == pytest.approx(eight)
    long_caption = " ".join(["star"] * 40)  # truncated to the context: nothing to trim
    assert bench.flops_per_sample(arch, [long_caption] * 2) == pytest.approx(full)
    assert bench.flops_per_sample(arch, ["a star", long_caption]) == pytest.approx((eight + full) / 2)


def test_euclip_runs_are_measured_from_their_records_after_the_warm_up(tmp_path):
    from euclip_bench import measure as bench

    run = tmp_path / "run"
    run.mkdir()
    records = [{"step": 1, "samples_per_s": 5.0, "data_wait_share": 0.9, "loader_samples_per_s": 10.0,
                "loader_cpu_share": 0.1},  # warm-up: dropped
               {"step": 2, "samples_per_s": 40.0, "data_wait_share": 0.2, "loader_samples_per_s": 300.0,
                "loader_cpu_share": 0.9},
               {"step": 3, "samples_per_s": 50.0, "data_wait_share": 0.1, "loader_samples_per_s": 100.0,
                "loader_cpu_share": 0.7},
               {"step": 4, "samples_per_s": 60.0, "data_wait_share": 0.3, "loader_samples_per_s": 200.0,
                "loader_cpu_share": 0.8}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    measured = bench._from_records("euclip-accum1", run, warmup=1, rss=100.0)
    assert (measured.samples_per_s, measured.steps_timed) == (50.0, 3)
    assert measured.data_wait_share == pytest.approx(0.2)
    assert measured.loader_samples_per_s == 200.0 and measured.loader_cpu_share == pytest.approx(0.8)
    rounds = bench.over_rounds([measured, bench.Measurement("euclip-accum1", 70.0, [70.0], 3, 90.0, None, 0.4, 400.0,
                                                            0.6)])
    assert rounds.loader_samples_per_s == pytest.approx(300.0) and rounds.loader_cpu_share == pytest.approx(0.7)


def test_bench_loader_times_euclips_loader_and_openclips_interleaved_and_reports_them(tmp_path, world_in_scratch):
    result = CliRunner().invoke(app, ["bench", "loader", "--arch", "tiny", "--batch-size", "8", "--workers", "1",
                                      "--batches", "3", "--warmup", "1", "--rounds", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "euclip (one buffer a batch)" in text and "OpenCLIP's pipeline (reference)" in text
    assert "euclip, a box per sample (HyCoCLIP's)" in text
    report = json.loads(next(tmp_path.glob("loader-*.json")).read_text())
    assert report["settings"] == {"arch": "tiny", "batch_size": 8, "workers": 1, "batches": 3, "warmup": 1,
                                  "rounds": 2, "device": "cpu", "decoder": "pil",
                                  "shards": str(tmp_path / "scratch" / "world-10000" / "train")}
    m = report["measurements"]
    for kind in ("euclip", "euclip-boxes", "openclip"):
        assert len(m[kind]["per_round"]) == 2 and all(r > 0 for r in m[kind]["per_round"])
    assert m["euclip"]["loader_samples_per_s"] > 0 and 0 < m["euclip"]["loader_cpu_share"] <= 1.5
    assert m["openclip"]["loader_samples_per_s"] is None  # OpenCLIP's loaders do not say what a batch cost
    ratios = [a / b for a, b in zip(m["euclip"]["per_round"], m["openclip"]["per_round"])]
    assert report["euclip_vs_openclip"]["per_round"] == pytest.approx(ratios)
    assert f"euclip / OpenCLIP: {report['euclip_vs_openclip']['median']:.2f}x" in text
    boxes = [a / b for a, b in zip(m["euclip"]["per_round"], m["euclip-boxes"]["per_round"])]
    assert report["boxes_cost"]["per_round"] == pytest.approx(boxes)
    assert f"a sample with its box costs {report['boxes_cost']['median']:.2f}x" in text


@pytest.mark.parametrize("args, message", [
    (["--arch", "nope"], "--arch: 'nope' is neither"),
    (["--device", "cuda"], "device 'cuda': this machine has no CUDA GPU"),
])
def test_bench_loader_refuses_bad_options_in_one_line(tmp_path, args, message):
    result = CliRunner().invoke(app, ["bench", "loader", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2 and message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_bench_ops_counts_every_grouping_against_openclip_on_the_same_captions(tmp_path, world_in_scratch):
    """On 16 of the world's captions, one group runs the text tower once and every length its own
    group runs it once per length: the counts grow by a tower's worth per group, the host never waits
    for the device in euclip's step, and only grouping by every length keeps all of trimming's saving."""
    result = CliRunner().invoke(app, ["bench", "ops", "--arch", "tiny", "--batch-size", "16", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(next(tmp_path.glob("ops-*.json")).read_text())
    rows = {r["text_groups"]: r for r in report["euclip"]}
    assert set(rows) == {0, 1, 2, 3}
    step = {k: r["phases"]["step"]["ops"] for k, r in rows.items()}
    groups = {k: r["groups_in_batch"] for k, r in rows.items()}
    assert groups[1] == 1 and groups[2] == 2 and groups[0] >= groups[3] >= 2
    per_group = (step[2] - step[1]) / (groups[2] - groups[1])
    assert per_group > 20  # a whole text tower's forward and backward
    assert step[0] == pytest.approx(step[1] + per_group * (groups[0] - 1), rel=0.02)
    assert all(r["phases"]["step"]["reads"] == 0 and r["phases"]["update"]["reads"] == 0 for r in rows.values())
    assert rows[0]["saving_kept"] == 1.0 and rows[1]["text_flops"] >= rows[2]["text_flops"] >= rows[0]["text_flops"]
    assert report["openclip"]["step"]["ops"] > 0
    assert rows[1]["step_vs_openclip"] == pytest.approx(step[1] / report["openclip"]["step"]["ops"])


def test_the_op_counter_counts_launches_and_the_reads_that_wait_for_a_device():
    import torch

    from euclip_bench.ops import counted

    x = torch.randn(8, 4)
    counter = counted(lambda: (x.t().contiguous() * 2).sum().item())
    assert counter.ops == {"aten.clone": 1, "aten.mul": 1, "aten.sum": 1, "aten._local_scalar_dense": 1}
    assert counter.reads == {"aten._local_scalar_dense": 1}  # .item(); the transpose is a view, not counted
    assert counted(lambda: x[x > 0]).reads["aten.index"] == 1  # a boolean mask's size is the data's


@pytest.mark.slow
def test_bench_feed_runs_every_loop_and_its_loader_and_reports_efficiencies(tmp_path, world_in_scratch):
    result = CliRunner().invoke(app, ["bench", "feed", "--batch-size", "16", "--steps", "3", "--warmup", "1",
                                      "--rounds", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(next(tmp_path.glob("feed-*.json")).read_text())
    assert set(report["loops"]) == {"euclip_staged", "euclip_unstaged", "euclip_on_openclip_pipeline", "openclip_loop"}
    for key, loop in report["loops"].items():
        loader = {"euclip_staged": "euclip", "euclip_unstaged": "euclip"}.get(key, "openclip")
        assert loop["steps_timed"] == 3 and loop["overall_samples_per_s"] > 0
        assert report["efficiency"][key]["median"] == pytest.approx(
            loop["overall_samples_per_s"] / report["loaders"][loader]["samples_per_s"])
    text = " ".join(result.output.split())
    assert "euclip's loop, staged: efficiency" in text and "OpenCLIP's loop's" in text


@pytest.mark.parametrize("args", [
    ["loader", "--arch", "tiny", "--batch-size", "4", "--workers", "0", "--batches", "1", "--rounds", "1"],
    ["ops", "--arch", "tiny", "--batch-size", "4"],
    ["feed", "--batch-size", "4", "--steps", "1", "--rounds", "1"],
    ["text", "--caption-words", "5", "--batch-size", "4", "--batches", "1", "--rounds", "1"],  # no scratch: only the result
    ["profile", "--arch", "tiny", "--batch-size", "4", "--steps", "1"],
], ids=["loader", "ops", "feed", "text", "profile"])
def test_a_bench_whose_out_is_a_file_says_so_in_one_line(tmp_path, args):
    notes = tmp_path / "notes.md"
    notes.write_text("mine")
    result = CliRunner().invoke(app, ["bench", *args, "--out", str(notes)])
    assert result.exit_code == 2, result.output
    assert f"{notes} is a file where a folder is needed" in " ".join(result.output.split())
    assert "Traceback" not in result.output and notes.read_text() == "mine"


def test_openclip_runs_its_own_registered_model_by_name(tmp_path, monkeypatch):
    """An open_clip model (the GPU checklist's ViT-B/32 row) goes to OpenCLIP's trainer by its own name;
    euclip's in-code towers go as a model config written for it."""
    from euclip_bench import measure as bench

    commands = []
    monkeypatch.setattr(bench, "run_child", lambda command, env, cwd: (
        commands.append(command) or "Batch (t): 0.1, 100.0/s, 100.0/s/gpu LR: 1\n" * 3, 500.0))
    bench.openclip_run(tmp_path, bench.Settings(arch="ViT-B-32", steps=2, warmup=1), None)
    bench.openclip_run(tmp_path, bench.Settings(arch="tiny", steps=2, warmup=1), None)
    (vit, tiny) = commands
    assert vit[3] == "-" and vit[vit.index("--model") + 1] == "ViT-B-32"
    assert tiny[3] == str(tmp_path / "euclip-tiny.json") and tiny[tiny.index("--model") + 1] == "euclip-tiny"
    assert json.loads((tmp_path / "euclip-tiny.json").read_text())["embed_dim"] == 128
