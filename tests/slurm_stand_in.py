"""A stand-in for the SLURM commands euclip and submitit call (sbatch, sacct, scancel, scontrol, srun, sinfo,
squeue), on one node; ``SLURM_STAND_IN_ACCOUNTING=0`` answers sacct as a SLURM without accounting does.

Installed under those names (``install(bin_dir, state_dir)``), it runs each submitted batch script at
once as a detached process, keeps each job's state in ``state_dir/ID.json`` as sacct reports it, signals
a job's steps as ``scancel --signal`` does (the srun tasks, not the batch shell), and reruns a script
that asked ``scontrol requeue``, as SLURM requeues a job. No queueing, accounting or resource limits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("SLURM_STAND_IN_STATE", "."))


def _job(job_id: str) -> Path:
    return STATE / f"{job_id}.json"


def _read(job_id: str) -> dict:
    return json.loads(_job(job_id).read_text())


def _write(job_id: str, **changes) -> None:
    state = _read(job_id) if _job(job_id).exists() else {}
    state.update(changes)
    tmp = _job(job_id).with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(_job(job_id))


def sbatch(args: list[str]) -> int:
    script = Path(args[-1])
    options = dict(re.findall(r"^#SBATCH --([\w-]+)=?(.*)$", script.read_text(), re.M))
    counter = STATE / "counter"
    job_id = str(int(counter.read_text()) + 1 if counter.exists() else 1000)
    counter.write_text(job_id)
    kept = STATE / f"{job_id}.sh"  # SLURM keeps the script as submitted: submitit moves its file after
    kept.write_text(script.read_text())
    _write(job_id, state="PENDING", script=str(kept), output=options.get("output", ""), options=options,
           restarts=0, requeue=False)
    with (STATE / "submitted").open("a") as f:
        f.write(f"{job_id} {options.get('job-name', '')}\n")
    subprocess.Popen([sys.executable, __file__, "_run", job_id], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     env=dict(os.environ))
    print(f"Submitted batch job {job_id}")
    return 0


def _run(job_id: str) -> int:
    """The node: run the batch script; again while it asked to be requeued."""
    while True:
        job = _read(job_id)
        env = dict(os.environ, SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_PROCID="0", SLURM_LOCALID="0",
                   SLURM_NODEID="0", SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="localhost",
                   SLURM_RESTART_COUNT=str(job["restarts"]))
        output = job["output"].replace("%j", job_id).replace("%t", "0") or os.devnull
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        with open(output, "a") as log:
            shell = subprocess.Popen(["bash", job["script"]], env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
            _write(job_id, state="RUNNING", pid=shell.pid)
            code = shell.wait()
        job = _read(job_id)
        if job["requeue"]:
            _write(job_id, state="REQUEUED", requeue=False, restarts=job["restarts"] + 1, step_pid=None)
            time.sleep(0.5)
            continue
        _write(job_id, state="CANCELLED" if job.get("cancelled") else "COMPLETED" if code == 0 else "FAILED")
        return 0


def srun(args: list[str]) -> int:
    """One task: the command with its --output/--error, in a session of its own (the job step),
    which ``scancel --signal`` signals."""
    files = {}
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag in ("--output", "--error"):
            files[flag] = args.pop(0).replace("%j", os.environ["SLURM_JOB_ID"]).replace("%t", "0")
    os.setsid()
    _write(os.environ["SLURM_JOB_ID"], step_pid=os.getpid())
    for flag, fd in (("--output", 1), ("--error", 2)):
        if flag in files:
            Path(files[flag]).parent.mkdir(parents=True, exist_ok=True)
            os.dup2(os.open(files[flag], os.O_WRONLY | os.O_CREAT | os.O_APPEND), fd)
    os.execvp(args[0], args)


def sacct(args: list[str]) -> int:
    if os.environ.get("SLURM_STAND_IN_ACCOUNTING") == "0":  # as SLURM without slurmdbd answers
        print("sacct: error: Slurm accounting storage is disabled", file=sys.stderr)
        return 1
    ids = [args[i + 1] for i, a in enumerate(args) if a == "-j"]
    print("JobID|State|NodeList")
    for job_id in ids:
        if _job(job_id).exists():
            print(f"{job_id}|{_read(job_id)['state']}|localhost")
    return 0


def squeue(args: list[str]) -> int:
    """The jobs the node still holds (pending, running, requeued), in the format asked for (%i, %T and
    %r, the reason a job pends: a job file's "reason", else None), only pending ones with --states=PD."""
    layout = next(a.split("=", 1)[1] for a in args if a.startswith("--format="))
    held = ("PENDING",) if "--states=PD" in args else ("PENDING", "RUNNING", "REQUEUED")
    for path in sorted(STATE.glob("*.json")):
        job = json.loads(path.read_text())
        if job["state"] in held:
            print(layout.replace("%i", path.stem).replace("%T", job["state"]).replace("%r", job.get("reason", "None")))
    return 0


def scancel(args: list[str]) -> int:
    job_id = args[0]
    sig = args[args.index("--signal") + 1] if "--signal" in args else None
    job = _read(job_id)
    if sig is None:
        _write(job_id, cancelled=True)
        os.killpg(job["pid"], signal.SIGTERM)
    elif job.get("step_pid"):
        os.killpg(job["step_pid"], getattr(signal, sig if sig.startswith("SIG") else "SIG" + sig))
    return 0


def sinfo(args: list[str]) -> int:
    """This machine as the one node of partition ``debug`` (the default), without GPUs or a time limit, in
    the format asked for (``--format=%P|%c|%m|%G|%l``, the fields the study reads)."""
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 ** 20
    fields = {"%P": "debug*", "%c": str(os.cpu_count()), "%m": str(memory_mb), "%G": "(null)", "%l": "infinite"}
    layout = next(a.split("=", 1)[1] for a in args if a.startswith("--format="))
    print(re.sub(r"%\w", lambda m: fields[m.group()], layout))
    return 0


def scontrol(args: list[str]) -> int:
    if args[:1] == ["requeue"]:
        _write(args[1], requeue=True)
    return 0


def install(bin_dir: Path, state_dir: Path) -> dict:
    """The commands in ``bin_dir``; returns the environment that finds them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in ("sbatch", "sacct", "scancel", "scontrol", "srun", "sinfo", "squeue"):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\nexec {sys.executable} {__file__} {name} \"$@\"\n")
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_STAND_IN_STATE": str(state_dir)}


if __name__ == "__main__":
    command, rest = sys.argv[1], sys.argv[2:]
    sys.exit({"sbatch": sbatch, "sacct": sacct, "scancel": scancel, "scontrol": scontrol, "srun": srun, "sinfo": sinfo, "squeue": squeue,
              "_run": lambda a: _run(a[0])}[command](rest))
