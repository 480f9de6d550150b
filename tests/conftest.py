"""Shared fixtures: one small embedded world per test session (per worker under pytest-xdist)."""

import os
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

