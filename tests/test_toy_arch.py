"""A pair of towers from a package of its own: a module that registers an ``Arch``, named under the
``euclip.archs`` entry point of its distribution, trains and evaluates in fresh euclip processes;
nothing in euclip changes (as for geometries, tests/test_toy_geometry.py)."""

import json
import os
import subprocess
import sys

import pytest

from tests.plugins import installed_plugin

PLUGIN = '''
from euclip_cli.towers.archs import Arch, register

# A ViT smaller than any of euclip's: 2 layers of width 64 on 64-px images in 16-px patches.
register(Arch("toy-vit-2", 64, dict(image_size=64, patch_size=16, width=64, layers=2, head_width=32),
              dict(context_length=32, vocab_size=49408, width=64, heads=2, layers=2)))
'''


@pytest.mark.slow
def test_towers_from_a_package_of_their_own_train_and_evaluate_in_fresh_processes(world, tmp_path):
    runs = tmp_path / "runs"
    train = [sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--name", "toy", "--runs-dir",
             str(runs), "model.arch=toy-vit-2", f"data.train_dir={world / 'train'}", "data.batch_size=32",
             "data.shuffle_buffer=100", "optim.samples=64", "optim.warmup_steps=1", "train.precision=fp32",
             "train.tensorboard=false"]

    def euclip(command, env):
        return subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=600)

    with_plugin = installed_plugin(tmp_path / "site", "toy_towers", PLUGIN, "euclip.archs")
    done = euclip(train, with_plugin)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((runs / "toy" / "config.json").read_text())["model"]["arch"] == "toy-vit-2"
    done = euclip([sys.executable, "-m", "euclip_cli", "eval", str(runs / "toy"), "--tasks", "world/shapes",
                   "--world", str(world)], with_plugin)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [json.loads(line)["key"] for line in (runs / "toy" / "eval.jsonl").read_text().splitlines()] == ["world/shapes"]
    # Without the package the same arch is refused in one line naming it, before any training.
    done = euclip(train[:7] + ["other"] + train[8:], dict(os.environ))
    assert done.returncode == 2 and "model.arch 'toy-vit-2'" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr and not (runs / "other" / "checkpoints").exists()
