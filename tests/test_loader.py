"""The training loader: shapes, exact resume positions, per-rank streams, skip counts and costs from workers."""

import io
import tarfile
import time

import pytest
import torch

from euclip_cli.data.loader import TrainBatches, list_shards, shards_for_rank
from euclip_cli.towers import build_clip, tokenizer_for, transforms_for


@pytest.fixture(scope="module")
def pipeline_parts():
    train_tf, _ = transforms_for(build_clip("tiny"))
    return train_tf, tokenizer_for("tiny")


def batches(world_dir, parts, **kwargs):
    defaults = dict(batch_size=8, seed=3, shuffle_buffer=40, segment_steps=3)
    shards = kwargs.pop("shards", None) or list_shards(world_dir / "train", "x")
    return TrainBatches(shards, transform=parts[0], tokenizer=parts[1], **{**defaults, **kwargs})


@pytest.mark.parametrize("workers", [0, 1])
def test_batches_have_the_model_input_shapes(world, pipeline_parts, workers):
    stream = batches(world, pipeline_parts, workers=workers, batch_size=16)
    for _ in range(2):
        images, tokens, flat, _ = next(stream)
        assert images.shape == (16, 3, 64, 64) and tokens.shape == (16, 32) and tokens.dtype == torch.long
        # One buffer a batch: the images and tokens are views of it (in shared memory from a worker).
        assert images.untyped_storage().data_ptr() == tokens.untyped_storage().data_ptr() == flat.data_ptr()
        assert flat.is_shared() == (workers > 0)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("resume_at", [3, 4])  # a segment boundary, and mid-segment
def test_a_resumed_stream_continues_with_the_same_batches(world, pipeline_parts, workers, resume_at):
    full = batches(world, pipeline_parts, workers=workers)
    expected = [next(full) for _ in range(resume_at + 3)]
    first = batches(world, pipeline_parts, workers=workers)
    for _ in range(resume_at):
        next(first)
    resumed = batches(world, pipeline_parts, workers=workers, start=resume_at, state=first.state())
    assert resumed.resumed_exactly
    for want in expected[resume_at:]:
        got = next(resumed)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_position_from_another_layout_restarts_the_stream(world, pipeline_parts):
    first = batches(world, pipeline_parts, workers=0)
    next(first)
    other = batches(world, pipeline_parts, workers=2, start=1, state=first.state())
    assert not other.resumed_exactly
    assert next(other)[0].shape == (8, 3, 64, 64)


def test_ranks_read_disjoint_shards_and_different_batches(world, pipeline_parts):
    names = [f"{i:05d}.tar" for i in range(5)]
    assert shards_for_rank(names, 0, 2) == names[0::2] and shards_for_rank(names, 1, 2) == names[1::2]
    assert shards_for_rank(names[:1], 1, 2) == names[:1]  # too few shards: every rank resamples all
    rank0 = next(batches(world, pipeline_parts, rank=0, world=2))
    rank1 = next(batches(world, pipeline_parts, rank=1, world=2))
    assert not torch.equal(rank0[0], rank1[0])


def test_skips_inside_worker_processes_are_counted(world, pipeline_parts, tmp_path):
    with tarfile.open(world / "train" / "00000.tar") as src:
        members = [(m.name, src.extractfile(m).read()) for m in src.getmembers()[:30]]
    with tarfile.open(tmp_path / "00000.tar", "w") as tar:
        for name, data in members + [("bad.jpg", b"not a jpeg"), ("bad.txt", b"a caption")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    stream = batches(world, pipeline_parts, workers=1, shards=list_shards(tmp_path, "x"), shuffle_buffer=5)
    for _ in range(6):  # 48 good samples: the shard (10 good, 1 bad) is read whole at least 4 times
        next(stream)
    assert stream.skipped >= 3
    assert sum(p["skipped"] for p in stream.state()["workers"].values()) == stream.skipped


def test_a_script_that_never_closes_its_loader_still_exits(world, tmp_path):
    """Workers ignore SIGTERM (the trainer owns stop signals), which is how the interpreter's exit
    stops leftover daemon processes: without an orderly shutdown at exit it would wait forever."""
    import subprocess
    import sys

    script = (
        "from pathlib import Path\n"
        "from euclip_cli.data.loader import TrainBatches, list_shards\n"
        "from euclip_cli.towers import build_clip, tokenizer_for, transforms_for\n"
        f"tf, _ = transforms_for(build_clip('tiny'))\n"
        f"stream = TrainBatches(list_shards(Path({str(world / 'train')!r}), 'x'), 8, tf, tokenizer_for('tiny'), seed=0,\n"
        "                      shuffle_buffer=20, segment_steps=10, workers=2)\n"
        "next(stream)\n"
        "print('read one batch')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "read one batch" in done.stdout, done.stderr[-2000:]


# Long beside what reading and decoding a sample cost the loader itself (a few ms of CPU on a loaded machine,
# more since each sample's boxes travel in its shard), so that a sleeping loader's CPU share stays clearly low.
SAMPLE_SECONDS = 0.02


def sleeping(transform):
    """A transform that keeps its loader off the CPU for a while per sample, as a blocked read would."""
    def slow(image):
        time.sleep(SAMPLE_SECONDS)
        return transform(image)
    return slow


def computing(transform):
    """A transform that keeps its loader busy on the CPU for a while per sample, as decoding would."""
    def slow(image):
        end = time.thread_time() + SAMPLE_SECONDS
        while time.thread_time() < end:
            pass
        return transform(image)
    return slow


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("kind, busy", [(sleeping, False), (computing, True)])
def test_each_batch_reports_what_making_it_cost_its_loader(world, pipeline_parts, workers, kind, busy):
    stream = batches(world, (kind(pipeline_parts[0]), pipeline_parts[1]), workers=workers, shuffle_buffer=0)
    for _ in range(3):
        next(stream)
    work = stream.take_work()
    assert work.batches == 3
    assert work.wall_s >= 3 * 8 * SAMPLE_SECONDS  # 8 samples a batch, each at least that long
    # A busy loader's CPU time holds at least what its transform burned, however loaded the machine (on
    # a loaded one its wall time grows, so a share of wall time would not tell); a sleeping one's stays
    # well below its wall time, which a loaded machine only lengthens.
    if busy:
        assert work.cpu_s >= 3 * 8 * SAMPLE_SECONDS
    else:
        assert work.cpu_s / work.wall_s < 0.5
    assert stream.take_work().batches == 0  # taking the work starts a new count
    next(stream)
    assert stream.take_work().batches == 1


@pytest.mark.parametrize("rate, wait, could, cpu, reading", [
    (600.0, 0.05, 650.0, 0.99, "keep up"),  # barely waiting: whatever the loaders could give
    (650.0, 0.72, 6100.0, 0.99, "lost between the loaders and the step"),  # the GPU gap's pattern
    (650.0, 0.72, 700.0, 0.40, "kept from the CPU"),
    (650.0, 0.72, 700.0, 0.98, "more data.workers"),
])
def test_a_trainers_loader_fields_read_as_one_of_four_causes(rate, wait, could, cpu, reading):
    from euclip_cli.data.loader import loader_reading

    assert reading in loader_reading(rate, wait, could, cpu)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_box_batch_holds_its_samples_then_one_box_of_each_and_resumes_exactly(world, pipeline_parts, workers):
    """HyCoCLIP's batches: B samples and then B boxes, each box one of its sample's, drawn afresh at each visit
    but repeated exactly by a resumed stream; samples without a box are never drawn."""
    stream = batches(world, pipeline_parts, workers=workers, batch_size=8, boxes=True)
    expected = [next(stream) for _ in range(4)]
    for images, tokens, *_ in expected:
        assert images.shape == (16, 3, 64, 64) and tokens.shape == (16, 32)
    first = batches(world, pipeline_parts, workers=workers, batch_size=8, boxes=True)
    next(first), next(first)
    resumed = batches(world, pipeline_parts, workers=workers, batch_size=8, boxes=True, start=2, state=first.state())
    for want in expected[2:]:
        got = next(resumed)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # A box's phrase is a phrase of its caption, so never longer.
    lengths = lambda t: (t != 0).sum(-1)  # noqa: E731
    assert (lengths(expected[0][1][8:]) <= lengths(expected[0][1][:8])).all()


def test_samples_without_a_box_are_left_out_of_box_batches(world, pipeline_parts):
    """A caption that only counts the shapes ("two shapes") names no object, so its sample has no box: the plain
    stream draws such samples, the box stream never does."""
    from euclip_cli.data import world as w

    counting = {tuple(pipeline_parts[1](frame.format(c=f"{w.COUNT_WORDS[n]} {'shape' if n == 1 else 'shapes'}"))[0].tolist())
                for frame in w.FRAMES for n in w.COUNT_WORDS}

    def counted(**kwargs) -> int:
        stream = batches(world, pipeline_parts, workers=0, batch_size=8, **kwargs)
        rows = [row for _ in range(25) for row in next(stream)[1][:8].tolist()]
        return sum(tuple(row) in counting for row in rows)

    assert counted() > 0 and counted(boxes=True) == 0


def test_box_batches_from_shards_without_boxes_stop_with_one_line(world, pipeline_parts, tmp_path, monkeypatch):
    """Shards with no box at all (any data but the embedded world's) would be read for ever by the box loader,
    skipping every sample: it gives up after GIVE_UP_AFTER samples in a row without one, in one line."""
    import tarfile

    import webdataset as wds

    from euclip_cli.data import loader

    monkeypatch.setattr(loader, "GIVE_UP_AFTER", 50)
    plain = tmp_path / "plain" / "train"
    plain.mkdir(parents=True)
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(world / "train" / "00000.tar") as tar:
        for member in tar.getmembers():
            key, _, ext = member.name.partition(".")
            if ext in ("jpg", "txt"):
                samples.setdefault(key, {})[ext] = tar.extractfile(member).read()
    with wds.TarWriter(str(plain / "00000.tar")) as sink:
        for key, files in list(samples.items())[:100]:
            sink.write({"__key__": key, **files})
    assert next(batches(plain.parent, pipeline_parts, workers=0))[0].shape[0] == 8  # plain batches read them
    with pytest.raises(loader.DataError, match="50 samples in a row have no box"):
        next(batches(plain.parent, pipeline_parts, workers=0, boxes=True))


def test_a_shard_opened_past_the_open_file_limit_is_the_machines_fault_not_a_bad_shard():
    """webdataset hands a shard it could not open to the loader's skip-and-count handler; out of descriptors
    (EMFILE), the shard is fine and skipping it 1,000 times would end in "the shards look unusable". It is
    raised instead, also as torch's DataLoader raises a worker's OSError again from its message alone."""
    import errno

    from torch._utils import ExceptionWrapper

    from euclip_cli.data.loader import _Counter
    from euclip_cli.errors import out_of_file_descriptors

    skips = _Counter(0)
    assert skips(OSError(errno.ENOENT, "No such file or directory", "00000.tar")) and skips.count == 1
    exhausted = OSError(errno.EMFILE, "Too many open files", "00000.tar")
    with pytest.raises(OSError) as raised:
        skips(exhausted)
    assert raised.value is exhausted and skips.count == 1
    try:
        raise exhausted
    except OSError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(OSError) as again:
        wrapped.reraise()
    assert again.value.errno is None and out_of_file_descriptors(again.value)
    assert not out_of_file_descriptors(OSError(errno.ENOENT, "No such file or directory"))
