"""Shared fixtures: one small embedded world per test session."""

from pathlib import Path

import pytest

from euclip_cli.data.world_files import WorldSettings, generate

SMALL_WORLD = WorldSettings(seed=7, samples=1500, mismatch=0.1, eval_size=120)


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world") / "world"
    generate(out, SMALL_WORLD, workers=2)
    return out


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end runs (train, eval, report); skip with -m 'not slow'")
