"""Reading a file someone named (a recipe, an option's path, a run's JSON): the one owner of the checks every
such read needs, so that no command waits for ever on a FIFO, fills memory from a device or a huge file, or
gives a traceback on text that is not UTF-8.

Stdlib only: the config and the CLI's error funnel import it before anything heavy.
"""

from __future__ import annotations

import stat
from pathlib import Path

from euclip_cli.errors import UsageError

MiB = 1 << 20
# Bounds by kind of file: far above any real one (the largest recipe is about 3 kB, a README or a caption list
# a few MB, a run's JSON a few MB), far below what would exhaust memory.
TEXT_LIMIT = 64 * MiB
RECIPE_LIMIT = 1 * MiB
JSON_LIMIT = 256 * MiB


class UnreadableFile(UsageError):
    """The path is not a regular file, is too large for its kind, or is not the text it should be."""


def _special(mode: int) -> str:
    """What a file of ``mode`` is, where it is neither a regular file nor a folder; "" where it is one."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return ""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a file"


def special_file(path: Path) -> str:
    """What ``path`` is when a reader must never open it (a FIFO blocks, a device never ends, a socket has no
    bytes to read): "a FIFO", "a device", "a socket"; "" for a regular file, a folder or nothing at all."""
    try:
        return _special(path.stat().st_mode)
    except OSError:
        return ""


def regular_file(path: Path, what: str) -> int:
    """``path``'s size, once it is known to be a regular file: a FIFO would block its reader, a device
    (/dev/zero) never ends, a folder or socket has no bytes to read. ``what`` names the file in the error
    ("recipe", "--readme")."""
    try:
        info = path.stat()  # follows links: a link to a regular file is one
    except FileNotFoundError:
        raise UnreadableFile(f"{what} {path}: no such file") from None
    except OSError as err:
        raise UnreadableFile(f"{what} {path}: cannot be read ({err.strerror})") from None
    if stat.S_ISDIR(info.st_mode):
        raise UnreadableFile(f"{what} {path} is a folder: give a file")
    if not stat.S_ISREG(info.st_mode):
        raise UnreadableFile(f"{what} {path} is {_special(info.st_mode)}, not a regular file: give a file")
    return info.st_size


def read_bytes(path: Path, what: str, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them (the file may grow between the check and the read)."""
    size = regular_file(path, what)
    too_big = f"{what} {path} is larger than {limit / MiB:g} MiB, more than any such file should be: check the path"
    if size > limit:
        raise UnreadableFile(too_big)
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise UnreadableFile(f"{what} {path}: cannot be read ({err.strerror})") from None
    if len(data) > limit:
        raise UnreadableFile(too_big)
    return data


def decoded(data: bytes, path: Path, what: str) -> str:
    """``data`` as UTF-8, or an error naming the first bad byte and its line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise UnreadableFile(f"{what} {path} is not UTF-8 text (byte {data[err.start]:#04x} on line {line}): "
                             f"save it as UTF-8") from None


def read_text(path: Path, what: str, limit: int = TEXT_LIMIT) -> str:
    """A regular file's text (UTF-8), bounded by ``limit`` bytes."""
    return decoded(read_bytes(path, what, limit), path, what)
