"""Shared fixtures: one small embedded world per test session (per worker under pytest-xdist)."""

import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from euclip_cli.data.world_files import WorldSettings, generate

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



def pytest_collection_modifyitems(config, items):
    """Files with the most end-to-end (slow) tests first, each file's tests in their own order. `make test`
    hands whole files to its two workers in collection order (--dist loadfile), one as the other frees: a
    long file handed out last keeps one worker busy alone at the end; handed out first it overlaps the rest."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    position = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], position[item.path]))
