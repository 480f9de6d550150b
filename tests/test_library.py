"""docs/library.md's snippet trains, evaluates and embeds in a fresh interpreter, importing no
Typer and printing only what the snippet prints."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "library.md"


@pytest.mark.slow
def test_the_documented_snippet_runs_without_the_command_line(world, tmp_path):
    (snippet,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    # The session's small world, and fewer steps: the snippet as a reader would run it otherwise.
    snippet = snippet.replace('"optim.samples=256"', f'"optim.samples=64", "data.batch_size=32", '
                                                     f'"data.train_dir={world / "train"}", "data.shuffle_buffer=100", '
                                                     f'"train.tensorboard=false"')
    # (rich may arrive with scikit-learn's progress callbacks; euclip's own terminal is typer and cli.)
    check = ("\nimport sys\nloaded = [m for m in ('typer', 'euclip_cli.cli') if m in sys.modules]\n"
             "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", snippet + check], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].split()[0] == "2" and 0 <= float(lines[0].split()[1]) <= 1
    assert lines[1] == "torch.Size([4, 4])"
