"""A study through a local Ray cluster (euclip[distributed]): each run a Ray task, retried where its
worker is lost, and the retried task resumes the run from its last checkpoint."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading

import pytest
from typer.testing import CliRunner

from euclip_cli.cli import app
from tests.test_study_launch import last_step, study_file, wait_for

runner = CliRunner()


@pytest.mark.slow
def test_a_ray_study_retries_a_run_whose_worker_died_and_the_run_resumes(tmp_path, world):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed: pip install 'euclip[distributed]' (make install does)")
    import ray

    out = tmp_path / "out"

    def lose_the_worker():
        """A node lost mid-training, as far as the task knows: its worker process killed outright."""
        wait_for(lambda: last_step(out / "runs" / "clip-seed0") >= 3)
        first = next(l for l in (out / "logs" / "clip-seed0.log").read_text().splitlines() if l.startswith("# job"))
        os.kill(int(first.split("(pid ")[1].split(")")[0]), signal.SIGKILL)

    loss = threading.Thread(target=lose_the_worker)
    loss.start()
    result = runner.invoke(app, ["study", "--recipe", str(study_file(tmp_path, world)), "--out", str(out), "--world",
                                 str(world), "--launcher", "ray", "--poll", "0.5"])
    loss.join()
    assert result.exit_code == 0, result.output
    assert not ray.is_initialized()  # the local cluster the study started is stopped
    log = (out / "logs" / "clip-seed0.log").read_text()
    # The retried task resumed from the run's last checkpoint (Ray kills a dead worker's children:
    # what the trainer did since its last checkpoint interval is trained again).
    assert log.count("# job on") == 2 and "resumed from step_" in log
    assert last_step(out / "runs" / "clip-seed0") == 20 and (out / "study.md").exists()
