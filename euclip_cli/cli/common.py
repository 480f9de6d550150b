"""What every command shares: the consoles and the error funnel.

User mistakes (``euclip_cli.errors.UsageError``: bad recipe, unknown key, missing data or run)
exit with code 2 and one ``error:`` line per problem; failures (``Failure``) exit with 1 and one
line. Neither prints a traceback; anything else is a bug and does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import unicodedata
import warnings
from pathlib import Path
from typing import NoReturn, Optional, Sequence, Union

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

# typer 0.29 (pinned) vendors click and does not re-export its exception base classes.
from typer._click.exceptions import ClickException, NoArgsIsHelpError

from euclip_cli.cli import stops
from euclip_cli.errors import DamagedLines, EuclipError, UsageError, out_of_file_descriptors
from euclip_cli.rundir import RUNS_DIR
from euclip_cli.startup import hide_unused_from_open_clip

# Rich sizes its lines by COLUMNS where it is set, and at 0 or below prints nothing at all, errors
# included: a width it cannot print in is replaced by 80 (narrow, positive ones still print whole lines).
def _usable_width() -> Optional[int]:
    try:
        return None if int(os.environ.get("COLUMNS", "80")) > 0 else 80
    except ValueError:
        return None  # not a number: rich ignores it and asks the terminal


console = Console(width=_usable_width())
err_console = Console(stderr=True, width=_usable_width())

def one_line(text: str) -> str:
    """``text`` with its control characters and line separators written as escapes (``\\n``): a value a
    user typed, quoted in a message, cannot break that message over several lines."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text)


def fail(message: Union[str, list[str]], code: int = 2, details: Sequence[str] = ()) -> NoReturn:
    """Exit with ``code`` after one ``error:`` line per problem (a list: a configuration's problems,
    reported together), each on one line whatever values it quotes, then ``details``, indented (our own
    lines: a child process's output, the tasks that failed)."""
    for problem in [message] if isinstance(message, str) else message:
        # escape: messages quote things like "[model]" that Rich would take for markup.
        err_console.print(f"[bold red]error:[/] {escape(one_line(problem))}", highlight=False, soft_wrap=True)
    for detail in details:
        for line in detail.splitlines():
            err_console.print(f"  {escape(one_line(line))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


_PYTHONS_SHOW_WARNING = warnings.showwarning


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` for the CLI: euclip's own warnings (``errors.DamagedLines``) as one
    ``warning:`` line on stderr; a library's in Python's usual form."""
    if issubclass(category, DamagedLines):
        err_console.print(f"[yellow]warning:[/] {escape(one_line(str(message)))}", highlight=False, soft_wrap=True)
    else:
        _PYTHONS_SHOW_WARNING(message, category, filename, lineno, file, line)


def checked_path(ctx, param, value):
    """Typer callback of every option or argument that names a path to read: refused as the command line
    is parsed where no file system could hold it (``rundir.path_problem``), or where it is a FIFO, device or
    socket, which no reader may open (``readers.special_file``). A list is checked item by item."""
    from euclip_cli.readers import special_file
    from euclip_cli.rundir import path_problem

    for path in value if isinstance(value, (list, tuple)) else [value]:
        problem = None if path is None else path_problem(Path(path))
        special = None if path is None or problem else special_file(Path(path))
        if problem or special:
            raise typer.BadParameter(problem or f"{path} is {special}, not a file or folder: give one")
    return value


def writable_folder(ctx, param, value: Optional[Path]) -> Optional[Path]:
    """Typer callback of every option that names a folder a command writes (``--out``, ``--runs-dir``,
    ``--root``, ``--publish``): checked as the command line is parsed, before anything is read, fetched,
    generated or trained (``rundir.folder_problem`` says what may be one)."""
    from euclip_cli.rundir import folder_problem

    problem = None if value is None else folder_problem(value)
    if problem:
        raise typer.BadParameter(problem)
    return value


# Options several commands share, each declared once (Typer takes one declaration in many commands).
RUNS_DIR_OPTION = typer.Option(RUNS_DIR, callback=checked_path, help="Where run directories live.")
NEW_RUNS_DIR_OPTION = typer.Option(RUNS_DIR, callback=writable_folder, help="Where run directories live.")
WORLD_OPTION = typer.Option(None, callback=checked_path, help="Embedded world folder (default: the one trained on).")


# What the dynamic loader says when a shared library (torch's) cannot be mapped for want of memory.
LOADER_OUT_OF_MEMORY = ("failed to map segment from shared object", "cannot allocate memory")


def environment_fault(err: Exception) -> Optional[tuple[str, int]]:
    """``(message, exit code)`` for an error that the user or the machine caused (a file where a folder
    goes, no permission, a full disk, too few file descriptors, too little memory to load a library), or None
    for one that is a bug of ours.
    The path in the message is the one the operating system named."""
    if out_of_file_descriptors(err):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        room = max(4096, 4 * soft) if hard == resource.RLIM_INFINITY else hard
        remedy = f"raise it (ulimit -n {room})" if room > soft else f"ask for a hard limit above {hard}"
        return f"too many open files: this process may hold {soft} (ulimit -n); {remedy} and rerun the same command", 1
    if isinstance(err, ImportError) and any(sign in str(err) for sign in LOADER_OUT_OF_MEMORY):
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        held = "" if limit == resource.RLIM_INFINITY else f" (this process may map {limit / 2 ** 30:.1f} GiB: ulimit -v)"
        return (f"out of memory while loading a library ({one_line(str(err))}){held}: free memory or raise the "
                f"limit, and rerun the same command", 1)
    if not isinstance(err, OSError):
        return None
    path = Path(err.filename) if err.filename else None
    if err.errno == errno.ENOSPC:
        return (f"disk full while writing {path or 'output'}: free space and rerun the same command "
                f"(nothing already written was deleted)", 1)
    if path is None:
        return None
    if err.errno == errno.ENAMETOOLONG:
        from euclip_cli.rundir import path_problem

        return path_problem(path) or f"{path}: {err.strerror.lower()}: give a shorter path", 2
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        from euclip_cli.rundir import folder_problem

        problem = folder_problem(path)
        if problem:
            return problem, 2
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
    except EuclipError as err:
        fail(getattr(err, "problems", None) or str(err), err.exit_code, err.details)
    except (KeyboardInterrupt, Exception) as err:
        stop = stops.stop_behind(err)
        if stop is not None:
            fail(stops.stop_message(stop), 1)
        fault = environment_fault(err) if isinstance(err, (OSError, RuntimeError, ImportError)) else None
        if fault is None:
            raise
        fail(*fault)


class _Stopped(Exception):
    """A stop (SIGINT, SIGTERM) outside a command's own funnel, carried past Typer, which would turn it into a
    silent exit 130."""

    def __init__(self, interrupt: KeyboardInterrupt):
        super().__init__(stops.stop_message(interrupt))


@contextlib.contextmanager
def _carried_past_typer():
    """A stop, or an error that carries one (``stops.stop_behind``), as ``_Stopped``."""
    try:
        yield
    except (KeyboardInterrupt, Exception) as err:
        stop = stops.stop_behind(err)
        if stop is None:
            raise
        raise _Stopped(stop) from None


class OneLineErrors(TyperGroup):
    """Click's own errors (a value outside an option's range, a missing option, an unknown command)
    in euclip's form: one ``error:`` line naming the option and where to look, with Click's exit
    code (2 for usage), where Click would draw a box under the usage text; and a stop while Click
    parses or dispatches, the one line a command's funnel says of it."""

    def make_context(self, *args, **kwargs):
        with _carried_past_typer():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _carried_past_typer():
            return super().invoke(ctx)

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except NoArgsIsHelpError as err:  # the help is already printed, as Typer does
            sys.exit(err.exit_code)
        except _Stopped as err:
            err_console.print(f"[bold red]error:[/] {err}", highlight=False)
            sys.exit(1)
        except ClickException as err:
            ctx = getattr(err, "ctx", None)
            where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            err_console.print(f"[bold red]error:[/] {escape(' '.join(err.format_message().split()))}{where}",
                              highlight=False, soft_wrap=True)
            sys.exit(err.exit_code)
        except typer.Abort:  # end of input at a prompt (Typer's own stops are _Stopped by now)
            err_console.print("[bold red]error:[/] interrupted", highlight=False)
            sys.exit(1)
        except (OSError, RuntimeError, ImportError) as err:
            # What a command's own error funnel (common.errors) would say of a fault of the machine,
            # for one raised before the command reached it (a library's import out of open files).
            fault = environment_fault(err)
            if fault is None:
                raise
            err_console.print(f"[bold red]error:[/] {escape(one_line(fault[0]))}", highlight=False, soft_wrap=True)
            sys.exit(fault[1])
        # A command's own return value is not an exit code; Exit(n) arrives here as the int n.
        sys.exit(code if isinstance(code, int) else 0)


def run_app(app: typer.Typer) -> None:
    """Run a command line of euclip's (``euclip``, ``euclip-bench``) with its warnings in one line each, and
    SIGINT and SIGTERM stopping it, whatever its parent left them as (the entry points install that first,
    ``stops.launch``; a caller of its own gets it here)."""
    stops.install()
    warnings.showwarning = show_warning
    hide_unused_from_open_clip()
    # huggingface_hub parses HF_ENDPOINT as it is imported, and open_clip imports it with the model: a bad one is
    # named before any command starts, rather than in a traceback from whichever import met it first.
    from euclip_cli.data.fetch import check_hub_endpoint

    try:
        check_hub_endpoint()
    except UsageError as err:  # outside any command yet: no Typer to turn fail's Exit into the exit code
        err_console.print(f"[bold red]error:[/] {escape(one_line(str(err)))}", highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)
    # clip-benchmark 1.6.2 builds its WebDatasets without ``shardshuffle``; the warning is about
    # its code, says nothing to a user, and the evaluation order it implies (none) is what we want.
    warnings.filterwarnings("ignore", message=r"WebDataset\(shardshuffle=\.\.\.\) is None")
    app()
