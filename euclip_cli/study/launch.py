"""Where a study's runs execute, what they cost before anything is submitted, and the state of each.

``local`` (the default) runs each (configuration, seed) as child processes of ``euclip study``
(``jobs.run_here``). The cluster launchers make each run one job through an existing library:
``slurm`` through submitit's SLURM executor, ``submitit-local`` through its local executor (the
same job, on this machine), ``ray`` as a Ray task on the cluster ``RAY_ADDRESS`` names (a local
one without it). A job (``RunJob``) runs the run's ordinary commands: ``euclip train`` (through
torchrun on several GPUs), ``euclip eval`` and the analyses. When the scheduler warns of a time
limit or a preemption, the trainer finishes its step and checkpoints, the job is requeued, and the
trainer resumes; a Ray task whose worker is lost is retried the same way.

The jobs submitted are kept in ``STUDY/jobs.json``. A rerun submits only the runs that are neither
finished nor queued or running, and the study is summarised once every run is finished.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from euclip_cli import config as C
from euclip_cli.data.fetch import check_ray_address
from euclip_cli.errors import Failure, UsageError
from euclip_cli.rundir import RunDir, read_json, wait_until_free, write_text_atomic
from euclip_cli.study.jobs import LOGS, Child, RunPlan, done_commands, execute, is_done, last_line, prepare_worlds, run_log
from euclip_cli.study.spec import Resources, Study

LAUNCHERS = ("local", "submitit-local", "slurm", "ray")
JOBS_FILE = "jobs.json"
# submitit's pickles and its own logs, one folder per job id.
SUBMITIT_DIR = "submitit"
# How long a requeued job waits for its predecessor's trainer to release the run (its last
# checkpoint may still be written when the new job starts).
LOCK_WAIT_S = 600
# How long a submitted job may stay unknown to its scheduler before the study counts it as ended.
LOST_AFTER_S = 600
# A running job whose run writes nothing (its log, a training record) for this long is stalled: the
# trainer logs every few seconds to minutes, an evaluation task's features within minutes.
STALLED_AFTER_S = 3600
STALLED = "stalled:"
# How a job stands, whatever the launcher: what ``Launcher.state`` returns.
QUEUED, RUNNING, REQUEUED, ENDED, UNKNOWN = "queued", "running", "requeued", "ended", "unknown"
LIVE = (QUEUED, RUNNING, REQUEUED)
# SLURM's job states (sacct) as the study reads them; any other ends the job.
_SLURM_STATES = {"PENDING": QUEUED, "CONFIGURING": QUEUED, "RUNNING": RUNNING, "COMPLETING": RUNNING,
                 "SUSPENDED": RUNNING, "REQUEUED": REQUEUED, "REQUEUE_HOLD": REQUEUED, "REQUEUE_FED": REQUEUED,
                 "PREEMPTED": REQUEUED, "RESIZING": RUNNING, "UNKNOWN": UNKNOWN}


class RunJob:
    """One run's unfinished commands as one job: a plain callable (Ray) and checkpointable (submitit)."""

    def __init__(self, plan: RunPlan, log_dir: Path, threads: int):
        self.plan, self.log_dir, self.threads = plan, log_dir, threads
        self._child = Child()
        self._worker: Optional[threading.Thread] = None

    def __getstate__(self) -> dict:
        return {"plan": self.plan, "log_dir": self.log_dir, "threads": self.threads}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def log(self) -> Path:
        return run_log(self.log_dir, self.plan)

    def __call__(self) -> str:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as f:
            f.write(f"# job on {socket.gethostname()} (pid {os.getpid()}) at {_now()}\n")
        if self.plan.run_dir.exists() and not wait_until_free(self.plan.run_dir, LOCK_WAIT_S):
            raise Failure(f"{self.plan.name}: {self.plan.run_dir} was still held by another process after "
                          f"{LOCK_WAIT_S} s (a trainer of an earlier job?); the job is not run twice")
        outcome = {}
        self._worker = threading.Thread(
            target=lambda: outcome.update(error=execute(self.plan, self.threads, self.log_dir, self._child)),
            daemon=True)
        self._worker.start()
        # The main thread sleeps rather than joins: the scheduler's signal handler (submitit's, which
        # calls ``checkpoint``) runs in it, and must find no lock held by the wait it interrupted.
        while self._worker.is_alive():
            time.sleep(0.2)
        if outcome.get("error"):
            raise Failure(f"{self.plan.name}: {outcome['error']}")
        return self.plan.name

    def checkpoint(self):
        """submitit's warning of a time limit or a preemption: stop the running command (the trainer
        finishes its step and checkpoints), then requeue this job, which resumes the run."""
        import submitit

        self._child.stop()
        deadline = time.monotonic() + LOCK_WAIT_S
        while self._worker is not None and self._worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        return submitit.helpers.DelayedSubmission(RunJob(self.plan, self.log_dir, self.threads))


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


# ------------------------------------------------------------------ a SLURM partition's nodes

@dataclass(frozen=True)
class NodeKind:
    """One kind of node of a SLURM partition, as ``sinfo`` lists it (a line per distinct configuration)."""

    partition: str
    default: bool
    cpus: int
    mem_mb: int
    gpus: int
    limit_hours: float  # the partition's time limit; inf for none


# sinfo's fields, one line per partition and node configuration: partition (the default one marked
# "*"), CPUs a node, memory a node (MB), generic resources (gpu:[TYPE:]N, ...) and the time limit.
SINFO_FORMAT = "%P|%c|%m|%G|%l"


def slurm_hours(text: str) -> float:
    """A SLURM time limit (``days-hours:minutes:seconds``, ``hours:minutes:seconds``, ``minutes:seconds``,
    ``minutes``, ``infinite``/``UNLIMITED``) in hours."""
    if text.strip().lower() in ("infinite", "unlimited", "n/a", ""):
        return math.inf
    days, _, clock = text.strip().rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = parts + [0] * (3 - len(parts))
    else:  # minutes, minutes:seconds, hours:minutes:seconds
        hours, minutes, seconds = [0] * (3 - len(parts)) + parts if len(parts) > 1 else [0, parts[0], 0]
    return int(days or 0) * 24 + hours + minutes / 60 + seconds / 3600


def parse_sinfo(text: str) -> list[NodeKind]:
    """``sinfo --noheader --format=SINFO_FORMAT``'s lines as node kinds ("+" after a count: at least it)."""
    import re

    kinds = []
    for line in text.splitlines():
        fields_ = line.strip().split("|")
        if len(fields_) != 5:
            continue
        name, cpus, mem, gres, limit = fields_
        gpus = sum(int(n) for n in re.findall(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", gres))
        try:
            kinds.append(NodeKind(name.rstrip("*"), name.endswith("*"), int(cpus.rstrip("+")),
                                  int(mem.rstrip("+")), gpus, slurm_hours(limit)))
        except ValueError:  # a line of another form (a SLURM version's): no limit read from it
            continue
    return kinds


def partition_problem(res: Resources, kinds: list[NodeKind]) -> Optional[str]:
    """Why a job asking ``res`` can never run on its partition (``res.partition``, or the default one)
    of ``kinds``, or None. SLURM by default (EnforcePartLimits=NO) queues such a job for ever."""
    named = res.partition or next((k.partition for k in kinds if k.default), "")
    where = f"partition {named}" if res.partition else f"the default partition ({named})"
    nodes = [k for k in kinds if k.partition == named]
    if not nodes:
        known = ", ".join(sorted({k.partition for k in kinds})) or "none"
        return f"--resource partition={named}: no such partition (sinfo lists {known})"
    largest = {"cpus": max(k.cpus for k in nodes), "mem_gb": max(k.mem_mb for k in nodes) / 1024,
               "gpus": max(k.gpus for k in nodes), "hours": max(k.limit_hours for k in nodes)}
    asked = {"cpus": res.cpus, "mem_gb": res.mem_gb, "gpus": res.gpus, "hours": res.hours}
    over = [f"{key}={asked[key]:g} (its most: {largest[key]:g})" for key in asked if asked[key] > largest[key]]
    if over:
        return f"--resource {'; '.join(over)} is more than {where} has: lower it, or choose another partition"
    if not any(k.cpus >= res.cpus and k.mem_mb >= res.mem_gb * 1024 and k.gpus >= res.gpus for k in nodes):
        return (f"--resource cpus={res.cpus}, mem_gb={res.mem_gb:g}, gpus={res.gpus}: no node of {where} has them "
                f"together: lower one, or choose another partition")
    return None


def check_slurm(resources: list[Resources]) -> None:
    """Refuse, before anything is written, generated or submitted, a SLURM launch where SLURM is absent, or
    jobs whose resources no node of their partition has (``partition_problem``)."""
    missing = [c for c in ("sbatch", "srun", "sinfo") if shutil.which(c) is None]
    if missing:
        raise UsageError(f"--launcher slurm: {', '.join(missing)} not found on PATH (no SLURM here): run "
                         f"from a cluster's login node, or try the jobs here with --launcher submitit-local")
    try:
        listed = subprocess.run(["sinfo", "--noheader", f"--format={SINFO_FORMAT}"], capture_output=True,
                                text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise Failure("--launcher slurm: sinfo did not answer within 60 s: is slurmctld up?") from None
    if listed.returncode != 0:
        raise Failure(f"--launcher slurm: sinfo failed: {listed.stderr.strip() or listed.returncode}")
    kinds = parse_sinfo(listed.stdout)
    problems = {problem for res in resources if (problem := partition_problem(res, kinds))}
    if problems:
        raise UsageError(sorted(problems)[0] + " (nothing was submitted)")


def _sacct_worked(record: logging.LogRecord) -> bool:
    """submitit warns, at every look, that sacct failed and its states may be inaccurate: squeue_states
    reads the jobs SLURM holds instead, and the study's own lines say how each run stands."""
    return "Bypassing sacct error" not in record.getMessage()


def _squeue(job_ids: list[str], field: str, *options: str) -> dict[str, str]:
    """squeue's ``field`` (a format letter, e.g. %T) of each of ``job_ids`` that SLURM still holds; empty
    where squeue is absent or does not answer."""
    if not job_ids or shutil.which("squeue") is None:
        return {}
    try:
        listed = subprocess.run(["squeue", "--noheader", *options, f"--format=%i|{field}"],
                                capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return {}
    found = {}
    for line in listed.stdout.splitlines():
        job_id, _, value = line.strip().partition("|")
        if job_id in job_ids and value:
            found[job_id] = value
    return found


def squeue_states(job_ids: list[str]) -> dict[str, str]:
    """The state of each of ``job_ids`` that SLURM still holds, from ``squeue``, which needs no accounting
    database: where sacct knows nothing (accounting disabled, or not yet written), a pending or running
    job must not pass for one that ended."""
    import getpass

    return {j: _SLURM_STATES.get(state.split()[0], ENDED)
            for j, state in _squeue(job_ids, "%T", f"--user={getpass.getuser()}").items()}


# What SLURM's commonest pending reasons mean for a study's job (squeue's %r), said beside "queued".
PENDING_REASONS = {"Resources": "waiting for a node to free", "Priority": "other jobs first",
                   "BeginTime": "held after a requeue; SLURM releases it within minutes",
                   "PartitionConfig": "it asks more than the partition allows and will never start: cancel it "
                                      "(scancel) and lower --resource",
                   "PartitionTimeLimit": "its time limit is above the partition's and it will never start: "
                                         "cancel it (scancel) and lower --resource hours",
                   "ReqNodeNotAvail": "the nodes it needs are down or drained"}


def pending_reasons(job_ids: list[str]) -> dict[str, str]:
    """Why SLURM keeps each of ``job_ids`` pending (squeue's reason, with what it means where known)."""
    found = _squeue(job_ids, "%r", "--states=PD", f"--jobs={','.join(job_ids)}")
    return {j: f"{reason}: {PENDING_REASONS[reason]}" if reason in PENDING_REASONS else reason
            for j, reason in found.items() if reason != "None"}


# ------------------------------------------------------------------ launchers

class SubmititLauncher:
    """Jobs through submitit: its SLURM executor, or its local executor (``cluster="local"``)."""

    def __init__(self, out: Path, cluster: str):
        self.out, self.cluster = out, cluster
        self._jobs: dict[str, object] = {}  # job id -> submitit's Job, for the jobs this process submitted

    def submit(self, job: RunJob, res: Resources) -> str:
        import submitit

        folder = self.out / SUBMITIT_DIR / "%j"
        minutes = max(1, math.ceil(res.hours * 60))
        if self.cluster == "slurm":
            executor = submitit.SlurmExecutor(folder, max_num_timeout=res.retries)
            params = dict(job_name=job.plan.name, time=minutes, nodes=1, ntasks_per_node=1, cpus_per_task=res.cpus,
                          mem=f"{math.ceil(res.mem_gb * 1024)}MB", signal_delay_s=res.warning_s,
                          additional_parameters=dict(res.slurm))
            if res.gpus:
                params["gpus_per_node"] = res.gpus
            if res.partition:
                params["partition"] = res.partition
        else:
            executor = submitit.LocalExecutor(folder, max_num_timeout=res.retries)
            params = dict(timeout_min=minutes, gpus_per_node=res.gpus, signal_delay_s=res.warning_s)
        executor.update_parameters(**params)
        try:
            submitted = executor.submit(job)
        except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError, OSError) as err:
            said = str(err).strip().splitlines()
            raise Failure(f"{job.plan.name}: {self.cluster} refused the job: {said[-1] if said else type(err).__name__}"
                          ) from None
        self._jobs[submitted.job_id] = submitted
        return submitted.job_id

    def states(self, job_ids: list[str]) -> dict[str, str]:
        """Each job's state; for SLURM one sacct call for them all (submitit's watcher)."""
        import submitit

        if self.cluster == "slurm":
            logger = logging.getLogger("submitit")
            if _sacct_worked not in logger.filters:
                logger.addFilter(_sacct_worked)
            watcher = submitit.SlurmJob.watcher
            for job_id in job_ids:
                watcher.register_job(job_id)
            watcher.update()
            found = {j: watcher.get_info(j, mode="cache").get("State") for j in job_ids}
            # "CANCELLED by 1000": the state is the first word; a job sacct does not know (yet) is unknown.
            states = {j: _SLURM_STATES.get(s.split()[0], ENDED) if s else UNKNOWN for j, s in found.items()}
            return states | squeue_states([j for j, state in states.items() if state == UNKNOWN])
        out = {}
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is not None:
                out[job_id] = RUNNING if job.state == "RUNNING" else ENDED
            else:  # submitted by an earlier euclip study: known only by the result it left
                out[job_id] = ENDED if any((self.out / SUBMITIT_DIR / job_id).glob("*_result.pkl")) else UNKNOWN
        return out

    def close(self) -> None:
        pass


def _ray_run(job: RunJob) -> str:
    return job()


class RayLauncher:
    """Each run one Ray task on the cluster ``RAY_ADDRESS`` names, or on a local one started here.

    A task lives as long as the ``euclip study`` that submitted it (a Ray driver); to outlive a
    terminal, submit the study itself as a Ray job (``ray job submit -- euclip study ...``).
    """

    def __init__(self, out: Path):
        try:
            import ray
        except ImportError:
            raise UsageError("--launcher ray: ray is not installed: pip install 'euclip[distributed]'") from None

        self.out = out
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            check_ray_address()
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False, include_dashboard=False)
        self._refs: dict[str, object] = {}

    def submit(self, job: RunJob, res: Resources) -> str:
        remote = self._ray.remote(_ray_run).options(
            num_cpus=res.cpus, num_gpus=res.gpus, memory=int(res.mem_gb * 2 ** 30), max_retries=res.retries,
            retry_exceptions=False, name=job.plan.name)
        ref = remote.remote(job)
        job_id = ref.task_id().hex()[:16]  # the task's own part of Ray's id: unique within the driver
        self._refs[job_id] = ref
        return job_id

    def states(self, job_ids: list[str]) -> dict[str, str]:
        out = {}
        for job_id in job_ids:
            ref = self._refs.get(job_id)
            if ref is None:  # a task of an earlier driver: gone with it
                out[job_id] = UNKNOWN
            else:
                out[job_id] = ENDED if self._ray.wait([ref], timeout=0)[0] else RUNNING
        return out

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()


def launcher_for(name: str, out: Path):
    if name == "ray":
        return RayLauncher(out)
    return SubmititLauncher(out, "slurm" if name == "slurm" else "local")


# ------------------------------------------------------------------ jobs.json and each run's state

def read_jobs(out: Path) -> dict[str, dict]:
    """The jobs submitted for the study: ``{run: {launcher, job_id, log, submitted}}``."""
    path = out / JOBS_FILE
    return read_json(path) if path.exists() else {}


def record_job(out: Path, run: str, launcher: str, job_id: str, log: Path) -> dict:
    """Add a submitted job to ``jobs.json``; returns its entry."""
    jobs = read_jobs(out)
    jobs[run] = {"launcher": launcher, "job_id": job_id, "log": str(log), "submitted": _now()}
    write_text_atomic(out / JOBS_FILE, json.dumps(jobs, indent=2) + "\n")
    return jobs[run]


@dataclass(frozen=True)
class RunState:
    run: str
    state: str  # finished | failed: | running | queued | preempted, requeued | unknown | unfinished | not started
    detail: str  # the step reached, or a failure's last log line
    job_id: str
    log: str

    def line(self) -> str:
        job = f"job {self.job_id}" if self.job_id else "no job"
        what = f"{self.state} {self.detail}".strip()
        return f"{self.run}: {what} ({job}; log {self.log})"


def silent_for(p: RunPlan, log: Path) -> float:
    """Seconds since the run last wrote anything it writes as it goes: its log (every command's output)
    or a training record; 0 before it has written either."""
    times = [f.stat().st_mtime for f in (log, RunDir(p.run_dir).metrics_file) if f.exists()]
    return time.time() - max(times) if times else 0.0


def run_state(p: RunPlan, job: Optional[dict], job_state: str, log: Path, reason: str = "",
              stalled_after_s: Optional[float] = None) -> RunState:
    """One run's state from its folder (finished, the step its trainer reached) and its job's (with why
    the scheduler keeps it pending, ``reason``, where it says); a running job whose run has written
    nothing for ``stalled_after_s`` is ``stalled``."""
    job_id = job["job_id"] if job else ""
    if is_done(p):
        return RunState(p.name, "finished", "", job_id, str(log))
    if job is None:
        started = p.run_dir.exists()
        return RunState(p.name, "unfinished" if started else "not started",
                        f"({len(done_commands(p))} of {len(p.commands)} commands done)" if started else "", "",
                        str(log))
    if job_state == ENDED:
        return RunState(p.name, "failed:", last_line(log) or "no output (see the scheduler's log)", job_id, str(log))
    progress = _progress(p)
    if job_state == RUNNING:
        silent = silent_for(p, log)
        if stalled_after_s is not None and silent > stalled_after_s:
            return RunState(p.name, STALLED, f"{progress}; nothing written for {silent / 60:.0f} min".lstrip("; "),
                            job_id, str(log))
        return RunState(p.name, "running", progress, job_id, str(log))
    if job_state == REQUEUED:
        return RunState(p.name, "preempted, requeued", progress, job_id, str(log))
    waiting = f" (SLURM: {reason})" if job_state == QUEUED and reason else ""
    if job_state == QUEUED and progress.startswith("at step"):
        # A queued job whose run has trained before: requeued (SLURM holds one a while as PENDING) or
        # submitted again after a failure; either way it resumes from its checkpoint.
        return RunState(p.name, QUEUED, f"to resume {progress}{waiting}", job_id, str(log))
    return RunState(p.name, job_state, f"{progress}{waiting}".strip(), job_id, str(log))


def run_states(out: Path, plans: list[RunPlan], jobs: dict[str, dict], by_id: dict[str, str],
               stalled_after_s: Optional[float] = STALLED_AFTER_S) -> list[RunState]:
    """Every run's state, from ``jobs`` (``jobs.json``'s entries) and their jobs' states by id; a SLURM job
    that is queued says why, a running one silent for ``stalled_after_s`` is stalled."""
    queued = [job["job_id"] for job in jobs.values() if job["launcher"] == "slurm" and by_id.get(job["job_id"]) == QUEUED]
    reasons = pending_reasons(queued)
    return [run_state(p, jobs.get(p.name), by_id.get(jobs[p.name]["job_id"], UNKNOWN) if p.name in jobs else UNKNOWN,
                      run_log(out / LOGS, p), reasons.get(jobs[p.name]["job_id"], "") if p.name in jobs else "",
                      stalled_after_s)
            for p in plans]


def _progress(p: RunPlan) -> str:
    last = RunDir(p.run_dir).last_training_record() if p.run_dir.exists() else None
    if last is None:
        return ""
    total = C.total_steps(C.from_dict(p.resolved))
    return f"at step {last['step']}/{total}" if last["step"] < total else "after training"


# ------------------------------------------------------------------ submitting and following

def run_on_cluster(study: Study, out: Path, plans: list[RunPlan], launcher_name: str, wait: bool, poll_s: float,
                   say: Callable[[str], None], stalled_after_s: float = STALLED_AFTER_S) -> bool:
    """Submit every run neither finished nor live, through the launcher; follow them while ``wait``,
    requeueing a SLURM job whose run has written nothing for ``stalled_after_s`` (a hung node, a
    deadlocked loader: as LAION's autoexperiment restarts frozen jobs). True when every run is
    finished; raises Failure listing the runs that failed."""
    launcher = launcher_for(launcher_name, out)
    try:
        jobs = {run: job for run, job in read_jobs(out).items() if job["launcher"] == launcher_name}
        by_id = launcher.states([job["job_id"] for job in jobs.values()])
        todo = [p for p in plans if not is_done(p)]
        submit = [p for p in todo if p.name not in jobs or by_id[jobs[p.name]["job_id"]] not in LIVE]
        if submit:
            prepare_worlds(study, say)
        (out / LOGS).mkdir(parents=True, exist_ok=True)
        for p in submit:
            res = study.configs[p.config].resources
            job = RunJob(p, out / LOGS, threads=max(1, res.cpus // res.devices))
            jobs[p.name] = record_job(out, p.name, launcher_name, launcher.submit(job, res), job.log)
        say(f"study {study.name} through {launcher_name}: {len(plans)} runs; {len(plans) - len(todo)} finished, "
            f"{len(todo) - len(submit)} queued or running from before, {len(submit)} submitted now")
        shown: dict[str, str] = {}
        unknown_since: dict[str, float] = {}
        requeued: set[str] = set()
        while True:
            by_id = launcher.states([job["job_id"] for job in jobs.values()])
            for job_id, state in by_id.items():
                # A job the scheduler never reports (sacct lags behind sbatch, but not for minutes) ends,
                # so that following the study cannot wait for ever; a rerun resubmits its run.
                if state != UNKNOWN:
                    unknown_since.pop(job_id, None)
                elif time.monotonic() - unknown_since.setdefault(job_id, time.monotonic()) > LOST_AFTER_S:
                    by_id[job_id] = ENDED
            lines = run_states(out, plans, jobs, by_id, stalled_after_s)
            for state in lines:
                if shown.get(state.run) != state.line():
                    say(state.line())
                    shown[state.run] = state.line()
                if state.state == STALLED and launcher_name == "slurm" and state.job_id not in requeued:
                    # Requeued once per stall: its restart writes to the log, which ends the stall.
                    requeued.add(state.job_id)
                    said = subprocess.run(["scontrol", "requeue", state.job_id], capture_output=True, text=True)
                    say(f"{state.run}: requeued job {state.job_id} (it resumes from its last checkpoint)"
                        if said.returncode == 0 else
                        f"{state.run}: could not requeue job {state.job_id}: {said.stderr.strip()[:200]}")
                elif state.state != STALLED:
                    requeued.discard(state.job_id)
            live = [s for s in lines if s.state not in ("finished", "failed:", "unfinished", "not started")]
            if not wait or not live:
                break
            time.sleep(poll_s)
        failed = [s.line() for s in lines if s.state == "failed:"]
        if failed and not live:
            raise Failure(f"{len(failed)} run(s) failed; the others are kept, and rerunning resubmits the failed "
                          f"ones:", failed)
        return all(s.state == "finished" for s in lines)
    finally:
        launcher.close()


def status(out: Path, plans: list[RunPlan]) -> list[str]:
    """One line per run from the study folder and the launchers' own records (sacct for SLURM);
    submits nothing. A Ray task is known only to the driver that submitted it."""
    jobs = read_jobs(out)
    by_id: dict[str, str] = {}
    for name in ("slurm", "submitit-local"):
        ids = [job["job_id"] for job in jobs.values() if job["launcher"] == name]
        if ids:
            by_id.update(launcher_for(name, out).states(ids))
    return [state.line() for state in run_states(out, plans, jobs, by_id)]


# ------------------------------------------------------------------ the cost, before anything is submitted

@dataclass(frozen=True)
class Cost:
    run: str
    arch: str
    samples: int
    gpus: int
    samples_per_s: float  # per device: a GPU, or the run's CPU node where it asks for none
    source: str
    limit_hours: float  # the job's time limit
    retries: int

    @property
    def jobs(self) -> int:
        """Jobs the run takes: a job per time limit, the later ones requeued."""
        return max(1, math.ceil(self.hours / self.limit_hours))

    @property
    def hours(self) -> float:
        """Training wall time, with throughput scaling linearly over the run's GPUs."""
        return self.samples / (self.samples_per_s * max(1, self.gpus)) / 3600

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus


def throughputs(given: list[str]) -> dict[str, tuple[float, str]]:
    """Training samples per second per device, by arch: OpenCLIP's published figures, replaced by
    each ``--throughput`` (``ARCH=SAMPLES_PER_S``, stated; or a ``euclip bench train`` result file)."""
    from euclip_cli.published import openclip_throughput

    known = dict(openclip_throughput())
    for item in given:
        arch, sep, number = item.partition("=")
        if sep and not Path(item).exists():
            try:
                value = float(number)
            except ValueError:
                value = float("nan")
            if not arch or not value > 0 or math.isinf(value):
                raise UsageError(f"--throughput '{item}': give ARCH=SAMPLES_PER_S with a positive number, or a "
                                 f"'euclip bench train' result file")
            known[arch] = (value, "stated on the command line")
            continue
        path = Path(item)
        try:
            result = read_json(path)
            settings, measured = result["settings"], result["measurements"]
            known[settings["arch"]] = (float(measured["euclip"]["samples_per_s"]),
                                       f"euclip bench train on {settings['device']} ({path})")
            if "tiny_recipe" in measured:
                tiny = C.load_config(C.STUDY_RUN_RECIPE).model.arch
                known[tiny] = (float(measured["tiny_recipe"]["samples_per_s"]),
                               f"euclip bench train, {C.STUDY_RUN_RECIPE} as shipped, on {settings['device']} ({path})")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UsageError(f"--throughput '{item}': not an 'euclip bench train' result file ({type(err).__name__}: "
                             f"{err}); give one, or ARCH=SAMPLES_PER_S") from None
    return known


def costs(study: Study, plans: list[RunPlan], known: dict[str, tuple[float, str]]) -> list[Cost]:
    """Each run's samples and time at the throughput of its arch; UsageError naming the archs
    without one."""
    rows, missing = [], set()
    for p in plans:
        cfg = C.from_dict(p.resolved)
        arch = cfg.model.arch
        if arch not in known:
            missing.add(arch)
            continue
        rate, source = known[arch]
        res = study.configs[p.config].resources
        rows.append(Cost(p.name, arch, C.total_steps(cfg) * cfg.data.batch_size, res.gpus, rate, source, res.hours,
                         res.retries))
    if missing:
        raise UsageError(f"no training throughput for {', '.join(sorted(missing))}: pass --throughput ARCH="
                         f"SAMPLES_PER_S (per GPU) or an 'euclip bench train' result file of that arch")
    return rows


def hours_text(hours: float) -> str:
    """Hours as a total is read: one decimal from an hour up, two significant digits below (a plan of
    minutes is not "0.0 hours")."""
    return f"{hours:,.1f}" if hours >= 1 else f"{hours:.2g}"


def cost_lines(rows: list[Cost]) -> list[str]:
    """The plan as a user reads it: one line per run, the sources, and the totals."""
    lines = [f"{'run':<28} {'arch':<14} {'samples':>13} {'GPUs':>4} {'samples/s/device':>16} {'hours':>8} "
             f"{'GPU hours':>10} {'jobs':>4}"]
    for r in rows:
        lines.append(f"{r.run:<28} {r.arch:<14} {r.samples:>13,} {r.gpus:>4} {r.samples_per_s:>16,.1f} "
                     f"{r.hours:>8.2f} {r.gpu_hours:>10.1f} {r.jobs:>4}")
    total_gpu, total_hours = sum(r.gpu_hours for r in rows), sum(r.hours for r in rows)
    lines.append(f"total: {len(rows)} runs, {sum(r.samples for r in rows):,} samples, {hours_text(total_hours)} "
                 f"job hours, {hours_text(total_gpu)} GPU hours (training only; evaluation and queueing not counted)")
    lines += [f"throughput of {arch}: {source}" for arch, source in sorted({(r.arch, r.source) for r in rows})]
    short = sorted({r.run for r in rows if r.jobs > r.retries + 1})
    if short:
        lines.append(f"warning: {', '.join(short)} need more jobs than their time limit and retries allow "
                     f"(--resource hours=H or retries=N)")
    return lines


def check_budget(rows: list[Cost], max_gpu_hours: Optional[float]) -> None:
    total = sum(r.gpu_hours for r in rows)
    if max_gpu_hours is not None and total > max_gpu_hours:
        raise UsageError(f"the study needs {hours_text(total)} GPU hours by its plan, above --max-gpu-hours "
                         f"{max_gpu_hours:g}: nothing was submitted (fewer seeds or configurations, or a larger "
                         f"budget)")
