"""What every command shares: consoles, the run-directory lookup and the error funnel.

User mistakes (bad recipe, unknown key, missing data or run) exit with code 2 and one
line per problem; runtime failures exit with 1. Neither prints a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import sys
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


# euclip's own exceptions: user mistakes (exit 2) and runtime failures (exit 1), by module.
USAGE_ERRORS = {"euclip_cli.config": ["ConfigError"], "euclip_cli.data.loader": ["DataError"],
                "euclip_cli.data.world_files": ["WorldExistsError"], "euclip_cli.evaluate.runner": ["EvalError"],
                "euclip_cli.train.loop": ["RunConflict"], "euclip_cli.data.webshards": ["OutputConflict"]}
RUNTIME_ERRORS = {"euclip_cli.train.loop": ["RunError"], "euclip_cli.evaluate.runner": ["FetchError"],
                  "euclip_cli.evaluate.evalsets": ["DownloadError"], "euclip_cli.data.webshards": ["FetchError"]}


def _loaded(table: dict[str, list[str]]) -> tuple[type, ...]:
    """The classes of ``table`` whose modules are imported: an exception from a module that was
    never imported cannot have been raised, and importing them all (torch, open_clip) would cost
    every command seconds."""
    return tuple(getattr(sys.modules[module], name) for module, names in table.items() if module in sys.modules
                 for name in names)


@contextlib.contextmanager
def errors():
    """Turn euclip's known exceptions into one-line messages and exit codes."""
    try:
        yield
    except KeyboardInterrupt:
        fail("interrupted", 1)
    except Exception as err:
        if isinstance(err, (ValueError, FileNotFoundError) + _loaded(USAGE_ERRORS)):
            fail(str(err), 2)
        if isinstance(err, _loaded(RUNTIME_ERRORS)):
            fail(str(err), 1)
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            fail(f"disk full while writing {err.filename or 'output'}: free space and rerun the same command "
                 f"(nothing already written was deleted)", 1)
        raise


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
