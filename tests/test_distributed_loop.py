"""The trainer itself under two gloo ranks: bf16, fp16 with an overflow on one rank only, and torch.compile.

``test_distributed`` checks one step's arithmetic against one process; these run ``loop.run`` as
torchrun would (one process per rank, the rendezvous in the environment) and check what the ranks
must agree on: after every step the same weights, so a skipped step is skipped everywhere.
"""

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from euclip_cli import config as C
from euclip_cli.rundir import RunDir, load_checkpoint
from euclip_cli.towers import batchnorm_statistics
from euclip_cli.train import loop
from tests.test_multiprocess import free_port

pytestmark = pytest.mark.slow

# A ViT tower unless a test names another: no BatchNorm statistics, which are per rank by design.
BASE = ["model.arch=tiny-vit", "data.batch_size=16", "optim.samples=64", "optim.warmup_steps=1", "train.log_every=1",
        "train.tensorboard=false", "data.shuffle_buffer=50", "train.checkpoints=1"]


def rank_main(rank: int, port: int, overrides: list[str], out: str, poison_call: int) -> None:
    # Dynamo and AOTAutograd as the trainer's compile uses them, without inductor's code generation
    # (minutes of C++ compiling per rank on 2 cores): what meets the gradient hooks is the same graph.
    real_compile = torch.nn.Module.compile
    torch.nn.Module.compile = lambda module, **kwargs: real_compile(module, backend="aot_eager")
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cfg = C.load_config("tiny-clip", overrides)
    real, seen = loop.forward_backward, {"calls": 0}

    def recording(model, *args, **kwargs):
        seen["model"], seen["calls"] = model, seen["calls"] + 1
        if rank == 1 and seen["calls"] == poison_call:
            # This rank's local gradients overflow (the loss itself stays finite); the other rank's do not.
            kwargs["backward"] = lambda loss: (loss * float("inf")).backward()
        return real(model, *args, **kwargs)

    loop.forward_backward = recording
    summary = loop.run(cfg, Path(out) / "run")
    weights = {name: p.detach().clone() for name, p in seen["model"].named_parameters()}
    statistics = {name: b.clone() for name, b in batchnorm_statistics(seen["model"]).items()}
    compiled = all(getattr(tower, "_compiled_call_impl", None) is not None  # what Module.compile() sets
                   for tower in (seen["model"].clip.visual, seen["model"].clip.transformer))
    torch.save({"summary": summary, "weights": weights, "calls": seen["calls"], "compiled": compiled,
                "statistics": statistics}, Path(out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def two_ranks(world, tmp_path, extra: list[str], poison_call: int = 0) -> tuple[list[dict], list[dict]]:
    overrides = [f"data.train_dir={world / 'train'}", *BASE, *extra]
    mp.spawn(rank_main, args=(free_port(), overrides, str(tmp_path), poison_call), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return ranks, records


def assert_same_weights(ranks: list[dict]) -> None:
    first, second = (r["weights"] for r in ranks)
    assert first.keys() == second.keys() and any("visual" in name for name in first)
    for name, tensor in first.items():
        assert torch.isfinite(tensor).all(), name
        assert torch.equal(tensor, second[name]), f"the ranks' {name} differ"


def test_bf16_ranks_end_with_identical_weights_and_checkpoint_their_own_batchnorm_statistics(world, tmp_path):
    ranks, records = two_ranks(world, tmp_path, ["train.precision=bf16", "model.arch=tiny"])  # the ResNet tower
    assert [r["step"] for r in records] == [1, 2, 3, 4] and all(r["nonfinite_steps"] == 0 for r in records)
    assert all(r["summary"]["steps"] == 4 for r in ranks) and [r["compiled"] for r in ranks] == [False, False]
    assert_same_weights(ranks)
    # Each rank's statistics drifted on its own data; the checkpoint keeps both and the model gets their mean.
    state = load_checkpoint(RunDir(tmp_path / "run").latest_checkpoint())
    own = [r["statistics"] for r in ranks]
    assert own[0] and len(state["batchnorm_ranks"]) == 2
    assert any(not torch.equal(own[0][n], own[1][n]) for n in own[0] if n.endswith("running_mean"))
    for name in own[0]:
        for rank in (0, 1):
            assert torch.equal(state["batchnorm_ranks"][rank][name], own[rank][name]), (rank, name)
        if name.endswith("num_batches_tracked"):
            assert state["model"][name] == own[0][name] == own[1][name] == 4
        else:
            torch.testing.assert_close(state["model"][name], (own[0][name] + own[1][name]) / 2)


def test_fp16_overflow_on_one_rank_skips_that_step_on_every_rank(world, tmp_path):
    ranks, records = two_ranks(world, tmp_path, ["train.precision=fp16"], poison_call=2)
    # Call 2 overflowed on rank 1 only: the summed gradient is non-finite on both ranks, so both skip
    # its update and both halve the loss scale; the skipped step counts as a step, as a gradient
    # scaler's does.
    assert [r["calls"] for r in ranks] == [4, 4]
    assert [r["summary"]["nonfinite_steps"] for r in ranks] == [1, 1]
    assert [(r["step"], r["nonfinite_steps"], r["loss_scale"]) for r in records] == [
        (1, 0, 2.0 ** 16), (2, 1, 2.0 ** 15), (3, 1, 2.0 ** 15), (4, 1, 2.0 ** 15)]
    assert_same_weights(ranks)


def test_compiled_towers_train_under_two_ranks_with_identical_weights(world, tmp_path):
    # fp32: the compiled bf16 backward is not finite on some CPUs with torch 2.14.1 (docs/speed.md).
    ranks, records = two_ranks(world, tmp_path, ["train.compile=true", "train.precision=fp32"])
    assert [r["compiled"] for r in ranks] == [True, True]
    assert [r["step"] for r in records] == [1, 2, 3, 4] and all(r["nonfinite_steps"] == 0 for r in records)
    assert_same_weights(ranks)


def test_the_local_loss_with_checkpointing_trains_as_the_whole_loss_does(world, tmp_path):
    """DataComp's flags for few GPUs through the whole trainer: each rank's share of the loss
    (loss.local_loss) and checkpointed towers give the ranks identical weights, the whole loss's logged
    values and, to fp32's rounding, its weights."""
    fp32 = ["train.precision=fp32"]
    whole, whole_records = two_ranks(world, tmp_path / "whole", fp32)
    local, local_records = two_ranks(world, tmp_path / "local",
                                     [*fp32, "loss.local_loss=true", "train.grad_checkpointing=true"])
    assert_same_weights(local)
    for a, b in zip(whole_records, local_records):  # the terms a rank logs are summed over ranks: the global loss
        assert a["step"] == b["step"] and a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for name, tensor in whole[0]["weights"].items():
        torch.testing.assert_close(local[0]["weights"][name], tensor, rtol=1e-4, atol=1e-5, msg=name)
