"""What a run's configuration controls beyond the model: the data order's own seed, and a run
written before a configuration key existed still resuming."""

import json

import pytest

from euclip_cli import config as C
from euclip_cli.rundir import RunConflict, RunDir
from euclip_cli.train import loop

TINY = ["data.batch_size=16", "optim.samples=32", "optim.warmup_steps=1", "train.precision=fp32",
        "train.log_every=1", "train.tensorboard=false", "data.shuffle_buffer=50", "train.checkpoints=1"]


def losses(world, path, *overrides):
    loop.run(C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", *TINY, *overrides]), path)
    return [json.loads(l)["loss"] for l in (path / "metrics.jsonl").read_text().splitlines()]


def test_the_order_seed_changes_the_data_and_defaults_to_the_run_seed(world, tmp_path):
    default = losses(world, tmp_path / "default", "train.seed=3")
    named = losses(world, tmp_path / "named", "train.seed=3", "data.order_seed=3")
    other = losses(world, tmp_path / "other", "train.seed=3", "data.order_seed=4")
    assert named == default
    # Same initialisation, other batches: the first step's loss already differs.
    assert other[0] != default[0]


def test_a_run_whose_config_predates_a_key_resumes_and_a_changed_key_is_still_refused(world, tmp_path):
    run = tmp_path / "run"
    losses(world, run)
    stored = json.loads((run / "config.json").read_text())
    del stored["data"]["order_seed"]  # as a run written before the key existed
    (run / "config.json").write_text(json.dumps(stored))
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", *TINY])
    assert loop.run(cfg, run)["branch"] == "already complete"
    with pytest.raises(RunConflict, match="data.order_seed"):
        loop.run(C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", *TINY, "data.order_seed=5"]), run)
    assert RunDir(run).config() == stored
