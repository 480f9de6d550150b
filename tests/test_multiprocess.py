"""Two CPU processes through the CLI (torchrun, gloo), directly and through the SLURM example script."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from euclip_cli.rundir import RunDir, load_checkpoint

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ARGS = ["data.batch_size=32", "optim.samples=128", "optim.warmup_steps=2", "train.precision=fp32",
        "train.log_every=1", "train.tensorboard=false", "data.shuffle_buffer=100"]


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


def test_slurm_example_script_runs_on_one_node(world, tmp_path):
    # Stand-ins for SLURM's commands: this machine is the job's only node.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "2",
           "EUCLIP_RDZV_PORT": str(free_port())}
    script = REPO / "examples" / "slurm" / "euclip-train.sbatch"
    result = subprocess.run(["bash", str(script), "tiny-clip", "--runs-dir", str(tmp_path / "runs"), "--name", "slurm",
                             f"data.train_dir={world / 'train'}", *ARGS], capture_output=True, text=True, env=env,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    check_run(tmp_path / "runs" / "slurm", 4)
