"""euclip's two kinds of error, and the exit code each one owns.

Every exception euclip raises on purpose derives from one of these:

- ``UsageError`` (exit 2): the command, a recipe, an override or an input file is wrong; the
  message says what to change.
- ``Failure`` (exit 1): the command was right but the work could not be done (no network, a
  corrupt download, a run that diverged); the message says what happened and what to do.

Anything else that escapes a command is a bug and is shown with its traceback. Standard library
only, so the CLI can classify errors without importing torch.
"""

from __future__ import annotations

import errno
from typing import Sequence


class EuclipError(Exception):
    """Base of euclip's deliberate errors; ``exit_code`` is what the CLI exits with.

    The message is one line (a value it quotes may hold line breaks: the CLI shows them escaped);
    ``details`` are lines of our own that follow it (a child process's output, the runs that failed).
    """

    exit_code = 1

    def __init__(self, message: str = "", details: Sequence[str] = ()):
        super().__init__(message)
        self.details = tuple(details)


class UsageError(EuclipError):
    """A mistake in what the user asked for (exit 2)."""

    exit_code = 2


class Failure(EuclipError):
    """The work could not be done (exit 1)."""

    exit_code = 1


class DamagedLines(UserWarning):
    """Lines of a file euclip writes that a reader skipped (cut short by a crash): the command goes on with
    the rest, and the CLI shows it as one ``warning:`` line."""


def out_of_file_descriptors(err: BaseException) -> bool:
    """Whether ``err`` is this process running out of file descriptors: the operating system's EMFILE or
    ENFILE, or torch's DataLoader saying so in its own RuntimeError (its workers pass each batch's
    buffers as descriptors, so a low ``ulimit -n`` shows up there first), or an OSError of a worker's
    that the DataLoader raised again from its message alone (without its errno)."""
    return ((isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE))
            or (isinstance(err, (RuntimeError, OSError)) and "Too many open files" in str(err)))
