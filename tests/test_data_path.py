"""The one data path: a batch as one buffer, staged in slots allocated once, a step that never reads
the device back, and the other sources of batches (OpenCLIP's pipeline, one batch repeated)."""

import json

import pytest
import torch

from euclip_cli import config as C
from euclip_cli.data.feed import SLOTS, DeviceFeed
from euclip_cli.data.loader import (LAYOUT_WORDS, Batch, BatchLayout, TrainBatches, list_shards, pack, segment_steps_for,
                                    unpack)
from euclip_cli.rundir import RunDir
from euclip_cli.towers import build_clip, tokenizer_for, transforms_for
from euclip_cli.train import loop

TINY = ["data.batch_size=16", "optim.warmup_steps=1", "train.precision=fp32", "train.tensorboard=false",
        "data.shuffle_buffer=50"]


@pytest.mark.parametrize("shared", [False, True])
def test_a_batch_packs_into_one_aligned_buffer_and_unpacks_to_the_same_tensors(shared):
    torch.manual_seed(0)
    images = [torch.randn(3, 5, 7) for _ in range(3)]  # 315 floats: the tokens start past a padded boundary
    tokens = [torch.randint(0, 49408, (9,)) for _ in range(3)]
    flat, header = pack(images, tokens, shared)
    header[LAYOUT_WORDS:LAYOUT_WORDS + 6] = torch.tensor([1, 2, 3, 4, 5, 6])
    assert flat.dtype == torch.uint8 and flat.is_shared() == shared
    batch, info = unpack(flat)
    assert torch.equal(batch.images, torch.stack(images)) and torch.equal(batch.tokens, torch.stack(tokens))
    assert info == [1, 2, 3, 4, 5, 6] and batch.flat is flat
    assert BatchLayout.of(flat) == BatchLayout(3, 3, 5, 7, 9)
    for view in (batch.images, batch.tokens):
        assert view.untyped_storage().data_ptr() == flat.data_ptr() and view.data_ptr() % 64 == 0
    with pytest.raises(TypeError, match="float32 or uint8 images and int64 tokens"):
        pack([i.double() for i in images], tokens, shared)


@pytest.mark.parametrize("shared", [False, True])
def test_uint8_crops_pack_at_a_quarter_of_the_bytes_and_unpack_as_uint8(shared):
    crops = [torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8) for _ in range(3)]
    tokens = [torch.randint(0, 49408, (9,)) for _ in range(3)]
    flat, _ = pack(crops, tokens, shared)
    batch, _ = unpack(flat)
    assert batch.images.dtype == torch.uint8 and torch.equal(batch.images, torch.stack(crops))
    assert torch.equal(batch.tokens, torch.stack(tokens)) and batch.tokens.data_ptr() % 64 == 0
    assert BatchLayout.of(flat) == BatchLayout(3, 3, 5, 7, 9, image_dtype=1)
    assert BatchLayout.of(flat).image_bytes * 4 == BatchLayout(3, 3, 5, 7, 9).image_bytes


def test_segments_hold_several_shuffle_buffers_and_are_not_tied_to_checkpoints():
    assert segment_steps_for(batch_size=128, shuffle_buffer=2000, workers=0) == 250  # ceil(16 x 2000 / 128)
    assert segment_steps_for(batch_size=128, shuffle_buffer=2000, workers=4) == 1000  # per stream, four streams
    assert segment_steps_for(batch_size=64, shuffle_buffer=0, workers=1) == 1


@pytest.fixture(scope="module")
def stream_parts():
    return transforms_for(build_clip("tiny"))[0], tokenizer_for("tiny")


def loader(world, parts, workers=1):
    return TrainBatches(list_shards(world / "train", "x"), 8, parts[0], parts[1], seed=0, shuffle_buffer=20,
                        segment_steps=100, workers=workers)


def test_the_feed_stages_every_batch_in_two_slots_allocated_once(world, stream_parts):
    stream = loader(world, stream_parts)
    feed = DeviceFeed(torch.device("cpu"), normalization=stream.normalization)
    try:
        batches = [next(stream) for _ in range(6)]
        assert all(b.images.dtype == torch.uint8 for b in batches)  # crops, normalised by the feed
        kept = [(stream.normalization(b.images), b.tokens.clone()) for b in batches]
        fed, slots = [], set()
        for i, batch in enumerate(batches):
            fed.append(feed(batch))
            images, tokens, host_tokens = fed[-1]
            assert torch.equal(images, kept[i][0]) and torch.equal(tokens, kept[i][1])
            assert torch.equal(host_tokens, kept[i][1])
            # The tokens stay views of the slot they were copied into (the images are the normalised crops).
            assert tokens.untyped_storage().data_ptr() != batch.flat.data_ptr()  # a copy, in the slot
            slots.add(tokens.untyped_storage().data_ptr())
            if i:  # the batch before is untouched until its slot comes round again
                assert torch.equal(fed[i - 1].images, kept[i - 1][0])
    finally:
        stream.close()
    assert len(slots) == SLOTS and feed.allocations == SLOTS


def test_the_feed_takes_separate_tensors_as_openclips_pipeline_hands_them_over():
    feed = DeviceFeed(torch.device("cpu"))
    images, tokens = torch.randn(4, 3, 8, 8), torch.randint(0, 9, (4, 5))
    for _ in range(4):
        fed = feed(Batch(images, tokens))
        assert torch.equal(fed.images, images) and torch.equal(fed.tokens, tokens) and fed.images is not images
    assert feed.allocations == SLOTS
    unstaged = DeviceFeed(torch.device("cpu"), staging=False)(Batch(images, tokens))
    assert unstaged.images is images and unstaged.tokens is tokens  # moved as OpenCLIP moves them: as they are


class RecordedCopies:
    """The GPU's staging as a record of events: which slot's copy was waited on before it was refilled."""

    def __init__(self):
        self.log, self.copies = [], 0

    def allocate(self, like):
        self.log.append("allocate")
        return torch.empty(like.shape, dtype=like.dtype)

    def wait(self, done):
        self.log.append(f"wait {done}")

    def to_device(self, staged):
        self.copies += 1
        self.log.append(f"copy {self.copies}")
        return [t.clone() for t in staged], self.copies


def test_a_slot_is_refilled_only_after_its_last_copy_to_the_device_is_done():
    copies = RecordedCopies()
    feed = DeviceFeed(torch.device("cpu"), copies=copies)
    for _ in range(4):
        feed(Batch(torch.randn(2, 3, 4, 4), torch.zeros(2, 3, dtype=torch.long)))
    # Batch 3 reuses batch 1's slot after waiting for copy 1; batch 4 batch 2's after copy 2.
    assert copies.log == ["allocate", "allocate", "wait None", "copy 1", "allocate", "allocate", "wait None",
                          "copy 2", "wait 1", "copy 3", "wait 2", "copy 4"]


@pytest.mark.parametrize("overrides", [["train.log_every=4"], ["optim.accum_steps=2", "loss.entail_weight=0.1",
                                                               "geometry.name=euclidean", "geometry.logit=d2",
                                                               "train.precision=fp16"], ["data.decode=device"]],
                         ids=["clip", "euclidean-entailment-accum2-fp16", "device-decode"])
def test_a_training_step_never_reads_a_device_tensor_back(world, tmp_path, monkeypatch, overrides):
    """Every operation of the feed, the forward and backward, the non-finite guard and the update runs
    under a counter of the operations after which a GPU's host would wait for the device: none, at
    any step. The reads a logging step makes (the loss, the guard's counts) happen outside them."""
    from euclip_bench.ops import OpCounter

    counter = OpCounter()

    def watched(function):
        def run(*args, **kwargs):
            with counter:
                return function(*args, **kwargs)
        return run

    monkeypatch.setattr(loop, "forward_backward", watched(loop.forward_backward))
    monkeypatch.setattr(loop, "apply_update", watched(loop.apply_update))
    monkeypatch.setattr(loop.NonfiniteGuard, "check", watched(loop.NonfiniteGuard.check))
    monkeypatch.setattr(loop.DeviceFeed, "__call__", watched(loop.DeviceFeed.__call__))
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=128", "data.workers=1",
                                      *TINY, *overrides])
    result = loop.run(cfg, tmp_path / "run")
    assert result["steps"] == 8
    assert sum(counter.ops.values()) > 1000  # the whole step ran under the counter
    assert not counter.reads, counter.reads


def test_openclips_pipeline_feeds_the_trainer_past_the_end_of_a_shard(world, tmp_path):
    """Until its 5,000-sample shuffle buffer is full, OpenCLIP's pipeline reads two samples for each it
    yields: 1,024 samples read 2,048, past the end of the fixture world's 1,500 (KeyError 'fname' there,
    without ``openclip_compatible``)."""
    from tests.conftest import SMALL_WORLD

    assert SMALL_WORLD.samples < 2 * 1024
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=1024", "data.workers=1",
                                      "data.pipeline=openclip", "train.log_every=8", *TINY])
    assert loop.run(cfg, tmp_path / "run")["steps"] == 64
    records = RunDir(tmp_path / "run").training_records()
    assert records[-1]["step"] == 64 and all(0 < r["loss"] < 10 and r["skipped_samples"] == 0 for r in records)


def test_a_resumed_openclip_pipeline_run_says_its_data_stream_restarted(world, tmp_path, monkeypatch):
    import os
    import signal

    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=96", "data.workers=1",
                                      "data.pipeline=openclip", "train.log_every=1", "train.checkpoints=6", *TINY])
    real, calls = loop.forward_backward, {"n": 0}

    def preempted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "forward_backward", preempted)
    assert loop.run(cfg, tmp_path / "run")["interrupted"]
    monkeypatch.setattr(loop, "forward_backward", real)
    second = loop.run(cfg, tmp_path / "run")
    assert second["steps"] == 6
    assert second["branch"] == ("resumed from step_2.pt (data stream restarted: data.pipeline=openclip has no "
                                "position to resume from)")


def test_the_repeat_pipeline_trains_on_one_batch(world, tmp_path, monkeypatch):
    seen = []
    real = loop.forward_backward

    def watching(model, images, tokens, *args, **kwargs):
        seen.append(images.clone())
        return real(model, images, tokens, *args, **kwargs)

    monkeypatch.setattr(loop, "forward_backward", watching)
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=48", "data.workers=1",
                                      "data.pipeline=repeat", "train.log_every=1", *TINY])
    assert loop.run(cfg, tmp_path / "run")["steps"] == 3
    assert len(seen) == 3 and all(torch.equal(s, seen[0]) for s in seen)


def test_a_sliced_step_trains_on_part_of_each_batch_and_counts_the_whole(world, tmp_path, monkeypatch):
    sizes = []
    real = loop.forward_backward

    def watching(model, images, tokens, *args, **kwargs):
        sizes.append((images.shape[0], tokens.shape[0]))
        return real(model, images, tokens, *args, **kwargs)

    monkeypatch.setattr(loop, "forward_backward", watching)
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=48",
                                      "train.bench_step_samples=4", "train.log_every=1", *TINY])
    loop.run(cfg, tmp_path / "run")
    assert sizes == [(4, 4)] * 3
    assert [r["samples"] for r in RunDir(tmp_path / "run").training_records()] == [16, 32, 48]


def test_the_training_process_leaves_a_gpu_machines_cores_to_the_loader_workers(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(loop.os, "sched_getaffinity", lambda pid: set(range(16)))
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert loop.host_threads(0, cuda, workers=8) == 4  # 8 cores left; at most 4
    assert loop.host_threads(0, cuda, workers=14) == 2
    assert loop.host_threads(0, cuda, workers=16) == 1
    assert loop.host_threads(0, cpu, workers=8) is None  # on a CPU the step is the work: torch's own choice
    assert loop.host_threads(3, cuda, workers=8) == 3  # train.host_threads as set
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun with 8 ranks a node: 2 cores each
    assert loop.host_threads(0, cuda, workers=1) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert loop.host_threads(0, cuda, workers=1) is None  # what the user or torchrun set is kept


@pytest.mark.parametrize("override, message", [
    ("train.bench_step_samples=1", "train.bench_step_samples: 1 must be 0"),
    ("model.text_groups=-1", "model.text_groups: -1 is not allowed"),
    ("data.pipeline=fast", "data.pipeline"),
    ("data.sharing=shm", "data.sharing"),
    ("train.host_threads=-2", "train.host_threads"),
])
def test_the_data_path_settings_are_checked_with_the_rest_of_the_config(override, message):
    with pytest.raises(C.ConfigError, match=message.replace(".", r"\.")):
        C.load_config("tiny-clip", [override])


def test_the_text_groups_default_by_device_and_a_set_value_everywhere():
    from euclip_cli.towers.text import groups_for

    assert groups_for(None, torch.device("cpu")) == 0 and groups_for(None, torch.device("cuda", 0)) == 2
    assert groups_for(3, torch.device("cuda", 0)) == 3 and groups_for(0, torch.device("cuda", 0)) == 0
    assert C.load_config("tiny-clip", ["model.text_groups=none"]).model.text_groups is None
    assert json.loads(json.dumps(C.to_dict(C.load_config("tiny-clip", ["model.text_groups=2"]))))["model"][
        "text_groups"] == 2
