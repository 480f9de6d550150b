"""A run killed with SIGKILL at a random step and restarted with the same command ends bitwise equal
to an uninterrupted run of the same seed."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from euclip_cli.rundir import RunDir, load_checkpoint

pytestmark = pytest.mark.slow

STEPS = 12


def command(world, runs_dir, name, extra=()):
    return [sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--name", name,
            "--runs-dir", str(runs_dir), f"data.train_dir={world / 'train'}", "data.batch_size=16",
            f"optim.samples={16 * STEPS}", "optim.warmup_steps=2", "train.checkpoints=4", "train.log_every=1",
            "train.tensorboard=false", "train.precision=fp32", "data.shuffle_buffer=50", *extra]


def logged_steps(metrics):
    if not metrics.exists():
        return 0
    lines = [line for line in metrics.read_text().splitlines() if line.endswith("}")]
    return json.loads(lines[-1])["step"] if lines else 0


def final_state(runs_dir, name):
    return load_checkpoint(RunDir(runs_dir / name).latest_checkpoint())


# As decoded in the loader's workers; and decoded on the device from the JPEGs and crops a worker hands over,
# HyCoCLIP's batches, each sample with one of its boxes drawn at random (one run for both: the boxes' JPEGs
# travel the device-decode path beside the samples').
@pytest.mark.parametrize("extra", [(), ("data.decode=device", "data.workers=1", "loss.kind=hycoclip",
                                        "geometry.name=hyperbolic", "geometry.logit=d", "loss.entail_weight=0.2")],
                         ids=["workers", "device-decode-hycoclip-boxes"])
def test_sigkill_at_a_random_step_then_the_same_command_ends_bitwise_equal(world, tmp_path, extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command(world, tmp_path, "straight", extra), check=True, env=env, capture_output=True)

    kill_after = random.Random().randint(4, STEPS - 2)  # any step; checkpoints fall every 3 steps
    victim = subprocess.Popen(command(world, tmp_path, "killed", extra), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 300
    while logged_steps(metrics) < kill_after and victim.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = logged_steps(metrics)
    assert killed_at < STEPS, "the run finished before it could be killed"
    subprocess.run(command(world, tmp_path, "killed", extra), check=True, env=env, capture_output=True)

    straight, resumed = final_state(tmp_path, "straight"), final_state(tmp_path, "killed")
    assert resumed["step"] == straight["step"] == STEPS
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), f"killed after step {killed_at}: {name} differs"
    for key, value in straight["optimizer"]["state"].items():
        for slot, tensor in value.items():
            assert torch.equal(resumed["optimizer"]["state"][key][slot], tensor), (key, slot)
    # The steps logged after the last checkpoint and before the kill were logged again on resume:
    # the log keeps each once.
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1)), f"killed after step {killed_at}"


def test_a_resumed_run_drops_the_records_after_its_checkpoint(tmp_path):
    from euclip_cli.train.metrics import truncate_records

    run = RunDir(tmp_path)
    run.metrics_file.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 8))
                                + '{"step": 8, "lo')  # and a line cut short by the kill
    truncate_records(run, 5)
    assert [json.loads(line)["step"] for line in run.metrics_file.read_text().splitlines()] == [1, 2, 3, 4, 5]
