"""Shared fixtures: one small embedded world per test session (per worker under pytest-xdist)."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from euclip_cli.data.world_files import generate
from euclip_cli.worlddir import WorldSettings

SMALL_WORLD = WorldSettings(seed=7, samples=1500, mismatch=0.1, eval_size=120)


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world") / "world"
    generate(out, SMALL_WORLD, workers=2)
    return out


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test` runs two workers on two cores: with torch's default of a thread per core each,
        # four spinning OpenMP threads would share two cores. Subprocesses inherit the variable.
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
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
