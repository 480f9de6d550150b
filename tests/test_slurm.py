"""Studies and training under a real single-node SLURM with accounting (examples/slurm/single-node.sh,
which CI starts): a study submitted, followed and summarised, one run requeued at its real time limit and
one preempted by ``scontrol requeue`` and ending bitwise equal to a run never stopped; ``--status`` from
the study folder alone; the budget and partition refusals against the real ``sinfo``; and the sbatch
example training on two gloo processes, stopped at its time limit and resumed to its end. Skipped, with the reason,
where no such SLURM answers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from euclip_cli import config as C
from euclip_cli.cli.main import app
from euclip_cli.rundir import RunDir, load_checkpoint

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _no_slurm() -> str:
    """Why this machine has no SLURM to test against; empty where it has one with accounting."""
    if not shutil.which("sinfo") or not shutil.which("sacct"):
        return "no SLURM commands (examples/slurm/single-node.sh start sets one up)"
    try:
        nodes = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
        accounting = subprocess.run(["sacct", "-n", "-X", "-S", "now-1minutes"], capture_output=True, text=True,
                                    timeout=20)
    except subprocess.TimeoutExpired:
        return "SLURM does not answer"
    if nodes.returncode or not any(s.startswith(("idle", "mix", "alloc")) for s in nodes.stdout.split()):
        return f"no SLURM node up ({(nodes.stderr or nodes.stdout).strip()[:100]})"
    if accounting.returncode:
        return f"SLURM has no accounting ({accounting.stderr.strip()[:100]})"
    return ""


pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.skipif(bool(_no_slurm()), reason=_no_slurm() or "-")]
RUN = ["data.batch_size=32", "optim.warmup_steps=1", "train.precision=fp32", "train.tensorboard=false",
       "data.shuffle_buffer=100", "train.log_every=1"]


def steps_done(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def wait_for(condition, seconds: float = 600.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


# A requeued job released sooner than this after its hold began can be started while its previous
# instance is still being cleaned up, and SLURM then kills it ("Job credential revoked").
RELEASE_AFTER_S = 10.0


# The time limit a released job gets (minutes): each job is stopped by its real time limit once, and its
# second instance runs to the end. One stop proves the requeue and the resume; each further one only adds a
# job start (tens of seconds) and a few steps (20 of them once took the sbatch example 13 minutes).
RESUMED_LIMIT_MIN = 20


@pytest.fixture
def released():
    """SLURM holds a requeued job about two minutes (Reason=BeginTime); release each held job after
    RELEASE_AFTER_S, with RESUMED_LIMIT_MIN for its next instance, so that the tests wait for the resume,
    not for the hold or for more time limits."""
    stop = threading.Event()

    def release():
        since: dict[str, float] = {}
        while not stop.wait(1.0):
            held = subprocess.run(["squeue", "-h", "-t", "PD", "-o", "%i %r"], capture_output=True, text=True).stdout
            holding = {job for job, _, reason in (line.partition(" ") for line in held.splitlines())
                       if reason.strip() == "BeginTime"}
            since = {job: since.get(job, time.monotonic()) for job in holding}
            for job, start in since.items():
                if time.monotonic() - start >= RELEASE_AFTER_S:
                    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now",
                                    f"TimeLimit={RESUMED_LIMIT_MIN}"], capture_output=True)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


# A job's warning, seconds before its time limit. Jobs are submitted with a limit far longer than they train, and
# the limit is lowered once the run has trained a step (`limit_reached`): from then on the warning is due, and
# SLURM sends it at its next look at time limits (within 30 s here), whatever the machine's speed.
WARNING_S = 150


def limit_reached(job: str) -> None:
    """Lower the running ``job``'s time limit to the next whole minute after one more: 60-120 s left, less than
    WARNING_S, so SLURM warns it (and would end it at that limit, were it not requeued)."""
    from euclip_cli.study.launch import slurm_hours

    used = subprocess.run(["squeue", "-h", "-j", job, "-o", "%M"], capture_output=True, text=True, check=True)
    minutes = int(slurm_hours(used.stdout.strip()) * 60) + 2
    subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], check=True, capture_output=True)


def final_weights(run: Path) -> dict:
    return load_checkpoint(RunDir(run).latest_checkpoint())["model"]


def assert_bitwise_equal(a: Path, b: Path) -> None:
    ours, theirs = final_weights(a), final_weights(b)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), [k for k in ours if not torch.equal(ours[k], theirs[k])]


def test_a_study_is_requeued_at_its_time_limit_preempted_resumed_bitwise_and_summarised(tmp_path, world, released):
    # clip's first job reaches its time limit once it has trained a step; released, its second job has
    # RESUMED_LIMIT_MIN. euclip is preempted by hand once it has trained a few steps.
    path, out = tmp_path / "study-real.toml", tmp_path / "out"
    common = json.dumps([f"data.train_dir={world / 'train'}", *RUN])
    path.write_text(f'[study]\nseeds = 1\ntasks = "world/colour"\nbaseline = "clip"\noverrides = {common}\n'
                    f'[study.resources]\ncpus = 1\nmem_gb = 2\nretries = 5\n'
                    f'[configs.clip]\nrecipe = "tiny-clip"\noverrides = ["optim.samples=12800", "train.checkpoints=40"]\n'
                    f'[configs.clip.resources]\nhours = 0.5\nwarning_s = {WARNING_S}\nretries = 5\n'
                    f'[configs.euclip]\nrecipe = "tiny-euclip"\noverrides = ["optim.samples=1280", "train.checkpoints=40"]\n')
    args = ["study", "--recipe", str(path), "--out", str(out), "--world", str(world), "--launcher", "slurm",
            "--poll", "1"]
    first = runner.invoke(app, [*args, "--no-wait"])
    assert first.exit_code == 0 and "2 submitted now" in first.output, first.output
    jobs = json.loads((out / "jobs.json").read_text())
    wait_for(lambda: steps_done(out / "runs" / "clip-seed0") >= 1, what="clip's first step")
    limit_reached(jobs["clip-seed0"]["job_id"])
    wait_for(lambda: steps_done(out / "runs" / "euclip-seed0") >= 3, what="euclip's first steps")
    subprocess.run(["scontrol", "requeue", jobs["euclip-seed0"]["job_id"]], check=True)  # a preemption

    done = runner.invoke(app, args)  # follows both jobs through sacct, then summarises
    assert done.exit_code == 0, done.output
    assert (out / "study.md").exists() and (out / "seeds.csv").exists()
    for run in ("clip-seed0", "euclip-seed0"):
        log = (out / "logs" / f"{run}.log").read_text()
        assert "stopped at step" in log and "resumed from step_" in log, log[-3000:]
    # Requeued once at the time limit (each job start writes a line to the run's log), and trained to its end.
    assert (out / "logs" / "clip-seed0.log").read_text().count("# job on") == 2
    assert steps_done(out / "runs" / "clip-seed0") == 400

    # The preempted run never stopped, by the same training command here with the job's one thread (a thread
    # count of its own would sum in another order): the same weights to the last bit. (A stop at a time limit
    # resuming bitwise is tests/test_multiprocess.py's, through the sbatch example: the same trainer's stop.)
    from euclip_cli.study.jobs import plan
    from euclip_cli.study.spec import load_claims, load_study

    one_thread = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for p in plan(load_study(str(path)), out, load_claims(), world):
        if p.name == "euclip-seed0":
            command = list(p.commands[0])
            command[command.index("--runs-dir") + 1] = str(tmp_path / "whole")
            subprocess.run(command, check=True, capture_output=True, cwd=tmp_path, env=one_thread)
            assert_bitwise_equal(out / "runs" / p.name, tmp_path / "whole" / p.name)

    # The folder alone tells the state, with the job ids SLURM gave.
    alone = runner.invoke(app, ["study", "--out", str(out), "--status"])
    assert alone.exit_code == 0 and f"clip-seed0: finished (job {jobs['clip-seed0']['job_id']}" in alone.output

    # Asked for more than the budget or the partition, nothing is submitted, against the real sinfo.
    before = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout
    costly = runner.invoke(app, ["study", "--recipe", str(path), "--out", str(tmp_path / "costly"), "--world",
                                 str(world), "--launcher", "slurm", "--resource", "gpus=1", "--throughput",
                                 "tiny-vit-c16=1", "--max-gpu-hours", "0.001"])
    assert costly.exit_code == 2 and "GPU hours" in costly.output, costly.output
    too_big = runner.invoke(app, ["study", "--recipe", str(path), "--out", str(tmp_path / "big"), "--world",
                                  str(world), "--launcher", "slurm", "--resource", f"cpus={os.cpu_count() + 1}"])
    assert too_big.exit_code == 2 and "nothing was submitted" in " ".join(too_big.output.split()), too_big.output
    assert subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout == before


def test_the_sbatch_example_trains_two_gloo_ranks_stops_at_its_time_limit_and_resumes(tmp_path, world, released):
    args = ["--runs-dir", str(tmp_path / "runs"), "--name", "sbatch", f"data.train_dir={world / 'train'}",
            *C.layered_overrides(RUN, ["optim.samples=11520", "train.checkpoints=72"])]
    env = {**os.environ, "EUCLIP_NPROC_PER_NODE": "2", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # No GPU; both cores for the two ranks; the limit reached once the run has trained a step.
    submitted = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=2",
                                "--mem=4G", "--time=30", f"--signal=B:USR1@{WARNING_S}", f"--output={tmp_path / 'job.out'}",
                                str(REPO / "examples" / "slurm" / "euclip-train.sbatch"), "tiny-clip", *args],
                               capture_output=True, text=True, env=env, cwd=REPO, check=True)
    job = submitted.stdout.strip().split(";")[0]
    run = tmp_path / "runs" / "sbatch"
    wait_for(lambda: steps_done(run) >= 1, what="the first step")
    limit_reached(job)

    def finished() -> bool:
        # A requeued job stays in the queue (pending), where sacct may call it CANCELLED for a moment.
        return not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()

    wait_for(finished, seconds=900, what=f"job {job}")

    def state() -> list[str]:
        return subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "State"], capture_output=True,
                              text=True).stdout.split()[:1]

    # Accounting can still show a requeue's state just after the job has left the queue (seen once when the
    # last instance's warning came as its run finished and the script requeued it once more, the next instance
    # finding it complete): up to two minutes for it to say COMPLETED.
    deadline = time.monotonic() + 120
    while state() != ["COMPLETED"] and time.monotonic() < deadline:
        time.sleep(1)
    output = (tmp_path / "job.out").read_text()
    assert state() == ["COMPLETED"], f"sacct says {state()}\n" + output[-3000:]
    # Stopped at its time limit, requeued by the script, and resumed: the last job's summary says from where.
    assert "requeueing job" in output and "resumed from step_" in output, output[-3000:]
    assert steps_done(run) == 360, output[-3000:]
    # Not compared with a run never stopped, which would train the 360 steps again on both cores: the script's
    # stop at the warning resuming bitwise is tests/test_multiprocess.py's (the stand-ins deliver the same
    # signal), and a stop by the real SLURM resuming bitwise is the study's preempted run's, above.
