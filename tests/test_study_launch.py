"""Studies as cluster jobs: the plan's arithmetic, the budget, resources, and a study through submitit's
SLURM executor (against the stand-in of tests/slurm_stand_in.py) and its local executor, with a time
limit's warning, a requeue and a resume, a job that fails, and a rerun that submits only what is left."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests import slurm_stand_in
from euclip_cli.cli.main import app
from euclip_cli.published import openclip_throughput
from euclip_cli.study import launch
from euclip_cli.study.jobs import plan
from euclip_cli.study.spec import Resources, load_claims, load_study

runner = CliRunner()
RUN = ["data.batch_size=32", "optim.warmup_steps=1", "train.precision=fp32", "train.tensorboard=false",
       "data.shuffle_buffer=100"]


def study_file(tmp_path: Path, world: Path, broken: bool = False, resources: str = "cpus = 1\nmem_gb = 1\n") -> Path:
    """Two configurations of one seed: ``clip`` trains 20 steps, logging and checkpointing each (to be interrupted),
    ``euclip`` 2; ``broken`` (optional) fails at once (its data folder holds no shards)."""
    empty = tmp_path / "no-shards"
    empty.mkdir(exist_ok=True)
    path = tmp_path / "study-jobs.toml"
    common = json.dumps([f"data.train_dir={world / 'train'}", "optim.samples=64", *RUN])
    text = (f'[study]\nseeds = 1\ntasks = "world/colour"\nbaseline = "clip"\noverrides = {common}\n'
            f'[study.resources]\n{resources}'
            f'[configs.clip]\nrecipe = "tiny-clip"\noverrides = ["optim.samples=640", "train.checkpoints=20", "train.log_every=1"]\n'
            f'[configs.euclip]\nrecipe = "tiny-euclip"\n')
    if broken:
        text += (f'[configs.broken]\nrecipe = "tiny-clip"\n'
                 f'overrides = ["data.dataset=datacomp-small", "data.train_dir={empty}"]\n')
    path.write_text(text)
    return path


def last_step(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def wait_for(condition, seconds: float = 240.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


# ------------------------------------------------------------------ the plan, the budget, the resources

def test_the_plan_is_samples_over_throughput_per_gpu_by_hand(tmp_path, world):
    path = study_file(tmp_path, world, resources="gpus = 4\nhours = 0.5\n")
    study = load_study(str(path), seeds=2)
    plans = plan(study, tmp_path / "out", load_claims())
    rows = launch.costs(study, plans, launch.throughputs(["tiny-vit-c16=0.01"]))
    # clip: 640 samples = 20 steps of 32; euclip: 64 = 2 steps; 0.01 samples/s per GPU on 4 GPUs.
    by_run = {r.run: r for r in rows}
    assert by_run["clip-seed1"].samples == 640 and by_run["euclip-seed0"].samples == 64
    assert by_run["clip-seed0"].hours == pytest.approx(640 / (0.01 * 4) / 3600)
    assert by_run["clip-seed0"].gpu_hours == pytest.approx(640 / 0.01 / 3600)
    assert by_run["clip-seed0"].jobs == math.ceil(640 / 0.04 / 3600 / 0.5) == 9
    lines = launch.cost_lines(rows)
    total = 2 * (640 + 64) / 0.01 / 3600
    assert f"{total:,.1f} GPU hours" in lines[-3] and "clip-seed0, clip-seed1 need more jobs" in lines[-1]


def test_a_budget_of_minutes_is_refused_with_the_minutes_it_needs():
    """A micro study's plan is minutes of GPU time: the refusal says how many, not "0.0 GPU hours"."""
    row = launch.Cost("clip-seed0", "tiny-vit-c16", samples=64, gpus=1, samples_per_s=2.0, source="given",
                      limit_hours=1.0, retries=0)  # 32 s: 0.0089 GPU hours
    with pytest.raises(launch.UsageError, match=r"needs 0\.0089 GPU hours by its plan, above --max-gpu-hours 0\.001"):
        launch.check_budget([row], 0.001)
    assert "0.0089 GPU hours" in launch.cost_lines([row])[-2]


def test_a_queued_job_of_a_run_that_trained_before_says_it_resumes(tmp_path):
    """After a requeue SLURM reports the job PENDING for a while: its line says the run resumes where it was."""
    from euclip_cli import config as C
    from euclip_cli.study.jobs import RunPlan

    resolved = C.to_dict(C.load_config("tiny-clip", ["optim.samples=640", "data.batch_size=32"]))  # 20 steps
    p = RunPlan("clip", 0, tmp_path / "clip-seed0", (("train",),), resolved)
    job = {"job_id": "42"}
    assert launch.run_state(p, job, launch.QUEUED, tmp_path / "log").line().startswith("clip-seed0: queued (job 42")
    p.run_dir.mkdir()
    (p.run_dir / "metrics.jsonl").write_text(json.dumps({"step": 3}) + "\n")
    assert launch.run_state(p, job, launch.QUEUED, tmp_path / "log").line().startswith(
        "clip-seed0: queued to resume at step 3/20 (job 42")


# sinfo --noheader --format="%P|%c|%m|%G|%l" on a cluster with two kinds of GPU node, a CPU partition
# without a time limit and a short debug partition (SLURM prints "+" after a count that varies).
SINFO = """gpu*|64|512000|gpu:a100:8(S:0-1)|2-00:00:00
gpu*|128|256000|gpu:2|2-00:00:00
cpu|128|1024000|(null)|infinite
debug|8|32000+|(null)|30:00
"""


def test_slurm_time_limits_in_every_form_are_read_in_hours():
    assert launch.slurm_hours("2-00:00:00") == 48 and launch.slurm_hours("1-12") == 36
    assert launch.slurm_hours("4:00:00") == 4 and launch.slurm_hours("30:00") == 0.5
    assert launch.slurm_hours("90") == 1.5 and launch.slurm_hours("infinite") == math.inf
    assert launch.slurm_hours("UNLIMITED") == math.inf


def test_a_job_no_node_of_its_partition_can_hold_is_named_with_the_partitions_most():
    kinds = launch.parse_sinfo(SINFO)
    assert [(k.partition, k.default, k.cpus, k.mem_mb, k.gpus) for k in kinds][:2] == [
        ("gpu", True, 64, 512000, 8), ("gpu", True, 128, 256000, 2)]
    fits = Resources(gpus=8, cpus=64, mem_gb=400, hours=24)
    assert launch.partition_problem(fits, kinds) is None
    assert launch.partition_problem(replace(fits, gpus=16), kinds) == (
        "--resource gpus=16 (its most: 8) is more than the default partition (gpu) has: lower it, or choose another "
        "partition")
    assert "hours=4 (its most: 0.5)" in launch.partition_problem(Resources(partition="debug", cpus=8, mem_gb=8), kinds)
    assert "mem_gb=100 (its most: 31.25)" in launch.partition_problem(Resources(partition="debug", mem_gb=100,
                                                                                hours=0.5), kinds)
    # Each alone is within some node, but no node has 8 GPUs and 100 CPUs.
    assert "no node of the default partition (gpu) has them together" in launch.partition_problem(
        replace(fits, cpus=100), kinds)
    assert launch.partition_problem(Resources(partition="cpu", cpus=128, hours=1000), kinds) is None
    assert "no such partition (sinfo lists cpu, debug, gpu)" in launch.partition_problem(Resources(partition="a100"),
                                                                                         kinds)


def test_a_slurm_study_asking_more_than_its_partition_has_is_refused_before_anything_is_written(tmp_path, world,
                                                                                                 monkeypatch):
    for key, value in slurm_stand_in.install(tmp_path / "bin", tmp_path / "slurm").items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "out"
    refused = runner.invoke(app, ["study", "--recipe", str(study_file(tmp_path, world)), "--out", str(out),
                                  "--launcher", "slurm", "--resource", "cpus=100000"])
    assert refused.exit_code == 2, refused.output
    assert f"--resource cpus=100000 (its most: {os.cpu_count()}) is more than the default partition (debug)" in \
        " ".join(refused.output.split())
    assert not (tmp_path / "slurm" / "submitted").exists() and not out.exists()


def test_the_published_throughput_is_openclips_gpu_hours_over_its_samples():
    rate, source = openclip_throughput()["ViT-B-32"]
    assert rate == pytest.approx(12.8e9 / (4600 * 3600)) and "4,600 A100-40GB hours" in source


def test_a_bench_result_gives_the_throughput_of_its_arch_and_of_the_studys_recipe(tmp_path):
    bench = tmp_path / "train-1.json"
    bench.write_text(json.dumps({"settings": {"arch": "ViT-B-32", "device": "cuda"},
                                 "measurements": {"euclip": {"samples_per_s": 1234.5},
                                                  "tiny_recipe": {"samples_per_s": 456.0}}}))
    known = launch.throughputs([str(bench)])
    assert known["ViT-B-32"][0] == 1234.5 and known["tiny-vit-c16"][0] == 456.0 and str(bench) in known["ViT-B-32"][1]
    assert known["ViT-B-16"] == openclip_throughput()["ViT-B-16"]  # what the bench did not measure stays published


def test_the_plan_prints_before_anything_and_the_budget_refuses_before_submitting(tmp_path, world, monkeypatch):
    env = slurm_stand_in.install(tmp_path / "bin", tmp_path / "slurm")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path, out = study_file(tmp_path, world, resources="gpus = 2\n"), tmp_path / "out"
    shown = runner.invoke(app, ["study", "--recipe", str(path), "--out", str(out), "--plan",
                                "--throughput", "tiny-vit-c16=0.02"])
    assert shown.exit_code == 0, shown.output
    total = (640 + 64) / 0.02 / 3600  # 9.8 GPU hours: on 2 GPUs, half the hours at twice the GPUs
    assert "clip-seed0" in shown.output and f"{total:,.1f} GPU hours" in shown.output and total > 5
    refused = runner.invoke(app, ["study", "--recipe", str(path), "--out", str(out), "--launcher", "slurm",
                                  "--throughput", "tiny-vit-c16=0.02", "--max-gpu-hours", "5"])
    assert refused.exit_code == 2 and "above --max-gpu-hours 5" in refused.output
    assert not (tmp_path / "slurm" / "submitted").exists() and not out.exists()
    unknown = runner.invoke(app, ["study", "--recipe", str(path), "--out", str(out), "--plan"])
    assert unknown.exit_code == 2 and "no training throughput for tiny-vit-c16" in unknown.output


@pytest.mark.parametrize("given, named", [(["gpus=-1"], "--resource gpus"), (["hours=0"], "--resource hours"),
                                          (["gpu=1"], "--resource gpu"), (["gpus"], "--resource 'gpus'"),
                                          (["cpus=2", "cpus=3"], "'cpus' is given more than once")])
def test_a_bad_resource_is_refused_by_name(tmp_path, world, given, named):
    path = study_file(tmp_path, world)
    result = runner.invoke(app, ["study", "--recipe", str(path), "--out", str(tmp_path / "out"), "--plan",
                                 *[a for g in given for a in ("--resource", g)]])
    assert result.exit_code == 2 and named in result.output and "Traceback" not in result.output, result.output


def test_resources_layer_recipe_then_configuration_then_command_line(tmp_path, world):
    path = study_file(tmp_path, world, resources="gpus = 8\nhours = 12\nslurm = {account = \"lab\"}\n")
    path.write_text(path.read_text().replace('[configs.euclip]\nrecipe = "tiny-euclip"\n',
                                             '[configs.euclip]\nrecipe = "tiny-euclip"\nresources = {gpus = 2}\n'))
    study = load_study(str(path), resources=["hours=3", "partition=gpu"])
    assert study.configs["clip"].resources == Resources(gpus=8, hours=3.0, partition="gpu", slurm={"account": "lab"})
    assert study.configs["euclip"].resources.gpus == 2 and study.configs["euclip"].resources.hours == 3.0
    commands = {p.name: p.commands[0] for p in plan(study, tmp_path / "out", load_claims())}
    # Several GPUs: the ordinary training command, through torchrun with a process per GPU.
    assert commands["clip-seed0"][commands["clip-seed0"].index("--nproc-per-node") + 1] == "8"
    one = load_study(str(path), resources=["gpus=1"])
    assert all("--nproc-per-node" not in p.commands[0] for p in plan(one, tmp_path / "out", load_claims()))


def test_an_unknown_launcher_is_a_usage_error(tmp_path, world):
    result = runner.invoke(app, ["study", "--recipe", str(study_file(tmp_path, world)), "--out", str(tmp_path / "o"),
                                 "--launcher", "pbs"])
    assert result.exit_code == 2 and "--launcher 'pbs'" in result.output and not (tmp_path / "o").exists()


# ------------------------------------------------------------------ whole studies through submitit

@pytest.mark.slow
def test_a_slurm_study_is_requeued_at_its_time_limit_resumes_and_a_rerun_submits_only_what_failed(
        tmp_path, world, monkeypatch):
    env = slurm_stand_in.install(tmp_path / "bin", tmp_path / "slurm")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "out"
    args = ["study", "--recipe", str(study_file(tmp_path, world, broken=True)), "--out", str(out), "--world",
            str(world), "--launcher", "slurm", "--poll", "0.5"]
    first = runner.invoke(app, [*args, "--no-wait"])
    assert first.exit_code == 0 and "3 submitted now" in first.output, first.output
    jobs = json.loads((out / "jobs.json").read_text())
    script = (tmp_path / "slurm" / f"{jobs['clip-seed0']['job_id']}.sh").read_text()
    assert "#SBATCH --signal=USR2@120" in script and "#SBATCH --cpus-per-task=1" in script

    # SLURM's warning of the time limit, to the job's steps, while clip trains.
    wait_for(lambda: last_step(out / "runs" / "clip-seed0") >= 3)
    subprocess.run(["scancel", jobs["clip-seed0"]["job_id"], "--signal", "USR2"], check=True)
    second = runner.invoke(app, args)
    assert second.exit_code == 1 and "1 run(s) failed" in second.output, second.output
    assert "broken-seed0: failed: error: no training shards" in second.output
    assert "clip-seed0: finished" in second.output and "euclip-seed0: finished" in second.output
    requeued = json.loads((tmp_path / "slurm" / f"{jobs['clip-seed0']['job_id']}.json").read_text())
    assert requeued["restarts"] == 1
    log = (out / "logs" / "clip-seed0.log").read_text()
    assert "error: stopped at step" in log and "resumed from step_" in log and last_step(out / "runs" / "clip-seed0") == 20

    before = (tmp_path / "slurm" / "submitted").read_text().splitlines()
    third = runner.invoke(app, args)
    submitted = (tmp_path / "slurm" / "submitted").read_text().splitlines()[len(before):]
    assert third.exit_code == 1 and [line.split()[1] for line in submitted] == ["broken-seed0"], third.output
    status = runner.invoke(app, [*args, "--status"])
    assert status.exit_code == 0 and f"clip-seed0: finished (job {jobs['clip-seed0']['job_id']}; log" in status.output
    # The folder alone: the study recorded its recipe, world and options when it was started.
    alone = runner.invoke(app, ["study", "--out", str(out), "--status"])
    assert alone.exit_code == 0 and alone.output.splitlines()[1:] == status.output.splitlines(), alone.output

    done = runner.invoke(app, [*args, "--configs", "clip,euclip"])
    assert done.exit_code == 0 and "0 submitted now" in done.output and (out / "study.md").exists(), done.output


@pytest.mark.slow
def test_a_slurm_study_without_accounting_follows_its_jobs_through_squeue(tmp_path, world, monkeypatch):
    """Where sacct answers "accounting storage is disabled", a job sacct never reports must not be taken for
    one that ended once LOST_AFTER_S has passed: squeue still lists it while it is queued or running."""
    for key, value in slurm_stand_in.install(tmp_path / "bin", tmp_path / "slurm").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_STAND_IN_ACCOUNTING", "0")
    monkeypatch.setattr(launch, "LOST_AFTER_S", 1.0)  # far shorter than clip's training
    # submitit's sacct cache is one per process, and the stand-in numbers jobs from 1000 in every test: an
    # earlier test's job 1000 must not answer for this one's (on a cluster, job ids are not reused).
    import submitit.slurm.slurm

    monkeypatch.setattr(submitit.SlurmJob, "watcher", submitit.slurm.slurm.SlurmInfoWatcher(delay_s=600))
    out = tmp_path / "out"
    result = runner.invoke(app, ["study", "--recipe", str(study_file(tmp_path, world)), "--out", str(out),
                                 "--world", str(world), "--launcher", "slurm", "--poll", "0.5"])
    assert result.exit_code == 0 and (out / "study.md").exists(), result.output
    assert "clip-seed0: finished" in result.output and "failed" not in result.output
    assert "Bypassing sacct error" not in result.output  # submitit's warning at every look: squeue answers


def quick_study(tmp_path: Path, world: Path, launcher: str) -> Path:
    """``study_file``'s study with two training steps a run (the launcher is what is tested), through
    ``launcher`` until it is summarised; returns the study folder."""
    out, path = tmp_path / "out", study_file(tmp_path, world)
    path.write_text(path.read_text().replace('"optim.samples=640", ', ''))
    result = runner.invoke(app, ["study", "--recipe", str(path), "--out", str(out), "--world", str(world),
                                 "--launcher", launcher, "--poll", "0.5"])
    assert result.exit_code == 0 and "2 submitted now" in result.output, result.output
    assert (out / "study.md").exists() and set(json.loads((out / "jobs.json").read_text())) == {"clip-seed0", "euclip-seed0"}
    return out


@pytest.mark.slow
def test_a_study_through_submitits_local_executor_is_summarised(tmp_path, world):
    quick_study(tmp_path, world, "submitit-local")


# A trainer's stand-in for RunJob's own mechanics: counts to 40, saves its count at each step, stops
# on SIGTERM (exit 1, as the trainer does once it has checkpointed) and resumes from the saved count.
COUNTER = """import pathlib, signal, sys, time
state = pathlib.Path(sys.argv[1])
n = int(state.read_text()) if state.exists() else 0
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("resumed from", n, flush=True)
while n < 40:
    time.sleep(0.05)
    n += 1
    state.write_text(str(n))
    if stop:
        print("stopped at", n, flush=True)
        sys.exit(1)
"""


def counter_job(tmp_path: Path) -> tuple[launch.RunJob, Path]:
    """A job whose one command is the counter; returns it and the file the counter saves to."""
    from euclip_cli.study.jobs import RunPlan

    (tmp_path / "counter.py").write_text(COUNTER)
    count = tmp_path / "count"
    command = (sys.executable, str(tmp_path / "counter.py"), str(count))
    return launch.RunJob(RunPlan("c", 0, tmp_path / "run", (command,)), tmp_path / "logs", threads=1), count


def interrupt_first_job(job: launch.RunJob, count: Path, how: signal.Signals, seconds: float) -> None:
    """Once the counter is past 5, ``how`` to the process of the job's first attempt (its log names it)."""
    wait_for(lambda: count.exists() and int(count.read_text() or 0) >= 5, seconds)
    first = next(l for l in job.log.read_text().splitlines() if l.startswith("# job"))
    os.kill(int(first.split("(pid ")[1].split(")")[0]), how)


def resumed_counts(job: launch.RunJob) -> list[int]:
    """Where each attempt of the counter started."""
    return [int(l.split()[-1]) for l in job.log.read_text().splitlines() if l.startswith("resumed from")]


def test_a_job_warned_of_its_time_limit_stops_its_command_and_is_requeued_where_it_resumes(tmp_path):
    """submitit's local executor, as SLURM would: the warning (SIGUSR2) reaches the job alone; the job
    stops its running command (SIGTERM), requeues itself, and the requeued job resumes."""
    import submitit

    job, count = counter_job(tmp_path)
    executor = submitit.LocalExecutor(tmp_path / "submitit" / "%j", max_num_timeout=3)
    executor.update_parameters(timeout_min=2, signal_delay_s=30)
    submitted = executor.submit(job)
    interrupt_first_job(job, count, signal.SIGUSR2, 60)
    assert submitted.result() == "run"  # the run folder's name
    log = job.log.read_text()
    assert log.count("# job on") == 2 and "stopped at" in log and int(count.read_text()) == 40
    resumed = resumed_counts(job)
    assert resumed[0] == 0 and resumed[1] >= 5  # the second job went on from where the first stopped


def test_the_committed_table4_plan_is_what_the_command_prints():
    """docs/study.md quotes the Table 4 study's plan from this file: it must be the command's output."""
    committed = (Path(__file__).parents[1] / "docs" / "results" / "table4" / "plan.txt").read_text().splitlines()
    assert committed[0].startswith("# euclip study --recipe study-table4 --plan")
    result = runner.invoke(app, ["study", "--recipe", "study-table4", "--plan"], terminal_width=200)
    assert result.exit_code == 0 and result.output.splitlines() == committed[1:], result.output
    assert "1,518.0 GPU hours" in committed[-2]  # the figure docs/study.md states


def test_a_slurm_launch_without_slurm_is_refused_before_anything_is_generated(tmp_path, world, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    result = runner.invoke(app, ["study", "--recipe", str(study_file(tmp_path, world)), "--out", str(tmp_path / "o"),
                                 "--launcher", "slurm"])
    assert result.exit_code == 2 and "sbatch, srun, sinfo not found on PATH" in result.output, result.output
    assert not (tmp_path / "o" / "jobs.json").exists() and not (tmp_path / "o" / "runs").exists()


def test_a_job_its_scheduler_never_reports_ends_rather_than_being_followed_for_ever(tmp_path, world, monkeypatch):
    class Silent:
        """A scheduler that takes jobs and never reports them (sacct without them)."""

        def submit(self, job, res):
            return f"job-{job.plan.name}"

        def states(self, job_ids):
            return {j: launch.UNKNOWN for j in job_ids}

        def close(self):
            pass

    monkeypatch.setattr(launch, "launcher_for", lambda name, out: Silent())
    monkeypatch.setattr(launch, "check_slurm", lambda resources: None)
    monkeypatch.setattr(launch, "LOST_AFTER_S", 0.3)
    result = runner.invoke(app, ["study", "--recipe", str(study_file(tmp_path, world)), "--out", str(tmp_path / "o"),
                                 "--launcher", "slurm", "--poll", "0.1"])
    assert result.exit_code == 1 and "2 run(s) failed" in result.output, result.output
    assert "clip-seed0: failed: no output (see the scheduler's log) (job job-clip-seed0" in result.output


def test_a_ray_address_nobody_answers_is_named_at_once(monkeypatch):
    """RAY_ADDRESS naming a cluster that is not there: Ray itself would wait for minutes."""
    import time

    from euclip_cli.data.fetch import check_ray_address
    from euclip_cli.errors import Failure, UsageError

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # the discard port: nothing listens
    started = time.monotonic()
    with pytest.raises(Failure, match=r"RAY_ADDRESS='127.0.0.1:9': nothing answers at 127.0.0.1:9"):
        check_ray_address()
    assert time.monotonic() - started < 10
    monkeypatch.setenv("RAY_ADDRESS", "head-node:port")
    with pytest.raises(UsageError, match="is not an address"):
        check_ray_address()
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    check_ray_address()  # Ray's own keyword: Ray resolves it


@pytest.mark.slow
@pytest.mark.parametrize("how,group", [(signal.SIGINT, True), (signal.SIGTERM, False)], ids=["ctrl-c", "kill"])
def test_a_stopped_local_study_starts_nothing_more_and_the_same_command_resumes_it(tmp_path, world, how, group):
    """Ctrl-C reaches the terminal's whole process group, the study and its trainer alike; a ``kill``
    reaches the study alone, which passes it on. Either way the trainer checkpoints, the study starts
    nothing more, writes no tables, and says how to resume; the same command then resumes the stopped
    run where it stopped and finishes the study (once: it is the same either way)."""
    out, path = tmp_path / "out", study_file(tmp_path, world)
    command = [sys.executable, "-m", "euclip_cli", "study", "--recipe", str(path), "--out", str(out),
               "--world", str(world)]
    study = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    clip = out / "runs" / "clip-seed0"
    wait_for(lambda: last_step(clip) >= 3 or study.poll() is not None)
    assert study.poll() is None, study.communicate()
    (os.killpg if group else os.kill)(study.pid, how)
    stdout, stderr = study.communicate(timeout=120)
    assert study.returncode == 1, stdout + stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert "stopped" in stderr and "run the same command" in stderr, stderr
    stopped_at = last_step(clip)
    assert 3 <= stopped_at < 20 and (clip / "checkpoints" / f"step_{stopped_at}.pt").exists()
    assert not (out / "runs" / "euclip-seed0").exists() and not (out / "study.md").exists()
    if not group:
        return
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (out / "study.md").exists() and last_step(clip) == 20
    assert f"resumed from step_{stopped_at}.pt" in (out / "logs" / "clip-seed0.log").read_text()


def test_a_pending_slurm_job_says_why_and_what_that_means(tmp_path, world, monkeypatch):
    env = slurm_stand_in.install(tmp_path / "bin", tmp_path / "slurm")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "slurm").mkdir(exist_ok=True)
    for job_id, state, reason in (("41", "PENDING", "PartitionConfig"), ("42", "PENDING", "Licenses"),
                                  ("43", "RUNNING", "None"), ("44", "PENDING", "None")):
        (tmp_path / "slurm" / f"{job_id}.json").write_text(json.dumps({"state": state, "reason": reason}))
    reasons = launch.pending_reasons(["41", "42", "43", "44"])
    assert reasons == {"41": "PartitionConfig: it asks more than the partition allows and will never start: cancel "
                             "it (scancel) and lower --resource", "42": "Licenses"}
    (p,) = [p for p in plan(load_study(str(study_file(tmp_path, world))), tmp_path / "out", load_claims(), world)
            if p.config == "euclip"]
    line = launch.run_state(p, {"job_id": "41"}, launch.QUEUED, tmp_path / "log", reasons["41"]).line()
    assert line.startswith("euclip-seed0: queued (SLURM: PartitionConfig: it asks more than the partition allows")
    assert "(SLURM" not in launch.run_state(p, {"job_id": "43"}, launch.RUNNING, tmp_path / "log", "x").line()


def test_a_running_job_whose_run_writes_nothing_is_called_stalled_and_requeued_once(tmp_path, world, monkeypatch):
    """A hung job (a frozen node, a deadlocked loader) writes nothing: after --stalled-after it is requeued
    through scontrol, once per stall, and the line says so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.calls"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    study = load_study(str(study_file(tmp_path, world)))
    out = tmp_path / "out"
    (p,) = [p for p in plan(study, out, load_claims(), world) if p.config == "euclip"]
    log = out / "logs" / f"{p.name}.log"
    log.parent.mkdir(parents=True)
    log.write_text("# job on node1\n")
    hour_ago = time.time() - 3600
    os.utime(log, (hour_ago, hour_ago))
    assert launch.silent_for(p, log) == pytest.approx(3600, abs=5)

    class Hung:
        """A scheduler whose one job runs until it is requeued, then ends (its run never finishes here)."""

        def submit(self, job, res):
            return "77"

        def states(self, job_ids):
            return {j: launch.ENDED if (tmp_path / "scontrol.calls").exists() else launch.RUNNING for j in job_ids}

        def close(self):
            pass

    monkeypatch.setattr(launch, "launcher_for", lambda name, folder: Hung())
    said = []
    with pytest.raises(launch.Failure, match="1 run"):
        launch.run_on_cluster(replace(study, configs={"euclip": study.configs["euclip"]}), out, [p], "slurm", True,
                              0.05, said.append, stalled_after_s=600)
    assert (tmp_path / "scontrol.calls").read_text().splitlines() == ["requeue 77"]
    assert f"{p.name}: stalled: nothing written for 60 min (job 77; log {log})" in said
    assert f"{p.name}: requeued job 77 (it resumes from its last checkpoint)" in said
    # Written a moment ago, the same job is running, not stalled.
    log.touch()
    line = launch.run_state(p, {"job_id": "77"}, launch.RUNNING, log, stalled_after_s=600).line()
    assert line.startswith(f"{p.name}: running")
