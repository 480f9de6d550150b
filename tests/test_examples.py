"""The research aids under examples/: they run, and their arithmetic is right."""

import importlib.util
import math
import os
import random
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from euclip_cli.data.world import FAMILIES, SHAPES

PROBE = Path(__file__).resolve().parents[1] / "examples" / "tower-probe" / "probe.py"


def load_probe():
    spec = importlib.util.spec_from_file_location("tower_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_probe(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """The probe as `python probe.py ARGS` runs it, its `__main__` block included, in this process (torch is
    imported already: a fresh interpreter spent seconds importing it before each refusal); (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", [str(PROBE), *args])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(PROBE), run_name="__main__")
    return stopped.value.code, capsys.readouterr().err


def test_the_probes_mean_pairwise_cosine_matches_a_hand_computation():
    probe = load_probe()
    rows = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    # cos(r0, r1) = 0, cos(r0, r2) = cos(r1, r2) = 1/sqrt(2); each pair counted twice over 6 ordered pairs.
    assert math.isclose(probe.mean_pairwise_cosine(rows), (0 + 2 / math.sqrt(2)) / 3, rel_tol=1e-6)
    assert math.isclose(probe.mean_pairwise_cosine(torch.ones(4, 3)), 1.0, rel_tol=1e-6)


def test_the_tower_probe_trains_a_vit_and_reports_held_out_accuracy(capsys):
    load_probe().main(["--arch", "tiny-vit", "--steps", "2", "--batch", "4", "--test", "8", "--warmup", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tiny-vit: mean pairwise cosine of 8 embeddings at initialisation")
    assert [line.split(":")[0] for line in lines[1:]] == ["step 1", "step 2"]
    assert all("shape" in line and "position" in line for line in lines[1:])


def test_the_tower_probe_refuses_an_unknown_arch_in_one_line(monkeypatch, capsys):
    code, stderr = run_probe(["--arch", "no-such-arch", "--steps", "1"], monkeypatch, capsys)
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert stderr.strip().startswith("error: model.arch 'no-such-arch'")


def test_the_tower_probe_refuses_a_zero_step_count_in_one_line(monkeypatch, capsys):
    code, stderr = run_probe(["--steps", "0"], monkeypatch, capsys)
    assert code == 2 and "argument --steps: 0 is not a positive whole number" in stderr


def test_the_probes_caption_index_is_one_per_shape_and_position():
    probe = load_probe()
    shapes, cells = torch.meshgrid(torch.arange(12), torch.arange(5), indexing="ij")
    ids = probe.caption_ids(shapes.flatten(), cells.flatten())
    assert sorted(ids.tolist()) == list(range(60))
    assert (ids // 5 == shapes.flatten()).all() and (ids % 5 == cells.flatten()).all()


def test_the_probes_clip_loss_matches_a_loop_over_pairs():
    probe = load_probe()
    torch.manual_seed(0)
    images, captions, scale = torch.randn(5, 3), torch.randn(5, 3), torch.tensor(0.7)
    cos = [[float(torch.dot(a, b) / (a.norm() * b.norm())) for b in captions] for a in images]
    s = math.exp(0.7)

    def nll(row, i):  # -log softmax(row)[i], written out
        return -(s * row[i] - math.log(sum(math.exp(s * v) for v in row)))

    by_image = sum(nll(cos[i], i) for i in range(5)) / 5
    by_caption = sum(nll([cos[j][i] for j in range(5)], i) for i in range(5)) / 5
    assert math.isclose(probe.clip_loss(images, captions, scale).item(), (by_image + by_caption) / 2, rel_tol=1e-5)


@pytest.mark.parametrize("objective", ["contrastive", "text"])
def test_the_tower_probe_trains_contrastively_and_reports_zero_shot_accuracy(objective, capsys):
    load_probe().main(["--arch", "tiny-vit", "--objective", objective, "--steps", "2", "--batch", "4",
                       "--test", "8", "--warmup", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[1:]] == ["step 1", "step 2"]
    assert all("shape" in line and "position" in line for line in lines[1:])


def test_the_tower_probe_refuses_an_unknown_objective_in_one_line(monkeypatch, capsys):
    code, stderr = run_probe(["--objective", "nope"], monkeypatch, capsys)
    assert code == 2 and "argument --objective: invalid choice: 'nope'" in stderr


def test_the_probes_world_pairs_honour_the_object_count_and_caption_levels():
    probe = load_probe()
    identity = lambda image: torch.zeros(3, 2, 2)  # noqa: E731 - the captions are under test, not the pixels
    rng = random.Random(3)
    _, captions = probe.world_pairs(rng, 20, identity, mismatch=0.0, objects=2, levels=["full"])
    assert all(caption.startswith("two shapes: ") for caption in captions)
    _, captions = probe.world_pairs(rng, 20, identity, mismatch=0.0, objects=1, levels=["family"])
    assert all(any(family in caption for family in FAMILIES) for caption in captions)
    assert not any(shape in caption for caption in captions for shape in SHAPES)


def test_the_tower_probe_trains_on_the_worlds_pairs(capsys):
    load_probe().main(["--arch", "tiny-vit", "--objective", "text", "--pairs", "world", "--levels", "shape,full",
                       "--steps", "2", "--batch", "4", "--test", "8", "--warmup", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[1:]] == ["step 1", "step 2"]


@pytest.mark.parametrize("args, message", [
    (["--pairs", "world"], "--pairs world needs --objective text"),
    (["--objective", "text", "--pairs", "world", "--levels", "shape,nope"], "--levels: unknown level nope"),
    (["--objective", "text", "--pairs", "world", "--mismatch", "1"], "--mismatch: 1.0 is not in [0, 1)"),
])
def test_the_tower_probe_refuses_inconsistent_world_options_in_one_line(args, message, monkeypatch, capsys):
    code, stderr = run_probe(args, monkeypatch, capsys)
    assert code == 2 and message in stderr


def test_the_gpu_checklists_summary_tables_its_runs_and_the_matrix(tmp_path):
    """The checklist runs only on a GPU, rarely lent: its summary step is run here on runs made by hand."""
    import json

    summarize = Path(__file__).resolve().parents[1] / "examples" / "gpu" / "summarize.py"
    runs, out = tmp_path / "runs", tmp_path / "out"
    for name, rates in (("gpu-bf16", [100.0, 200.0, 300.0, 300.0]), ("matrix-as-is", [50.0, 400.0, 400.0, 200.0]),
                        ("matrix-loaders-out", [60.0, 800.0, 800.0, 800.0]),
                        ("memory-b512-checkpointed", [10.0, 10.0, 10.0])):
        (runs / name).mkdir(parents=True)
        (runs / name / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "loss": 3.0, "samples_per_s": r, "data_wait_share": 0.5,
                        "loader_samples_per_s": 900.0, "loader_cpu_share": 0.9, "gpu_peak_mib": 1000.0}) + "\n"
            for i, r in enumerate(rates)))
    (out / "bench").mkdir(parents=True)
    (out / "bench" / "train-1.json").write_text(json.dumps({
        "settings": {"arch": "bench-vit"}, "speedup_vs_openclip": {"median": 0.5, "min": 0.4, "max": 0.6},
        "measurements": {"openclip": {"samples_per_s": 1000.0, "overall_samples_per_s": 900.0, "data_wait_share": 0.1},
                         "euclip": {"samples_per_s": 500.0}}}))
    # The plan's line as `euclip train --plan` prints it, wrapped by a narrow terminal.
    (out / "logs").mkdir()
    (out / "logs" / "plan-b512-checkpointed.log").write_text(
        "  one GPU at batch 512: 12.50 GiB without checkpointing,\n1.25 GiB with\n")
    summary = tmp_path / "summary.md"
    done = subprocess.run([sys.executable, str(summarize), str(runs), str(summary), str(out)], text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = summary.read_text()
    assert "| gpu-bf16 | 4 | 3.000 | 300 | 50% | 900 (90%) | 1000 | - |" in text
    # Steps 3 and 4 are timed: at 400 and 200 samples/s, 266.7 over both (their harmonic mean).
    assert "| as-is | 267 | 300 | 1.00 | 50% | 900 (90%) | 1000 |" in text
    assert "| loaders-out | 800 | 800 | 3.00 | 50% | 900 (90%) | 1000 |" in text
    assert "| openclip-trainer | 900 | 1000 | 3.37 | 10% | - | - |" in text
    assert "matrix-" not in text.split("The matrix")[0].split("| run |")[1]  # the matrix rows sit in their table
    assert "| bench | bench-vit | 500 | 1000 | 0.50 (0.40-0.60) |" in text
    # 1000 MiB measured against the checkpointed figure of the plan, 1.25 GiB.
    assert "| b512-checkpointed | 0.98 | 1.25 | 0.78 |" in text


@pytest.mark.slow
def test_the_bookkeeping_scale_script_builds_its_study_and_measures_both_readers(tmp_path, monkeypatch):
    """A small version (2 seeds: 20 runs of 5 records, one of 50): the summary writes the study's tables and the
    report its own, and each reader's seconds and peak memory are printed (the scale is the script's default)."""
    monkeypatch.chdir(tmp_path)
    script = Path(__file__).resolve().parents[1] / "examples" / "bookkeeping" / "scale.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "scale"), "--seeds", "2",
                           "--steps", "5", "--long-steps", "50"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("20 runs") and len(lines) == 3, done.stdout
    assert all("s, peak resident memory" in line for line in lines[1:])
    assert (tmp_path / "scale" / "study.csv").exists() and (tmp_path / "scale" / "tables" / "embedded.md").exists()


@pytest.mark.parametrize("args, message", [
    (["--part", "8"], "error: --part takes 1 to 7, not '8'"), (["--part"], "error: --part takes 1 to 7, not ''"),
    (["--parts", "1"], "error: unknown argument '--parts'")])
def test_the_gpu_checklist_refuses_a_part_it_does_not_have_before_it_installs_or_writes_anything(tmp_path, args, message):
    """Its rows on a stand-in for the lent machine, up to the first that needs a GPU: tests/test_lent_machine.py."""
    script = Path(__file__).resolve().parents[1] / "examples" / "gpu" / "checklist.sh"
    done = subprocess.run(["bash", str(script), str(tmp_path / "out"), *args], capture_output=True, text=True,
                          env={**os.environ, "EUCLIP_WHEELHOUSE": str(tmp_path / "none")}, timeout=60)
    assert done.returncode == 2 and done.stderr.splitlines() == [f"{message}; usage: examples/gpu/checklist.sh OUT "
                                                                  f"[--part N]...   (N: 1 to 7)"], done.stderr
    assert done.stdout == "" and not (tmp_path / "out").exists()
