"""What every command shares: consoles, the run-directory lookup and the error funnel.

User mistakes (bad recipe, unknown key, missing data or run) exit with code 2 and one
line per problem; runtime failures exit with 1. Neither prints a traceback.
"""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
err_console = Console(stderr=True)

RUNS_DIR = Path("results") / "runs"


def fail(message: str, code: int = 2) -> None:
    for line in message.splitlines():
        # escape: messages quote things like "[model]" that Rich would take for markup.
        err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def errors():
    """Turn euclip's known exceptions into one-line messages and exit codes."""
    from euclip_cli.config import ConfigError

    usage, runtime = [ConfigError, ValueError, FileNotFoundError], []
    with contextlib.suppress(ImportError):
        from euclip_cli.data import webshards
        from euclip_cli.data.loader import DataError
        from euclip_cli.data.world_files import WorldExistsError
        from euclip_cli.evaluate.evalsets import DownloadError
        from euclip_cli.evaluate.runner import EvalError, FetchError
        from euclip_cli.train.loop import RunConflict, RunError

        usage += [DataError, WorldExistsError, EvalError, RunConflict, webshards.OutputConflict]
        runtime += [RunError, FetchError, DownloadError, webshards.FetchError]
    try:
        yield
    except tuple(usage) as err:
        fail(str(err), 2)
    except tuple(runtime) as err:
        fail(str(err), 1)
    except KeyboardInterrupt:
        fail("interrupted", 1)
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        fail(f"disk full while writing {err.filename or 'output'}: free space and rerun the same command "
             f"(nothing already written was deleted)", 1)


def resolve_run(name_or_path: str, runs_dir: Path = RUNS_DIR) -> Path:
    """A run given as a path or as a name under results/runs/."""
    path = Path(name_or_path)
    for candidate in (path, runs_dir / name_or_path):
        if (candidate / "config.json").exists():
            return candidate
    raise FileNotFoundError(f"no run '{name_or_path}' (looked for {path}/config.json and {runs_dir / name_or_path}/config.json); "
                            f"'euclip train --recipe RECIPE' creates one")


def runs_of_recipe(recipe: str, runs_dir: Path = RUNS_DIR) -> list[Path]:
    import json

    found = []
    for config in sorted(runs_dir.glob("*/config.json")):
        if json.loads(config.read_text()).get("recipe") == recipe:
            found.append(config.parent)
    return found
