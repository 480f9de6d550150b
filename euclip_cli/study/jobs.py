"""A study's runs: what each (configuration, seed) runs, and running them here as child processes.

Each run is an ordinary run directory under ``results/studies/NAME/runs/CONFIG-seedK``, made by
the same commands a user types (``euclip train``, ``euclip eval``, ``euclip analyze distances``),
started as child processes so that ``--jobs`` can run several at once and an interrupted study
loses at most the runs in progress. A finished command is marked in the run, and a rerun skips it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from euclip_cli import config as C
from euclip_cli.errors import Failure
from euclip_cli.protocol.tasks import select
from euclip_cli.rundir import read_json, write_text_atomic
from euclip_cli.hierarchy import world_hierarchy_tasks
from euclip_cli.study.spec import Claim, Study
from euclip_cli import worlddir as W
from euclip_cli.worlddir import WorldDir
from euclip_cli.workers import threads_each, usable_cores

DONE = ".study-done"
# Where each run's commands write their output: STUDY/logs/RUN.log (``run_log``).
LOGS = "logs"


@dataclass(frozen=True)
class RunPlan:
    config: str
    seed: int
    run_dir: Path
    commands: tuple[tuple[str, ...], ...]
    # The configuration its training command gives (config.to_dict), as the run stores it.
    resolved: dict = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        return self.run_dir.name


def measured_configs(claims: list[Claim], study: Study) -> set[str]:
    """Configurations whose runs need ``analyze distances``, trained and untrained, for a claim: the
    measured configuration and its control."""
    return {name for c in claims if c.kind == "measure" and c.measure == "text_nearer_root"
            and all(n in study.configs for n in c.configs) for name in c.configs}


def plan(study: Study, out: Path, claims: list[Claim], world: Optional[Path] = None) -> list[RunPlan]:
    """The commands of every (configuration, seed), seed-major so that early stops leave whole seeds."""
    euclip = (sys.executable, "-m", "euclip_cli")
    runs_dir = out / "runs"
    distances = measured_configs(claims, study)
    # Where the study scores the world's shapes, every run's mistakes are also placed in the world's tree.
    hierarchy = bool(set(world_hierarchy_tasks()) & {t.key for t in select(study.tasks)})
    plans = []
    for seed in study.seeds:
        for name, cfg in study.configs.items():
            run = study.run_name(name, seed)
            run_dir = runs_dir / run
            where = ("--world", str(world)) if world else ()
            # A run of several GPUs trains through torchrun, one process per GPU (the job's node).
            ranks = ("--nproc-per-node", str(cfg.resources.gpus)) if cfg.resources.gpus > 1 else ()
            commands = [(*euclip, "train", "--recipe", cfg.recipe, "--name", run, "--runs-dir", str(runs_dir), *ranks,
                         *study.overrides(name, seed)),
                        (*euclip, "eval", str(run_dir), "--tasks", study.tasks, *where)]
            if hierarchy:
                commands.append((*euclip, "analyze", "hierarchy", str(run_dir), *where))
            if name in distances:
                # The claims read P(caption nearer [ROOT]) of origin-rooted models: the same under
                # either protocol; 1,000 training pairs suffice for the paper protocol's average. The
                # trained model and the untrained one it started from, in one process.
                commands.append((*euclip, "analyze", "distances", str(run_dir), "--protocol", "paper",
                                 "--root-samples", "1000", "--with-init", *where))
            resolved = C.to_dict(C.load_config(cfg.recipe, study.overrides(name, seed)))
            plans.append(RunPlan(name, seed, run_dir, tuple(commands), resolved))
    return plans


def step_key(command: Sequence[str], run_dir: Path) -> list[str]:
    """A run's command as its marker records it: the euclip arguments alone, the interpreter that ran them
    dropped and the run's folder and its parent written ``<run>`` and ``<runs>``. A study started again by
    another Python, from another directory or with ``--out`` spelled another way (relative, absolute, a
    moved folder) then finds the steps its runs finished instead of running them again."""
    args = list(command)
    if args[1:3] == ["-m", "euclip_cli"]:
        args = args[3:]
    key = []
    for i, arg in enumerate(args):
        path = Path(arg)
        if i and args[i - 1] == "--runs-dir":
            key.append("<runs>")
        elif "/" in arg and path.name == run_dir.name and path.parent.name == run_dir.parent.name:
            key.append("<run>")
        else:
            key.append(arg)
    return key


def done_commands(p: RunPlan) -> list[list[str]]:
    """The plan's commands that finished (as ``step_key``s), as the run's marker lists them; none when its
    training command is not among them (the configuration changed: everything runs again)."""
    marker = p.run_dir / DONE
    if not marker.exists():
        return []
    done = read_json(marker)
    if done and isinstance(done[0], str):  # a marker of euclip before 2026-11-24: the training command alone
        done = [done]
    done = [step_key(c, p.run_dir) for c in done]
    return done if step_key(p.commands[0], p.run_dir) in done else []


def is_done(p: RunPlan) -> bool:
    done = done_commands(p)
    return all(step_key(c, p.run_dir) in done for c in p.commands)


# A run's commands never outlive the process running them: each starts through this prologue, which
# asks Linux to send it SIGTERM (the trainer's stop: finish the step, checkpoint) when its parent
# dies, e.g. a Ray worker lost with its node, or a study killed by SIGKILL. It is set in the child
# before exec, not by preexec_fn, which may deadlock a parent with threads (Ray's workers have many).
_PARENT_DEATH = ("import ctypes, os, signal, sys\n"
                 "if sys.platform == 'linux': ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"
                 "if os.getppid() != int(sys.argv[1]): sys.exit(143)\n"
                 "os.execv(sys.argv[2], sys.argv[2:])")


# What stops a local study: its runs checkpoint, nothing more starts, and no tables are written.
STUDY_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Child:
    """The command a plan runs now, for a job or a study that must stop it."""

    process: Optional[subprocess.Popen] = None
    stopping: bool = False

    def stop(self) -> None:
        """Start nothing more; ask the running command, if any, to stop (the trainer finishes its step
        and checkpoints)."""
        self.stopping = True
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)


def execute(p: RunPlan, threads: int, log_dir: Path, child: Optional[Child] = None) -> Optional[str]:
    """Run a plan's commands that have not finished, in order (a study given a new analysis runs
    only that); None on success, else the failing command's last line. ``child`` is told which
    process runs, and stops the plan before its next command once ``stopping``."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log = run_log(log_dir, p)
    done = done_commands(p)
    child = child or Child()
    with log.open("a") as f:
        for command in p.commands:
            if step_key(command, p.run_dir) in done:
                continue
            if child.stopping:
                return "stopped before its next command (the job was asked to stop)"
            f.write("$ " + " ".join(command[2:]) + "\n")
            f.flush()
            with subprocess.Popen((sys.executable, "-c", _PARENT_DEATH, str(os.getpid()), *command), stdout=f,
                                  stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL) as process:
                child.process = process
                code = process.wait()
            child.process = None
            if code != 0:
                return f"'{' '.join(command[3:5])}' exited {code}: {last_line(log)} (log: {log})"
            done.append(step_key(command, p.run_dir))
            write_text_atomic(p.run_dir / DONE, json.dumps(done))
    return None


def run_log(log_dir: Path, p: RunPlan) -> Path:
    """The file a plan's commands write their output to."""
    return log_dir / f"{p.name}.log"


def last_line(log: Path) -> str:
    """A log's last non-blank line (its error, where a command failed), read from its last 64 KiB;
    '' for none."""
    if not log.exists():
        return ""
    with log.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - (1 << 16)))
        lines = [l for l in f.read().decode("utf-8", "replace").splitlines() if l.strip()]
    return lines[-1] if lines else ""


def prepare_worlds(study: Study, say: Callable[[str], None] = print) -> list[Path]:
    """Generate the embedded worlds the configurations train on and that do not exist yet (e.g. one
    per caption-noise level), one after the other, before any run starts; returns those written.

    The shared world folder, when it exists, must have the configurations' settings (WorldExistsError
    otherwise, before any run starts).
    """
    from euclip_cli.data.world_files import check_shared_world, generate

    written = []
    for name, spec in study.configs.items():
        cfg = C.load_config(spec.recipe, study.overrides(name, 0))
        folder = C.train_dir(cfg).parent
        if cfg.data.dataset != "world":
            continue
        found = WorldDir(folder).manifest()
        if found is not None:
            check_shared_world(cfg.data, folder, found, f"configuration {name} needs another world there: delete "
                                                        f"{folder} (the study regenerates it) or point data.train_dir elsewhere")
        if C.train_dir(cfg).exists() or folder in written:
            continue
        say(f"generating the embedded world of {name} in {folder} ({cfg.data.world_mismatch:.0%} mismatched captions)")
        generate(folder, W.from_config(cfg.data), workers=usable_cores())
        written.append(folder)
    return written


def run_here(study: Study, out: Path, plans: list[RunPlan], jobs: int, say: Callable[[str], None]) -> None:
    """Every unfinished run of ``plans`` as child processes of this one, ``jobs`` at a time; a Failure
    naming the runs that failed, or the signal that stopped the study."""
    todo = [p for p in plans if not is_done(p)]
    (out / LOGS).mkdir(parents=True, exist_ok=True)
    if todo:
        prepare_worlds(study, say)
    say(f"study {study.name}: {_count(len(study.configs), 'configuration')} x {_count(len(study.seeds), 'seed')} = "
        f"{_count(len(plans), 'run')}; {len(plans) - len(todo)} already finished")
    threads = threads_each(jobs)
    failures, durations, started = [], [], time.time()
    running: dict[Future, tuple[RunPlan, float, Child]] = {}
    stopped_by: list[str] = []

    def stop(signum, _frame):
        # Ctrl-C reaches the trainers too (one process group); a SIGINT or SIGTERM sent to the study
        # alone does not, so it is passed on. Either way the running runs checkpoint and nothing starts.
        stopped_by.append(signal.Signals(signum).name)
        for _plan, _began, child in list(running.values()):
            child.stop()

    # Handlers can only be installed from the main thread; elsewhere the caller owns signals.
    in_main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, stop) for s in STUDY_STOP_SIGNALS} if in_main else {}
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            queue = list(todo)
            while queue or running:
                while queue and len(running) < jobs and not stopped_by:
                    p, child = queue.pop(0), Child()
                    running[pool.submit(execute, p, threads, out / LOGS, child)] = (p, time.time(), child)
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    p, began, _child = running.pop(future)
                    error = future.result()
                    durations.append(time.time() - began)
                    done = len(durations)
                    left = (len(todo) - done) * (sum(durations) / done) / jobs
                    if stopped_by and error:
                        say(f"[{done}/{len(todo)}] {p.name} stopped (its checkpoint is kept)")
                    elif error:
                        failures.append(f"{p.name}: {error}")
                        say(f"[{done}/{len(todo)}] {p.name} FAILED: {error}")
                    else:
                        say(f"[{done}/{len(todo)}] {p.name} done in {_duration(durations[-1])}; "
                            f"about {_duration(left)} left")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if todo:
        say(f"study wall time: {_duration(time.time() - started)} for {len(todo)} runs with {jobs} job(s)")
    if stopped_by:
        left = sum(not is_done(p) for p in plans)
        raise Failure(f"study stopped by {stopped_by[0]}: {_count(left, 'run')} unfinished, their checkpoints kept, "
                      f"no tables written; run the same command to resume", failures)
    if failures:
        raise Failure(f"{len(failures)} run(s) failed; the others are kept, and rerunning continues:", failures)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(round(seconds)), 60)
    h, m = divmod(minutes, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
