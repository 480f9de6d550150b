"""Two CPU processes through the CLI (torchrun, gloo), directly and through the SLURM example script."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from euclip_cli import config as C
from euclip_cli.rundir import RunDir, load_checkpoint

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ARGS = ["data.batch_size=32", "optim.samples=128", "optim.warmup_steps=2", "train.precision=fp32",
        "train.log_every=1", "train.tensorboard=false", "data.shuffle_buffer=100"]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # The command name, in parentheses, may hold spaces: the fields after its closing one are plain.
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_run(run: Path, steps: int) -> None:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # rank 0 alone writes the log
    state = load_checkpoint(RunDir(run).latest_checkpoint())
    assert state["step"] == steps and len(state["data"]) == 2  # one data position per rank


def test_nproc_per_node_trains_with_two_processes_and_resumes(world, tmp_path):
    command = [sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--nproc-per-node", "2",
               "--runs-dir", str(tmp_path), f"data.train_dir={world / 'train'}", *ARGS]
    first = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "scratch: 4 steps" in first.stdout
    check_run(tmp_path / "tiny-clip", 4)
    again = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0 and "already complete" in again.stdout


def wait_for_records(metrics: Path, count: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= count):
        time.sleep(0.1)
    assert metrics.exists(), f"no training records in {metrics} after {timeout} s"


def slurm_stand_ins(tmp_path: Path) -> dict:
    """Stand-ins for SLURM's commands (this machine is the job's only node); the environment to run
    the example script in. ``scontrol requeue`` is recorded in ``tmp_path/requeued``. ``srun`` runs its
    step's task in a session of its own and, as a real srun does when it is sent SIGTERM ("srun: forcing
    job termination"), kills every process of the step outright; ``scancel --signal=SIG JOB.0`` signals the step's tasks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\nif [ "$1" = requeue ]; then echo "$@" >> {tmp_path / "requeued"}; '
                                      f'else echo 127.0.0.1; fi\n')
    step_file = tmp_path / "step"
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\n'
        f'setsid "$@" &\nstep=$!\necho $step > {step_file}\n'
        'tree() { for c in $(pgrep -P $1); do tree $c; done; echo $1; }\n'  # SLURM ends every process of the step
        'trap \'echo "srun: forcing job termination" >&2; kill -KILL $(tree $step)\' TERM INT\n'
        'while :; do code=0; wait $step || code=$?; kill -0 $step 2>/dev/null || break; done\nexit $code\n')
    (bin_dir / "scancel").write_text(
        '#!/bin/bash\nsig=${1#--signal=}\n'
        f'case "$2" in *.0) kill -"$sig" -- -"$(cat {step_file})";; *) echo "stand-in: steps only" >&2; exit 1;; esac\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "2",
            "SLURM_CPUS_PER_TASK": "2", "EUCLIP_RDZV_PORT": str(free_port())}


SCRIPT = REPO / "examples" / "slurm" / "euclip-train.sbatch"


def final_weights(run: Path) -> dict:
    return load_checkpoint(RunDir(run).latest_checkpoint())["model"]


def test_the_slurm_example_script_runs_on_one_node_and_a_time_limits_warning_requeues_it_to_resume_bitwise(
        world, tmp_path):
    """The batch script on one node (two ranks), to its end with no requeue. Then SLURM's B:USR1 warning, which
    reaches the batch script alone: it must stop the step through a checkpoint, then requeue the job
    (``--requeue`` does not, at a time limit); the requeued job resumes to that first run's very weights (under the
    real SLURM, tests/test_slurm.py's sbatch test stops it at a real time limit)."""
    env = slurm_stand_ins(tmp_path)

    def command(name):
        return ["bash", str(SCRIPT), "tiny-clip", "--runs-dir", str(tmp_path / "runs"), "--name", name,
                f"data.train_dir={world / 'train'}", *C.layered_overrides(ARGS, ["optim.samples=512"])]

    whole = subprocess.run(command("whole"), capture_output=True, text=True, env=env, cwd=REPO)
    assert whole.returncode == 0, whole.stderr[-2000:]
    check_run(tmp_path / "runs" / "whole", 16)
    assert not (tmp_path / "requeued").exists()

    env["EUCLIP_RDZV_PORT"] = str(free_port())
    job = subprocess.Popen(command("slurm"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                           cwd=REPO)
    run = tmp_path / "runs" / "slurm"
    wait_for_records(run / "metrics.jsonl", 2)
    job.send_signal(signal.SIGUSR1)
    output, _ = job.communicate(timeout=300)
    assert (tmp_path / "requeued").read_text().split() == ["requeue", "7"], output[-2000:]
    assert "requeueing job 7" in output and "stopped at step" in output, output[-2000:]  # checkpointed as it stopped
    stopped = load_checkpoint(RunDir(run).latest_checkpoint())["step"]
    assert 2 <= stopped < 16
    env["EUCLIP_RDZV_PORT"] = str(free_port())
    again = subprocess.run(command("slurm"), capture_output=True, text=True, env=env, cwd=REPO)  # the requeued job
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resumed from step_{stopped}.pt" in again.stdout
    check_run(run, 16)
    ours, theirs = final_weights(run), final_weights(tmp_path / "runs" / "whole")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_two_ranks_with_loader_workers_preempted_as_a_group_resume_exactly(world, tmp_path):
    """SIGTERM to the whole process group (torchrun, both ranks, their loader workers), as SLURM
    preempts: a checkpoint, exit 1, and the same command resumes to the very weights of a run
    that was never stopped."""
    def command(name):
        return [sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--nproc-per-node", "2",
                "--runs-dir", str(tmp_path), "--name", name, f"data.train_dir={world / 'train'}",
                *C.layered_overrides(ARGS, ["optim.samples=512", "data.workers=1"])]

    whole = subprocess.run(command("whole"), capture_output=True, text=True, cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]
    first = subprocess.Popen(command("stopped"), start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    wait_for_records(tmp_path / "stopped" / "metrics.jsonl", 2)
    os.killpg(first.pid, signal.SIGTERM)
    output, _ = first.communicate(timeout=300)
    assert first.returncode != 0 and "stopped at step" in output, output[-2000:]
    stopped = load_checkpoint(RunDir(tmp_path / "stopped").latest_checkpoint())["step"]
    assert 2 <= stopped < 16
    again = subprocess.run(command("stopped"), capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0 and f"resumed from step_{stopped}.pt" in again.stdout, again.stderr[-2000:]
    check_run(tmp_path / "stopped", 16)
    ends = [final_weights(tmp_path / name) for name in ("whole", "stopped")]
    assert ends[0].keys() == ends[1].keys()
    for key in ends[0]:
        assert torch.equal(ends[0][key], ends[1][key]), key


def test_ranks_whose_torchrun_agent_is_killed_outright_checkpoint_and_exit(world, tmp_path):
    """SIGKILL to torchrun's agent alone (the out-of-memory killer, a crashed launcher): its ranks, orphaned, trained
    on to their run's end unsupervised. They die with it (``workers.die_with_parent``), taking its SIGTERM as a
    preemption's: both ranks stop at one step, checkpoint it, and exit."""
    command = [sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--nproc-per-node", "2",
               "--runs-dir", str(tmp_path), f"data.train_dir={world / 'train'}",
               *C.layered_overrides(ARGS, ["optim.samples=64000"])]
    agent = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, cwd=tmp_path)
    wait_for_records(tmp_path / "tiny-clip" / "metrics.jsonl", 2)
    ranks = children(agent.pid)
    assert len(ranks) == 2, ranks
    os.kill(agent.pid, signal.SIGKILL)  # the wrapper exec'd torchrun: this is the agent
    try:
        # The ranks hold the agent's output pipe: it ends when the last of them has exited.
        output, _ = agent.communicate(timeout=120)
    finally:
        for pid in ranks:  # a failure here must not leave them training on
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # Once: Linux sends the death signal again at each reparenting, which had killed rank 1 in its teardown with
    # "error: terminated (SIGTERM)" in about one try in four (workers.stop_dying_with_parent).
    assert "stopped at step" in output and "Traceback" not in output and "terminated" not in output, output[-2000:]
    state = load_checkpoint(RunDir(tmp_path / "tiny-clip").latest_checkpoint())
    assert 2 <= state["step"] < 2000 and len(state["data"]) == 2, state["step"]
