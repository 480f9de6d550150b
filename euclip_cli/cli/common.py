"""What every command shares: the consoles and the error funnel.

User mistakes (``euclip_cli.errors.UsageError``: bad recipe, unknown key, missing data or run)
exit with code 2 and one line per problem; failures (``Failure``) exit with 1. Neither prints
a traceback; anything else is a bug and does.
"""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from euclip_cli.errors import EuclipError

console = Console()
err_console = Console(stderr=True)

def fail(message: str, code: int = 2) -> None:
    for line in message.splitlines():
        # escape: messages quote things like "[model]" that Rich would take for markup.
        err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _file_in_the_way(path: Path) -> Path:
    """The first component of ``path`` that exists and is a file, or ``path`` itself."""
    for part in reversed([path, *path.parents]):
        if part.exists() and not part.is_dir():
            return part
    return path


def environment_fault(err: OSError) -> Optional[tuple[str, int]]:
    """``(message, exit code)`` for an OS error that the user or the machine caused (a file where a folder
    goes, no permission, a full disk), or None for one that is a bug of ours. The path in the message is
    the one the operating system named."""
    path = Path(err.filename) if err.filename else None
    if err.errno == errno.ENOSPC:
        return (f"disk full while writing {path or 'output'}: free space and rerun the same command "
                f"(nothing already written was deleted)", 1)
    if path is None:
        return None
    culprit = _file_in_the_way(path)
    if err.errno in (errno.ENOTDIR, errno.EEXIST) and culprit.is_file():
        within = f" (in the path {path})" if culprit != path else ""
        return f"{culprit} is a file where a folder is needed{within}: give a folder path, or move the file away", 2
    if err.errno == errno.EISDIR:
        return f"{path} is a folder where a file is needed: give a file path", 2
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"{path}: {err.strerror.lower()}; make it writable (or readable) for this user, or choose "
                f"another folder", 1)
    return None


@contextlib.contextmanager
def errors():
    """Turn euclip's deliberate errors into one-line messages and their exit codes.

    A ``UsageError`` exits 2, a ``Failure`` 1; an OS error the user or the machine caused (see
    ``environment_fault``) is worded like them; any other exception is a bug and keeps its traceback.
    """
    try:
        yield
    except KeyboardInterrupt:
        fail("interrupted", 1)
    except EuclipError as err:
        fail(str(err), err.exit_code)
    except OSError as err:
        fault = environment_fault(err)
        if fault is None:
            raise
        fail(*fault)
