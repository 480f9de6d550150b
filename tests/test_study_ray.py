"""Studies through a Ray cluster (euclip[distributed]), here a local one shared by the module: a
study's runs as Ray tasks, and a task whose worker is lost retried where its run left off."""

from __future__ import annotations

import importlib.util
import signal

import pytest

from euclip_cli.study import launch
from euclip_cli.study.spec import Resources
from tests.test_study_launch import counter_job, interrupt_first_job, quick_study, resumed_counts, wait_for

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="ray is not installed: pip install 'euclip[distributed]' (make install does)")


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module; a study finds it started and leaves it running."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_a_study_through_ray_runs_each_run_as_a_task_and_is_summarised(cluster, tmp_path, world):
    quick_study(tmp_path, world, "ray")
    assert cluster.is_initialized()  # a cluster it did not start, it leaves


def test_a_task_whose_worker_dies_is_retried_and_resumes_where_its_run_left_off(cluster, tmp_path):
    """A node lost mid-run, as far as the task knows: its worker process killed outright. Ray retries
    the task; the retried job resumes from what the run saved (the counter stands in for a trainer
    and its checkpoints)."""
    job, count = counter_job(tmp_path)
    ray_launcher = launch.RayLauncher(tmp_path)
    job_id = ray_launcher.submit(job, Resources(cpus=1, mem_gb=0.5))
    interrupt_first_job(job, count, signal.SIGKILL, 120)
    wait_for(lambda: ray_launcher.states([job_id])[job_id] == launch.ENDED, 120)
    log, resumed = job.log.read_text(), resumed_counts(job)
    assert log.count("# job on") == 2 and resumed[0] == 0 and resumed[1] >= 5 and int(count.read_text()) == 40
