"""What a run's configuration controls beyond the model: the data order's own seed, the
temperature's own learning rate, and a run written before a configuration key existed still resuming."""

import json
import math

import pytest
import torch

from euclip_cli import config as C
from euclip_cli.rundir import RunConflict, RunDir, load_checkpoint
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


def test_the_temperatures_own_learning_rate_scales_its_first_adam_step_and_nothing_else(world, tmp_path):
    # Adam's first step moves each parameter by lr * g / (|g| + eps): by the learning rate, whatever
    # the gradient. One step (warm-up 1, so the schedule's rate is the peak's) from the same seed.
    one = ["optim.samples=16", "optim.lr=1e-3"]
    start = C.initial_logit_scale(C.load_config("tiny-clip"))
    moved = {}
    for scale in (1, 40):
        path = tmp_path / f"scale-{scale}"
        losses(world, path, *one, f"optim.scalar_lr_scale={scale}")
        moved[scale] = load_checkpoint(RunDir(path).latest_checkpoint())["model"]
    for scale, state in moved.items():
        assert abs(state["clip.logit_scale"].item() - start) == pytest.approx(scale * 1e-3, rel=1e-3)
    assert math.copysign(1, moved[1]["clip.logit_scale"].item() - start) == \
        math.copysign(1, moved[40]["clip.logit_scale"].item() - start)
    others = [k for k in moved[1] if k != "clip.logit_scale"]
    assert others and all(torch.equal(moved[1][k], moved[40][k]) for k in others)
