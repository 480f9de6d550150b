"""What every command shares: the consoles and the error funnel.

User mistakes (``euclip_cli.errors.UsageError``: bad recipe, unknown key, missing data or run)
exit with code 2 and one line per problem; failures (``Failure``) exit with 1. Neither prints
a traceback; anything else is a bug and does.
"""

from __future__ import annotations

import contextlib
import errno

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


@contextlib.contextmanager
def errors():
    """Turn euclip's deliberate errors into one-line messages and their exit codes.

    A ``UsageError`` exits 2, a ``Failure`` 1, a full disk 1; any other exception is a bug and
    keeps its traceback.
    """
    try:
        yield
    except KeyboardInterrupt:
        fail("interrupted", 1)
    except EuclipError as err:
        fail(str(err), err.exit_code)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            fail(f"disk full while writing {err.filename or 'output'}: free space and rerun the same command "
                 f"(nothing already written was deleted)", 1)
        raise
