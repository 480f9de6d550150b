"""Things the suite builds once per pytest run and shares between its xdist workers: the embedded world the
tests train on, and trained runs that many tests only read or evaluate.

Each is built by the first worker to ask, under a file lock in the folder every worker of the run shares, and
found there by the others. A run is keyed by what made it: the recipe, the overrides and the world (the folder
lives as long as one pytest run, so the code that trained a run is the code under test).
Tests get a copy (``copy_run``) when they add to or damage a run; a test that proves training itself (resume,
accumulation, a loss's value) trains its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from filelock import FileLock

def shared_folder(tmp_path_factory) -> Path:
    """The folder every worker of this pytest run shares (under xdist each worker's basetemp is a child of it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(folder: Path, name: str, build) -> Path:
    """``folder/name``, built by ``build(path)`` by the first worker to ask; the others wait for it. A build that
    fails leaves nothing behind, so the next test to ask builds again (and fails on its own account)."""
    target, staging = folder / name, folder / f"{name}.building"
    with FileLock(str(folder / f"{name}.lock")):
        if not target.exists():
            try:
                build(staging)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            staging.rename(target)
    return target


def run_key(recipe: str, overrides: list[str], world: Path) -> str:
    what = json.dumps([recipe, overrides, str(world)])
    return f"run-{recipe}-{hashlib.sha256(what.encode()).hexdigest()[:10]}"


def trained_run(tmp_path_factory, world: Path, recipe: str, overrides: list[str]) -> Path:
    """A run of ``recipe`` on ``world`` with ``overrides``, trained through the CLI once per pytest run; read it,
    or ``copy_run`` it to change it."""
    from typer.testing import CliRunner

    from euclip_cli.cli.main import app

    def build(staging: Path) -> None:
        result = CliRunner().invoke(app, ["train", "--recipe", recipe, f"data.train_dir={world / 'train'}", *overrides,
                                          "--runs-dir", str(staging)])
        if result.exit_code != 0:
            raise AssertionError(f"the shared {recipe} run did not train:\n{result.output}")

    return built_once(shared_folder(tmp_path_factory), run_key(recipe, overrides, world), build) / recipe


def copy_run(run: Path, runs: Path, name: str | None = None) -> Path:
    """A private copy of a shared run in ``runs`` (to evaluate, resume or damage)."""
    runs.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(run, runs / (name or run.name)))
