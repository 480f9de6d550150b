"""Shared fixtures: one small embedded world per test run, shared by the xdist workers (tests/trained.py)."""

import contextlib
import faulthandler
import functools
import hashlib
import json
import os
import resource
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import typer.testing

from euclip_cli.data.world_files import generate
from euclip_cli.worlddir import WorldSettings
from tests.trained import built_once, shared_folder, trained_run

SMALL_WORLD = WorldSettings(seed=7, samples=1500, mismatch=0.1, eval_size=120)
# A few steps of a small batch in fp32: fast, and deterministic on a CPU.
TINY = ["data.batch_size=32", "optim.samples=128", "optim.warmup_steps=2", "train.precision=fp32",
        "train.log_every=1", "train.tensorboard=false", "data.shuffle_buffer=200"]


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> Path:
    """The small world, generated once per pytest run (not per xdist worker); no test writes into it."""
    folder = built_once(shared_folder(tmp_path_factory), "world",
                        lambda staging: generate(staging / "world", SMALL_WORLD, workers=2))
    return folder / "world"


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory, world) -> Path:
    """tiny-clip trained with TINY on the small world, once per test run (four steps, not evaluated): read it, or
    ``copy_run`` it to evaluate or change it."""
    return trained_run(tmp_path_factory, world, "tiny-clip", TINY)


@contextlib.contextmanager
def watchdog(seconds: float):
    """For a command run in the test's own process that must not hang: past ``seconds`` the worker prints every
    thread's stack and exits, which fails the test (and pytest-xdist names it), where a subprocess's timeout
    would have. A fresh process costs seconds of imports; this costs nothing."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test` runs two workers on two cores: with torch's default of a thread per core each,
        # four spinning OpenMP threads would share two cores. Subprocesses inherit the variable.
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    # typer's CliRunner builds the click command from the Typer app anew at every invoke: about 30 ms for
    # euclip's, most of a refused invocation's time. No test changes an app once built, so each is built once.
    typer.testing._get_command = functools.cache(typer.testing._get_command)
    config.addinivalue_line("markers", "slow: end-to-end runs (train, eval, report); skip with -m 'not slow'")
    config.addinivalue_line("markers", "slurm: needs a real SLURM with accounting (examples/slurm/single-node.sh start)")



# Seconds each test file took in a whole `make test` on this project's 2-core machines (`make test-seconds`
# rewrites it). Only the files' order depends on it: a stale or missing entry costs wall time, never a result.
FILE_SECONDS = Path(__file__).with_name("file-seconds.json")
# A file not yet timed is guessed at this many seconds per end-to-end (slow) test, one per other test.
GUESS_SLOW_SECONDS, GUESS_OTHER_SECONDS = 30.0, 1.0


def pytest_addoption(parser):
    parser.addoption("--record-file-seconds", action="store_true",
                     help=f"write each test file's summed seconds to {FILE_SECONDS.name} (whole runs only)")
    parser.addoption("--record-cpu", metavar="FILE",
                     help="append a line for each test to FILE: its worker, start and end, and the CPU seconds its "
                          "worker and the child processes it waited for used; tools/suite_profile.py tables them")
    parser.addoption("--record-trainings", metavar="FILE",
                     help="append a line for each trained run a test leaves in its temporary folders (what was "
                          "trained, how many steps, by which test) to FILE; tools/suite_profile.py tables them")


def _record_trainings(config, folder: Path, test: str) -> None:
    target = config.getoption("--record-trainings")
    if not target or not folder.is_dir():
        return
    lines = []
    # os.walk does not follow links (tests make links to folders, and loops).
    for where, _, names in os.walk(folder):
        if "metrics.jsonl" not in names:
            continue
        run = Path(where)
        try:  # many tests damage a run's files on purpose: those runs are not counted
            records = (run / "metrics.jsonl").read_text().splitlines()
            stored = json.loads((run / "config.json").read_text())
            steps = json.loads(records[-1])["step"]
            # A copy of a run (tests/trained.py's copy_run) has its meta.json, and is no training of its own.
            meta = run / "meta.json"
            made = hashlib.sha256(meta.read_bytes()).hexdigest()[:16] if meta.is_file() else str(run)
        except (OSError, ValueError, LookupError, TypeError):
            continue
        lines.append(json.dumps({"test": test, "run": made, "config": stored, "steps": steps}))
    if lines:
        with open(target, "a") as out:  # one write per test: lines from two workers do not interleave
            out.write("\n".join(lines) + "\n")


@pytest.fixture(autouse=True)
def _trainings_of_each_test(request):
    """With --record-trainings: the runs a test trained in its tmp_path, read before pytest removes it."""
    # Asked for here, tmp_path is torn down after this fixture, so its runs are still there to read.
    folder = (request.getfixturevalue("tmp_path") if request.config.getoption("--record-trainings")
              and "tmp_path" in request.fixturenames else None)
    yield
    if folder is not None:
        _record_trainings(request.config, folder, request.node.nodeid)


@pytest.fixture(autouse=True, scope="session")
def _trainings_of_shared_fixtures(request, tmp_path_factory):
    """With --record-trainings: the runs module and session fixtures trained (in mktemp folders), at the end."""
    yield
    if request.config.getoption("--record-trainings"):
        base = tmp_path_factory.getbasetemp()
        for folder in [*base.iterdir(), *shared_folder(tmp_path_factory).glob("run-*")]:
            if folder.is_dir() and not folder.name.endswith("current"):
                _record_trainings(request.config, folder, f"(fixture) {folder.name}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With --record-cpu: the test's wall span and CPU seconds (setup, call and teardown), where it ran. CPU does not
    stretch when the other worker crowds the cores, as wall seconds do; it misses what runs outside the test's
    process tree (a real SLURM's jobs) and children not yet waited for."""
    target = item.config.getoption("--record-cpu")
    if not target:
        yield
        return
    before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    start = time.time()
    yield
    stop = time.time()
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    own, children = ((a.ru_utime + a.ru_stime) - (b.ru_utime + b.ru_stime) for a, b in zip(after, before))
    line = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "start": round(start, 3),
            "stop": round(stop, 3), "cpu_self": round(own, 3), "cpu_children": round(children, 3)}
    with open(target, "a") as out:  # one short write per test: lines from two workers do not interleave
        out.write(json.dumps(line) + "\n")


def pytest_collection_modifyitems(config, items):
    """Longest files first, each file's tests in their own order. `make test` hands whole files to its two
    workers in collection order (--dist loadfile), one as the other frees: a long file handed out last keeps
    one worker busy alone at the end; handed out first it overlaps the rest (longest-first list scheduling)."""
    recorded = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    guess = Counter()
    for item in items:
        guess[item.path] += GUESS_SLOW_SECONDS if item.get_closest_marker("slow") else GUESS_OTHER_SECONDS
    root = Path(config.rootpath)
    seconds = {path: recorded.get(path.relative_to(root).as_posix(), guess[path]) for path in guess}
    position = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-seconds[item.path], position[item.path]))


_file_seconds = Counter()


def pytest_runtest_logreport(report):
    # Setup, call and teardown alike: a module fixture's setup is part of what its file costs a worker.
    _file_seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session, exitstatus):
    # Under xdist only the controller writes: it sees every worker's reports.
    config = session.config
    if not config.getoption("--record-file-seconds") or hasattr(config, "workerinput"):
        return
    if exitstatus != 0 or config.getoption("-m") or config.getoption("-k"):
        # A failed or filtered run times part of a file: the committed figures stay.
        print(f"\n{FILE_SECONDS.name} left as it was: record from a passing run of whole files (no -m, no -k)")
        return
    root = Path(config.rootpath)
    recorded = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    recorded.update({name: round(s, 1) for name, s in _file_seconds.items()})
    kept = {name: s for name, s in sorted(recorded.items()) if (root / name).exists()}
    FILE_SECONDS.write_text(json.dumps(kept, indent=1) + "\n")
