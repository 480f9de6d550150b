"""Ctrl-C (SIGINT to the whole foreground process group, as a terminal sends it) and SIGTERM (to the command
alone, as a scheduler or `kill` sends it) stop a generating command within seconds, in one line, exit 1, and
leave nothing behind: neither the output nor its staging folder. (The trainer's and the study's own stops,
a checkpoint and a resume, are tested beside them: test_trainer_faults.py, test_study_launch.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

COMMANDS = {"download world": ["download", "world", "--samples", "40000"],
            "download datacomp-like": ["download", "datacomp-like", "--samples", "20000"]}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGTERM"])
def test_a_signal_stops_a_generating_command_in_one_line_leaving_nothing(tmp_path, command, how):
    out = tmp_path / "out"
    # Started with SIGINT ignored, as a parent that ignores it (a test runner's worker, a shell's background
    # job) starts it: the command must take Ctrl-C all the same.
    process = subprocess.Popen([sys.executable, "-m", "euclip_cli", *COMMANDS[command], "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env={**os.environ, "COLUMNS": "200"},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    staging = tmp_path / ".out.partial"
    deadline = time.time() + 60
    while not staging.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert staging.exists(), "the command never started writing"
    time.sleep(1.5)  # the pool's workers are writing shards: the moment that needs its cleanup
    if how == "SIGTERM":
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    lines = [line for line in output.splitlines() if line.strip()]
    assert process.returncode == 1 and lines == [f"error: {'terminated (SIGTERM)' if how == 'SIGTERM' else 'interrupted'}"], output
    assert not out.exists() and not staging.exists()
