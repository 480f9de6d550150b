"""A file someone names is read through one owner (``euclip_cli.readers``): a FIFO, a device, a folder, a file
larger than any of its kind or text that is not UTF-8 is refused in one line with exit 2, before anything waits
on it or fills memory from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from euclip_cli import readers
from euclip_cli.rundir import read_json


@pytest.fixture()
def odd_files(tmp_path):
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    bad = tmp_path / "latin1.md"
    bad.write_bytes("line one\ncaf\xe9\n".encode("latin-1"))
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(readers.JSON_LIMIT + 1)  # sparse: no disk used
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    return {"fifo": fifo, "bad": bad, "huge": huge, "folder": folder, "device": "/dev/zero"}


@pytest.mark.parametrize("kind, fragment", [("fifo", "is a FIFO, not a regular file"),
                                            ("device", "is a device, not a regular file"),
                                            ("folder", "is a folder: give a file"),
                                            ("bad", "is not UTF-8 text (byte 0xe9 on line 2)"),
                                            ("huge", "is larger than 256 MiB")])
def test_each_kind_of_unreadable_file_is_refused_without_opening_it(odd_files, kind, fragment):
    with pytest.raises(readers.UnreadableFile, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        readers.read_text(Path(odd_files[kind]), "file", readers.JSON_LIMIT)


def test_the_run_directorys_json_reader_refuses_them_too_and_still_says_a_file_is_missing(odd_files, tmp_path):
    for kind in ("fifo", "huge"):
        with pytest.raises(readers.UnreadableFile):
            read_json(odd_files[kind])
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "absent.json")


def euclip(*args: str, cwd) -> subprocess.CompletedProcess:
    # A subprocess with a timeout: a reader that opened the FIFO would wait for ever, and fail here as a timeout.
    return subprocess.run([sys.executable, "-m", "euclip_cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, "COLUMNS": "200"})


def test_every_command_refuses_them_in_one_line(odd_files, tmp_path):
    extends = tmp_path / "child.toml"
    extends.write_text(f'extends = "{odd_files["fifo"]}"\n')
    cases = [(["train", "--recipe", str(odd_files["fifo"])], "is a FIFO"),
             (["train", "--recipe", str(extends)], "is a FIFO"),
             (["report", "--readme", str(odd_files["bad"])], "is not UTF-8 text"),
             (["report", "--readme", "/dev/zero"], "is a device"),
             (["analyze", "traverse", "results/runs/x", "--captions", str(odd_files["fifo"])], "is a FIFO"),
             (["study", "--recipe", "study-geometries", "--plan", "--throughput", str(odd_files["fifo"])],
              "is a FIFO")]
    for args, fragment in cases:
        done = euclip(*args, cwd=tmp_path)
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and fragment in lines[0], (args, done.stdout, done.stderr)
