"""Commands that meet on one folder: each works beside the other or is refused in one line, and nothing
already written is lost (#45). Training beside training is tests/test_trainer_faults.py's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from euclip_cli import config as C
from euclip_cli.cli.main import app
from euclip_cli.rundir import RunDir, folder_lock

runner = CliRunner()
TINY = ["optim.samples=64", "data.batch_size=32", "optim.warmup_steps=1", "train.log_every=1", "train.precision=fp32"]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


def one_error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return " ".join(result.output.split())


def test_a_second_study_on_one_folder_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "study"
    with folder_lock(out, RuntimeError):  # the first study, still running
        result = runner.invoke(app, ["study", "--recipe", "study-geometries", "--configs", "clip,euclip", "--out", str(out)])
    assert result.exit_code == 2
    assert "is in use by another euclip study" in one_error(result)
    assert not (tmp_path / "data").exists()  # no world generated, nothing trained


def test_a_study_whose_recipe_changed_since_its_runs_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """A run of the folder trained under another learning rate (the recipe was edited since): counting
    it as finished would mix two configurations in one table; retraining would be refused run by run."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "study"
    from euclip_cli.study.spec import load_study

    study = load_study("study-geometries", None, [], ["clip", "euclip"])
    run = RunDir(out / "runs" / study.run_name("clip", 0))
    old = C.load_config(study.configs["clip"].recipe, [*study.overrides("clip", 0), "optim.lr=1e-3"])
    run.claim(C.to_dict(old), {})
    (run.path / ".study-done").write_text(json.dumps([["trained", "by", "an", "older", "recipe"]]))
    before = snapshot(out)
    result = runner.invoke(app, ["study", "--recipe", "study-geometries", "--configs", "clip,euclip", "--out", str(out)])
    assert result.exit_code == 2
    error = one_error(result)
    assert run.path.name in error and "optim.lr" in error and "--out NEW" in error
    assert snapshot(out) == before and not (tmp_path / "data").exists()


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    result = runner.invoke(app, ["train", "--recipe", "tiny-clip", f"data.train_dir={world / 'train'}", *TINY,
                                 "--runs-dir", str(folder)])
    assert result.exit_code == 0, result.output
    return folder / "tiny-clip"


def test_eval_and_analyze_run_beside_the_trainer_holding_the_run(trained, world):
    """A trainer holds its run (its lock) while it writes checkpoints; eval and analyze read the newest
    complete checkpoint beside it, and add their own files without touching the trainer's."""
    run = RunDir(trained)
    trainer_files = {k: v for k, v in snapshot(trained).items() if not k.startswith(("eval", "analysis", "cache"))}
    with run.lock():
        evaluated = runner.invoke(app, ["eval", str(trained), "--tasks", "world/shapes", "--world", str(world)])
        analysed = runner.invoke(app, ["analyze", "distances", str(trained), "--world", str(world),
                                       "--protocol", "euclip"])
    assert evaluated.exit_code == 0, evaluated.output
    assert analysed.exit_code == 0, analysed.output
    assert [line["key"] for line in run.eval_lines()] == ["world/shapes"]
    assert (run.analysis_dir / "distances.json").exists()
    assert {k: v for k, v in snapshot(trained).items() if k in trainer_files} == trainer_files


HOLDER = """
import multiprocessing, sys, time
from pathlib import Path
from euclip_cli.rundir import folder_lock



def work(started):  # as a DataLoader's worker: forked, running, never exec'd
    started.set()
    time.sleep(120)


fork = multiprocessing.get_context("fork")
with folder_lock(Path(sys.argv[1]), RuntimeError):
    started = fork.Event()
    worker = fork.Process(target=work, args=(started,))
    worker.start()
    started.wait()  # running: on a loaded machine a child just forked may not have run at all yet
    print(worker.pid, flush=True)
    time.sleep(120)
"""


def test_a_lock_dies_with_its_holder_though_a_worker_it_forked_lives_on(tmp_path):
    """A trainer killed with SIGKILL leaves its forked loader workers alive for a few seconds; they must
    not hold its run, or the same command restarted at once is refused as busy (found by
    tests/test_resume.py's device-decode case under load)."""
    import os
    import signal
    import subprocess
    import sys

    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    worker = int(holder.stdout.readline())
    try:
        with pytest.raises(RuntimeError):  # held while the holder lives
            with folder_lock(folder, RuntimeError):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        os.kill(worker, 0)  # the worker outlived it (raises if not: then this test would prove nothing)
        with folder_lock(folder, RuntimeError):
            pass
    finally:
        holder.kill()
        os.kill(worker, signal.SIGKILL)


WRITER = """
import sys
from pathlib import Path
from euclip_cli.rundir import write_text_atomic
path, letter = Path(sys.argv[1]), sys.argv[2]
for _ in range(300):
    write_text_atomic(path, letter * 200_000)
"""


def test_two_processes_writing_one_file_at_once_each_leave_it_whole(tmp_path):
    """Two evaluations of one run rewrite its results and its feature cache at once (no lock holds an
    evaluation): through one shared temporary name, one writer's rename took the file from under the other
    (an error) or their bytes mixed. Each writer now fills a file of its own."""
    import subprocess
    import sys

    target = tmp_path / "eval_results.jsonl"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(target), letter], stderr=subprocess.PIPE, text=True)
               for letter in "ab"]
    for writer in writers:
        _, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
    assert target.read_text() in ("a" * 200_000, "b" * 200_000)
    assert [p.name for p in tmp_path.iterdir()] == ["eval_results.jsonl"]  # no temporary file left behind
