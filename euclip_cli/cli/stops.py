"""How a command line stops: what the ``euclip`` and ``euclip-bench`` entry points (``cli.entry``) run first.

SIGINT and SIGTERM raise in the main thread from the command's first instant, before the command line's
own imports (about 0.2 s of typer, rich and the command modules), so that a signal then is one line and
exit 1 rather than a traceback or a silent death. Once the command has its exit code, a signal ends the
process at once with that code, and in the interpreter's last teardown is ignored: the shutdown (torch's
and the pools' exit handlers) would otherwise print the interrupt's traceback under the command's
finished output, or end a finished command by the signal.

Standard library only: this module is what runs before anything else is imported.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from typing import Callable, Optional


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C's KeyboardInterrupt is, so that every cleanup an interrupt
    runs (a world or shards written whole or not at all, a pool's pieces cancelled) runs for it too. The
    trainer and the study launcher install their own SIGTERM handlers (a checkpoint, the runs stopped)."""


def _terminate(signum, frame) -> None:
    raise Terminated()


def install() -> None:
    """SIGTERM raises ``Terminated``; SIGINT raises KeyboardInterrupt, whatever the parent left it as (Python
    leaves SIGINT ignored when it starts with it ignored, as a test runner's worker or a shell's background
    job starts it: Ctrl-C and kill -INT then did nothing, and a world was written whole). A stop that
    arrives while the process forks is held until the fork is done (the fork hooks below)."""
    global _forks_held
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.unraisablehook = _quiet_once_stopped
    if not _forks_held:
        os.register_at_fork(before=_fork_begins, after_in_parent=_fork_ended, after_in_child=_forked)
        _forks_held = True


# A stop arriving while the process forks (a loader's workers start: tens of milliseconds for a process
# holding torch) is first seen by Python inside the fork's own hooks, which report an exception as
# "Exception ignored" and carry on: the stop was lost, the command finished with exit 0 and a traceback.
# So the main thread's handlers only record a stop for the fork's duration; afterwards the stop is
# delivered to the main thread again, out of the hooks (``_thread.interrupt_main``, from a thread that
# waits for the hooks to have run).
_forks_held = False
_held: dict = {}
_pending: list[int] = []


def _fork_begins() -> None:
    import threading

    if threading.current_thread() is threading.main_thread():  # only it may set handlers
        _held.update({signum: signal.signal(signum, lambda got, frame: _pending.append(got))
                      for signum in (signal.SIGINT, signal.SIGTERM)})


def _restore() -> None:
    for signum, handler in _held.items():
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    _held.clear()


def _fork_ended() -> None:
    import _thread

    if not _held:
        return
    _restore()
    if _pending:
        # A bare thread (threading's would make this hook wait for it to start, inside the hooks), which lets
        # the remaining hooks (microseconds) run before it delivers the stop.
        _thread.start_new_thread(_deliver, (_pending[0],))
        _pending.clear()


def _deliver(signum: int) -> None:
    import _thread
    import time

    time.sleep(0.01)
    _thread.interrupt_main(signum)


def _forked() -> None:
    """A forked child (a loader's or a pool's worker, until it sets its own) leaves Ctrl-C, which reaches the
    whole process group, to its parent from its first instant, and dies of SIGTERM as any process does: a
    Python handler here would raise inside the remaining fork hooks, swallowed with a traceback, or end a
    starting worker, whose parent then fails on the lost worker instead of saying it was stopped."""
    _held.clear()
    _pending.clear()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_behind(err: BaseException) -> Optional[KeyboardInterrupt]:
    """The stop that ``err`` is, or that it carries as its cause: a stop raised where Python or a library wraps
    whatever is raised there (Python 3.11 wraps an exception from a class body's ``__set_name__``, which an import
    that Ctrl-C interrupts can meet in torch's dataclasses, in a RuntimeError); None for any other error. Only the
    cause: an error raised while a stop was being handled (its context), the stop's own exit among them, is
    itself."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:  # a cycle of causes ends the walk
        if isinstance(err, KeyboardInterrupt):
            return err
        seen.add(id(err))
        err = err.__cause__
    return None


# Whether this command line was stopped by a signal: set as it says so (``stop_message``).
_stopped = False


def stop_message(err: BaseException) -> str:
    """What a stopped command says after ``error:`` (every funnel that reports a stop asks here)."""
    global _stopped
    _stopped = True
    return "terminated (SIGTERM)" if isinstance(err, Terminated) else "interrupted"


def _quiet_once_stopped(unraisable) -> None:
    """``sys.unraisablehook``: Python's report of an error in a finalizer, until a stop is said. After it, an object
    that the stop cut short as it was being made (a DataLoader's iterator stopped while it started its workers)
    fails in its ``__del__`` as it is collected, under the stop's line: that is the stop's doing, not a second
    fault, and the stop's one line stays one."""
    if not _stopped:
        sys.__unraisablehook__(unraisable)


def _end_stopped(code: int) -> None:
    """End a stopped command with ``code`` once its exit handlers have run. CPython remembers a
    KeyboardInterrupt that passed through an exec or eval of source text (a dataclass's or a namedtuple's
    methods are made so, on import) and, under ``python -m`` (torchrun's way in), ends the process by SIGINT
    after finalizing, whatever exit code was asked for: the stop's exit 1 then read as 130 by chance."""
    atexit._run_exitfuncs()  # what finalizing would run: temporary folders' finalizers, pools' joins
    _exit_with(code)(None, None)


def _exit_with(code: int) -> Callable:
    def handler(signum, frame) -> None:
        _flush()
        os._exit(code)

    return handler


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass


def _ignore_stops() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def launch(load: Callable[[], Callable[[], None]]) -> None:
    """Run the command line that ``load`` imports and returns, stoppable throughout: a stop before the command
    takes over is one ``error:`` line and exit 1; after it has exited, a stop ends the process with its code."""
    install()
    # Registered first, so run last: after every other exit handler only the interpreter's own teardown is
    # left, which restores the default actions and would let a late stop kill a finished command by its
    # signal; ignored from then on, a stop leaves the command's exit code as it is.
    atexit.register(_ignore_stops)
    code = 1
    try:
        try:
            load()()
            code = 0
        except (KeyboardInterrupt, Exception) as err:  # in the imports, before the command's own error funnel
            stop = stop_behind(err)
            if stop is None:
                raise
            sys.stderr.write(f"error: {stop_message(stop)}\n")  # code stays 1
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        raise
    finally:
        signal.signal(signal.SIGTERM, _exit_with(code))
        signal.signal(signal.SIGINT, _exit_with(code))
        if _stopped:
            _end_stopped(code)
    sys.exit(code)
