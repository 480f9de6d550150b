"""The training loader: img2dataset-format shards, sampled with replacement, with an exact position.

DataComp draws shards with replacement (``--dataset-resampled``), so the budget is counted
in samples seen, never epochs. Undecodable samples and unreadable shards are skipped and
counted, not fatal, until ``GIVE_UP_AFTER`` in a row: then the data are unusable and training stops.

The stream is a pure function of (seed, rank, step), so a run killed at any step and resumed
from its checkpoint sees the very batches an uninterrupted run sees:

- Global batch ``n`` of a rank is produced by logical worker ``n % workers``. Each logical
  worker's stream restarts with a fresh seed at every *segment* (``segment_steps`` batches,
  ``SEGMENT_BUFFERS`` shuffle buffers' worth, whatever the checkpoint interval), so resuming at
  a segment boundary replays nothing.
- Inside a segment every batch reports how many raw samples its worker has drawn; the
  checkpoint keeps that, and a resume mid-segment re-reads (without decoding) that many
  samples. Augmentation is seeded per batch, so skipped samples cost no RNG state.

Every batch also reports what it cost the loader that made it (``LoaderWork``), so a trainer
waiting for data can tell loaders that are too few or too slow from loaders starved of CPU.

A batch crosses from its worker as one buffer (``BatchLayout``): a header, the images (uint8 crops,
normalised on the device: ``decode``) and the tokens, stacked straight into one block of shared
memory. Each tensor a worker hands over is one
round trip with it for the trainer's process (a file descriptor fetched from the worker, which
must interrupt its decoding to answer), so one buffer is one such trip a batch; the trainer then
copies it to the device in one copy (``euclip_cli.data.feed``). Nothing in the trainer's process
receives batches but its main thread: the DataLoader's ``pin_memory`` thread, which would, contends
with a busy main thread for the interpreter lock (pytorch/pytorch#77139).

webdataset supplies the shard resampling, tar reading and shuffle buffer; decoding and
batching are written here because webdataset's stages do not expose the raw-sample count
the position needs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import random
import signal
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Optional

import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from euclip_cli.data.decode import (CropDecoder, DecodeOn, Decoder, Deferred, DeferredCrop, DeviceCrops,
                                   Normalization)
from euclip_cli.device import is_out_of_memory
from euclip_cli.errors import UsageError, out_of_file_descriptors
from euclip_cli.workers import make_room_for_workers

IMAGE_KEYS = ("jpg", "png", "webp", "jpeg")


class DataError(UsageError):
    """The training data is missing or unusable; the message says what to run."""


def list_shards(folder: Path, download_hint: str) -> list[str]:
    if folder.exists() and not folder.is_dir():
        raise DataError(f"training data folder {folder} is a file: give the folder that holds the shards (*.tar)")
    if not folder.is_dir():
        raise DataError(f"training data folder {folder} does not exist: run '{download_hint}' first")
    shards = sorted(str(p) for p in folder.glob("*.tar"))
    if not shards:
        raise DataError(f"no training shards (*.tar) in {folder}: run '{download_hint}' first")
    return shards


def shards_for_rank(shards: list[str], rank: int, world: int) -> list[str]:
    """Each rank resamples from its own disjoint slice when there are enough shards to go round."""
    return shards[rank::world] if len(shards) >= world else shards


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every part (stable across processes and Python versions)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class WorkerPosition:
    """Where one logical worker's stream stands after the last batch the trainer consumed."""
    segment: int = -1
    raw: int = 0  # raw samples drawn in ``segment``, decoded or skipped
    skipped: int = 0  # bad samples and shards since the start of the run


# Bad samples or shards in a row after which a stream gives up: shards from which nothing decodes
# would otherwise be resampled forever, and the run would never reach its first step.
GIVE_UP_AFTER = 1000


class _GiveUp(Exception):
    """Raised through webdataset's pipeline when ``GIVE_UP_AFTER`` reads in a row have failed."""


class _Counter:
    """A webdataset error handler: skip the bad shard or sample and count it; give up after
    ``GIVE_UP_AFTER`` failures with no good sample between them."""

    def __init__(self, start: int):
        self.count, self.in_a_row, self.last = start, 0, ""

    def __call__(self, exn: Exception) -> bool:
        if is_out_of_memory(exn) or out_of_file_descriptors(exn):
            raise exn  # the machine's state, not the shard's (a shard opened past `ulimit -n`): the CLI says so
        self.count += 1
        self.in_a_row += 1
        self.last = f"{type(exn).__name__}: {exn}".splitlines()[0][:200]
        if self.in_a_row >= GIVE_UP_AFTER:
            raise _GiveUp(f"{self.in_a_row} samples or shards in a row could not be read (the last: {self.last})")
        return True

    def good(self) -> None:
        self.in_a_row = 0


@dataclass(frozen=True)
class LoaderWork:
    """What making a number of batches cost the loaders that made them.

    ``wall_s`` is the time from a loader starting on a batch to handing it over, summed over the
    batches: a worker's time spent waiting to be asked for its next batch is not in it, nor the
    handing over itself (the batch is already in shared memory; its handles go through a queue).
    ``cpu_s`` is the CPU time its loading thread used in those spans: well below ``wall_s``, the
    loader was kept from the CPU (by other processes, or its own blocking reads).
    """

    batches: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def plus(self, wall_s: float, cpu_s: float) -> "LoaderWork":
        return LoaderWork(self.batches + 1, self.wall_s + wall_s, self.cpu_s + cpu_s)

    def record(self, streams: int, batch_size: int) -> dict:
        """The fields a training record carries: the mean time a loader took to make a batch of
        ``batch_size``, the rate ``streams`` loaders at that pace would deliver if never kept waiting
        to be asked, and their CPU share. ``{}`` when no batch was made."""
        if not self.batches or self.wall_s <= 0:
            return {}
        batch_s = self.wall_s / self.batches
        return {"loader_batch_s": batch_s, "loader_samples_per_s": streams * batch_size / batch_s,
                "loader_cpu_share": self.cpu_s / self.wall_s}


# Where a trainer waits for data at least this share of its time, the loaders are read as its limit;
# loaders that could give this many times its rate are fast enough, and a CPU share below this
# means they were kept from the CPU. Judgement, not measurement: the readings in between are mixed.
WAIT_BOUND, FAST_ENOUGH, STARVED_BELOW = 0.2, 2.0, 0.7


def loader_reading(samples_per_s: float, data_wait_share: float, loader_samples_per_s: float,
                   loader_cpu_share: float) -> str:
    """What a trainer's rate, its wait for data and its loaders' ``LoaderWork`` fields say, in words."""
    if data_wait_share < WAIT_BOUND:
        return "the loaders keep up"
    if loader_samples_per_s >= FAST_ENOUGH * samples_per_s:
        return "the loaders could give more: batches are lost between the loaders and the step"
    if loader_cpu_share < STARVED_BELOW:
        return "the loaders are kept from the CPU (by other processes or threads, or blocking reads)"
    return "the loaders are too few or too slow: more data.workers"


class Batch(NamedTuple):
    """One training batch on the host: ``images (B, 3, H, W)`` and ``tokens (B, L)`` int64, and, where both
    are views of one buffer (euclip's loader), that buffer, which crosses to a device whole. The images
    are uint8 crops where the loader hands them over before normalising (``decode.CropDecoder``; the
    feed normalises them on the device), else float32 as a transform leaves them. With
    ``data.decode=device`` there are no images yet: ``jpegs`` holds each sample's compressed bytes (a
    1-D uint8 view of the buffer) and its crop, for the feed to decode on the device. A box loader's batch
    (HyCoCLIP's) holds its B samples and then one box of each: 2B images and 2B token rows."""

    images: Optional[torch.Tensor]
    tokens: torch.Tensor
    flat: Optional[torch.Tensor] = None
    jpegs: Optional[tuple[list[torch.Tensor], list[tuple[int, int, int, int]]]] = None

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


# int64 words before the images in a batch's buffer: the layout (B, C, H, W, L, image dtype, JPEG bytes)
# and the batch's info.
HEADER_WORDS = 16
LAYOUT_WORDS = 7
# The image dtypes a buffer can hold, by the code its header records; the code after them marks a batch
# of JPEGs to decode on the device (``ENCODED``).
IMAGE_DTYPES = (torch.float32, torch.uint8)
ENCODED = len(IMAGE_DTYPES)
INDEX_WORDS = 6  # per JPEG of an encoded batch: offset, length, and the crop's top, left, height, width
ALIGN = 64  # bytes: each part starts on a cache line, so every view is aligned for its dtype


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclass(frozen=True)
class BatchLayout:
    """Where the parts of a batch lie in its one buffer (``uint8``): the header (int64 words: the
    layout, then the batch's info), the images (``(B, C, H, W)`` of ``IMAGE_DTYPES[image_dtype]``), the
    tokens (int64, ``(B, L)``)."""

    batch: int
    channels: int
    height: int
    width: int
    context: int
    image_dtype: int = 0  # an index into IMAGE_DTYPES, or ENCODED
    jpeg_bytes: int = 0  # an encoded batch's compressed images, all together

    @property
    def dtype(self) -> torch.dtype:
        return IMAGE_DTYPES[self.image_dtype] if self.image_dtype != ENCODED else torch.int64

    @property
    def image_bytes(self) -> int:
        """The images' part: the pixels, or an encoded batch's index and then its JPEGs' bytes."""
        if self.image_dtype == ENCODED:
            return 8 * INDEX_WORDS * self.batch + self.jpeg_bytes
        return self.dtype.itemsize * self.batch * self.channels * self.height * self.width

    @property
    def nbytes(self) -> int:
        return 8 * HEADER_WORDS + _aligned(self.image_bytes) + 8 * self.batch * self.context

    def views(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(header (HEADER_WORDS,), images, tokens)``, views of ``flat`` (on any device)."""
        start = 8 * HEADER_WORDS
        images_end = start + self.image_bytes
        tokens_start = start + _aligned(self.image_bytes)
        if self.image_dtype == ENCODED:
            images = flat[start:start + 8 * INDEX_WORDS * self.batch].view(torch.int64).view(self.batch, INDEX_WORDS)
        else:
            images = flat[start:images_end].view(self.dtype).view(self.batch, self.channels, self.height, self.width)
        return (flat[:start].view(torch.int64), images,
                flat[tokens_start:self.nbytes].view(torch.int64).view(self.batch, self.context))

    def jpegs(self, flat: torch.Tensor) -> tuple[list[torch.Tensor], list[tuple[int, int, int, int]]]:
        """An encoded batch's JPEGs (1-D uint8 views of ``flat``) and their crops."""
        index = self.views(flat)[1].tolist()
        data = flat[8 * HEADER_WORDS + 8 * INDEX_WORDS * self.batch:]
        return [data[offset:offset + length] for offset, length, *_ in index], [tuple(row[2:]) for row in index]

    @classmethod
    def of(cls, flat: torch.Tensor) -> "BatchLayout":
        """The layout a host buffer's header records."""
        return cls(*(int(v) for v in flat[:8 * LAYOUT_WORDS].view(torch.int64)))


def pack(images: list, tokens: list[torch.Tensor], shared: bool, size: tuple[int, int] = (0, 0)
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples' tensors stacked into one new buffer (in shared memory where ``shared``, as a worker
    hands it over; a tensor made elsewhere would be copied there once more). Returns the buffer and
    its header, for the caller to fill in the batch's info after the layout's words. ``images`` may be
    ``decode.Deferred`` samples instead, JPEGs to crop to ``size`` on the device."""
    if isinstance(images[0], Deferred):
        return _pack_jpegs(images, tokens, shared, size)
    if images[0].dtype not in IMAGE_DTYPES or tokens[0].dtype != torch.int64:
        raise TypeError(f"a batch packs float32 or uint8 images and int64 tokens, not {images[0].dtype} and "
                        f"{tokens[0].dtype}")
    layout = BatchLayout(len(images), *images[0].shape, tokens[0].shape[0], IMAGE_DTYPES.index(images[0].dtype))
    flat = _new_buffer(layout.nbytes, shared)
    header, image_view, token_view = layout.views(flat)
    torch.stack(images, out=image_view)
    torch.stack(tokens, out=token_view)
    header.zero_()
    header[:LAYOUT_WORDS] = torch.tensor(dataclasses.astuple(layout))
    return flat, header


def _new_buffer(nbytes: int, shared: bool) -> torch.Tensor:
    if shared:
        return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))
    return torch.empty(nbytes, dtype=torch.uint8)


def _pack_jpegs(samples: list[Deferred], tokens: list[torch.Tensor], shared: bool,
                size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = [len(s.data) for s in samples]
    layout = BatchLayout(len(samples), 3, *size, tokens[0].shape[0], ENCODED, sum(lengths))
    flat = _new_buffer(layout.nbytes, shared)
    header, index, token_view = layout.views(flat)
    offsets = [0, *itertools.accumulate(lengths)][:-1]
    index.copy_(torch.tensor([[o, n, *s.crop] for o, n, s in zip(offsets, lengths, samples)]))
    data = flat[8 * HEADER_WORDS + 8 * INDEX_WORDS * len(samples):]
    for offset, sample in zip(offsets, samples):
        data[offset:offset + len(sample.data)] = torch.frombuffer(bytearray(sample.data), dtype=torch.uint8)
    torch.stack(tokens, out=token_view)
    header.zero_()
    header[:LAYOUT_WORDS] = torch.tensor(dataclasses.astuple(layout))
    return flat, header


def unpack(flat: torch.Tensor) -> tuple[Batch, list[int]]:
    """A host buffer as a ``Batch`` of views, and the info its header carries."""
    layout = BatchLayout.of(flat)
    header, images, tokens = layout.views(flat)
    info = header[LAYOUT_WORDS:LAYOUT_WORDS + INFO_WORDS].tolist()
    if layout.image_dtype == ENCODED:
        return Batch(None, tokens, flat, layout.jpegs(flat)), info
    return Batch(images, tokens, flat), info


# The info each batch carries: [logical worker, segment, raw samples drawn in segment, skipped so far,
# wall µs, CPU µs], the last two what making the batch cost (``LoaderWork``).
INFO_WORDS = 6


class TrainStream(IterableDataset):
    """Yields each batch of one rank, from global batch ``start`` on, as one buffer (``pack``) whose
    header carries the batch's info (``INFO_WORDS``)."""

    def __init__(self, shards: list[str], batch_size: int, decode: Callable[[bytes], torch.Tensor], tokenizer: Callable,
                 seed: int, rank: int, shuffle_buffer: int, segment_steps: int, workers: int, start: int,
                 positions: dict[int, WorkerPosition], caption: Callable[[dict], str], size: tuple[int, int] = (0, 0),
                 boxes: bool = False):
        """``decode``: a sample's stored image bytes -> its training tensor (``decode.CropDecoder``), or the
        JPEG and its crop (``decode.DeferredCrop``), cropped to ``size`` on the device. ``boxes``: each
        sample also gives one of its boxes (``box_of``), and a batch holds its B samples' images and then
        their B box images, its B captions and then their B box phrases."""
        super().__init__()
        self.size, self.boxes = size, boxes
        self.shards, self.batch_size, self.decode, self.tokenizer = shards, batch_size, decode, tokenizer
        self.caption = caption
        self.seed, self.rank, self.shuffle_buffer = seed, rank, shuffle_buffer
        self.segment_steps, self.workers, self.start, self.positions = segment_steps, max(1, workers), start, positions

    def __iter__(self):
        info = get_worker_info()
        physical = info.id if info is not None else 0
        # The DataLoader serves workers round-robin from physical 0, so physical 0 must play the
        # logical worker that owns batch ``start``.
        logical = (physical + self.start) % self.workers
        n = self.start + (logical - self.start) % self.workers
        position = self.positions.get(logical, WorkerPosition())
        skips = _Counter(position.skipped)
        try:
            while True:
                segment = n // self.segment_steps
                resume_raw = position.raw if position.segment == segment else 0
                for flat in self._segment(segment, logical, resume_raw, skips, shared=info is not None):
                    yield flat
                    n += self.workers
                    if n // self.segment_steps != segment:
                        break
        except _GiveUp as err:
            # A message, not an exception: a DataLoader worker's exception reaches the trainer
            # wrapped in a traceback; the message reaches it as it is.
            yield str(err)

    def _segment(self, segment: int, logical: int, resume_raw: int, skips: _Counter, shared: bool):
        seed = derive_seed(self.seed, self.rank, segment, logical)
        raw_samples = wds.DataPipeline(
            wds.ResampledShards(self.shards, seed=seed, worker_seed=lambda: 0, deterministic=True),
            wds.tarfile_to_samples(handler=skips),
            wds.shuffle(self.shuffle_buffer, initial=self.shuffle_buffer, rng=random.Random(seed)),
        )
        batch_start, rng_state = resume_raw, None
        images, tokens, box_images, box_tokens = [], [], [], []
        boxless = 0  # samples in a row without a box: shards with none would be read for ever
        # The thread's own CPU clock: a worker's other thread (multiprocessing's resource sharer) is idle.
        started, cpu_started = time.perf_counter(), time.thread_time()
        for raw, sample in enumerate(raw_samples, start=1):
            if raw <= resume_raw:
                continue
            try:
                image_key = next(k for k in IMAGE_KEYS if k in sample)
                if self.boxes and not box_count(sample):
                    boxless += 1
                    if boxless >= GIVE_UP_AFTER:
                        raise _GiveUp(f"{boxless} samples in a row have no box (numparents.txt): loss.kind=hycoclip "
                                      f"trains on shards with boxes, which the embedded world writes")
                    continue  # a sample without a box: HyCoCLIP's preparation drops it (not data loss)
                boxless = 0
                if rng_state is None:
                    # Augmentation is seeded per batch, from the raw position it starts at, so a
                    # resume (always at a batch boundary) needs no RNG state. Private to the loader:
                    # the trainer's own generator is saved and restored around the batch.
                    rng_state = torch.get_rng_state()
                    torch.manual_seed(derive_seed(seed, batch_start))
                caption = self.caption(sample)
                pixels = self.decode(sample[image_key])
                text = self.tokenizer(caption)[0]
                if self.boxes:
                    box_jpeg, phrase = box_of(sample)
                    box_pixels, box_text = self.decode(box_jpeg), self.tokenizer(phrase)[0]
            except _GiveUp:
                raise
            except Exception as err:  # any undecodable or incomplete sample is data loss, not a crash
                if is_out_of_memory(err) or out_of_file_descriptors(err):
                    raise  # the machine's state, not the sample's: the trainer or the CLI says so
                skips(err)
                continue
            skips.good()
            images.append(pixels)
            tokens.append(text)
            if self.boxes:
                box_images.append(box_pixels)
                box_tokens.append(box_text)
            if len(images) == self.batch_size:
                torch.set_rng_state(rng_state)
                flat, header = pack(images + box_images, tokens + box_tokens, shared, self.size)
                wall_us = round((time.perf_counter() - started) * 1e6)
                cpu_us = round((time.thread_time() - cpu_started) * 1e6)
                header[LAYOUT_WORDS:LAYOUT_WORDS + INFO_WORDS] = torch.tensor(
                    [logical, segment, raw, skips.count, wall_us, cpu_us])
                yield flat
                started, cpu_started = time.perf_counter(), time.thread_time()
                batch_start, rng_state = raw, None
                images, tokens, box_images, box_tokens = [], [], [], []


def box_count(sample: dict) -> int:
    """How many boxes a sample carries (HyCoCLIP's ``numparents.txt``; none where the file is absent)."""
    return int(sample["numparents.txt"]) if "numparents.txt" in sample else 0


def box_of(sample: dict) -> tuple[bytes, str]:
    """One of a sample's boxes, drawn uniformly as HyCoCLIP's ``GroundedDatasetTarMapper`` draws it, from torch's
    generator (seeded per batch, so a resume draws the same): its crop's JPEG and its phrase."""
    pick = int(torch.randint(box_count(sample), ()))
    return sample[f"parent{pick:03d}.jpg"], sample[f"parent{pick:03d}.txt"].decode("utf-8")


def stored_caption(sample: dict) -> str:
    """A sample's caption as its shard stores it (``txt``)."""
    return sample["txt"].decode("utf-8")


# What stops a trainer at the end of its step, with a checkpoint: SIGTERM (a preemption, a kill),
# SIGINT (Ctrl-C) and SIGUSR2 (submitit's warning of a SLURM time limit, which SLURM sends to every
# process of the job, the study job's trainer included; its default action would kill it unsaved).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)


def leave_stop_signals_to_the_trainer(_worker_id: int) -> None:
    """Loader workers ignore the stop signals. SLURM's preemption warning and a Ctrl-C reach every
    process of the job or terminal, workers included; a worker killed by it would break the step the
    trainer is finishing before it checkpoints. Workers still exit with the trainer (the DataLoader
    shuts them down, and each watches its parent)."""
    import threading

    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)
    # A stopped trainer can leave while a worker hands it a batch's buffer (torch's file_descriptor sharing
    # serves each from a thread of the worker's): that handover's broken pipe is the stop, not a fault to print.
    threading.excepthook = _quiet_when_the_trainer_left


def _quiet_when_the_trainer_left(args) -> None:
    import threading

    if not issubclass(args.exc_type, (BrokenPipeError, ConnectionResetError)):
        threading.__excepthook__(args)


# A stream restarts, refilling its shuffle buffer, once a segment, and a resume replays (reads
# without decoding) what its segment had read so far. A segment of this many shuffle buffers'
# worth of samples per stream keeps the refills' reading a small share of the whole, and a resume's
# replay under that many buffers: segments are not tied to checkpoints, which may come often.
SEGMENT_BUFFERS = 16


def segment_steps_for(batch_size: int, shuffle_buffer: int, workers: int) -> int:
    """Global batches of one rank per segment: ``SEGMENT_BUFFERS`` shuffle buffers per stream (at
    least one batch), for each of ``max(1, workers)`` streams."""
    per_stream = max(1, math.ceil(SEGMENT_BUFFERS * shuffle_buffer / batch_size))
    return per_stream * max(1, workers)


class TrainBatches:
    """The trainer's endless batch iterator; ``state()`` is the position to checkpoint."""

    def __init__(self, shards: list[str], batch_size: int, transform: Callable, tokenizer: Callable, seed: int,
                 shuffle_buffer: int, segment_steps: int, workers: int = 0, rank: int = 0, world: int = 1,
                 start: int = 0, state: dict | None = None, sharing: str = "file_descriptor",
                 caption: Callable[[dict], str] = stored_caption, decoder: Decoder = "pil",
                 decode_on: DecodeOn = "workers", boxes: bool = False):
        """``segment_steps``: global batches between restarts of the streams (``segment_steps_for``).
        ``sharing``: how workers hand their buffers over (torch.multiprocessing's sharing strategy,
        set for the whole process): ``file_descriptor`` (torch's default) passes each buffer's file
        descriptor through a handshake that the worker serves; ``file_system`` names the buffer in
        /dev/shm instead, with no handshake, at the risk of files left behind by a killed process.
        ``caption``: a sample's caption from its raw entries (a caption augmentation draws from torch's
        generator, which is seeded per batch, so a resume repeats it exactly). ``decoder``: how an image
        becomes its crop (``decode.DECODERS``); ``normalization`` is then what finishes the crops on the
        device (None where the transform's float output is handed over). ``decode_on``: ``device`` hands
        over JPEGs and their crops for the feed to decode there (``device_crops``). ``boxes``: each batch
        holds B samples and then one box of each (``TrainStream``), 2B images and 2B token rows."""
        self.signature = {"workers": max(1, workers), "world": world, "segment_steps": segment_steps}
        self.folder = Path(shards[0]).parent  # list_shards never returns an empty list
        # A position from another process layout describes other streams; start those afresh.
        usable = state is not None and state.get("signature") == self.signature
        self.positions = {int(k): WorkerPosition(**v) for k, v in state["workers"].items()} if usable else {}
        self.resumed_exactly = usable or start == 0
        self.work = LoaderWork()
        decode = CropDecoder(transform, decoder) if decode_on == "workers" else DeferredCrop(transform)
        self.normalization = decode.normalization
        self.device_crops = DeviceCrops(transform) if decode_on == "device" else None
        size = tuple(decode.crop.size) if decode.crop is not None else (0, 0)
        dataset = TrainStream(shards_for_rank(shards, rank, world), batch_size, decode, tokenizer, seed, rank,
                              shuffle_buffer, segment_steps, workers, start, dict(self.positions), caption, size, boxes)
        self._close = lambda: None
        if workers == 0:
            self._iter = iter(dataset)
        else:
            make_room_for_workers(workers, "data.workers")
            torch.multiprocessing.set_sharing_strategy(sharing)
            # No pin_memory: its thread would receive every batch beside the trainer's main thread
            # (the module's docstring); the trainer pins in its own feed.
            self._iter = iter(DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=True,
                                         prefetch_factor=2, worker_init_fn=leave_stop_signals_to_the_trainer))
            # Workers ignore SIGTERM, so the interpreter's exit, which stops leftover daemon processes
            # by SIGTERM and then waits for them, would wait forever: shut them down in order
            # instead, at close() or at exit, whichever comes first (what the iterator's __del__ does).
            self._close = weakref.finalize(self, type(self._iter)._shutdown_workers, self._iter)

    def close(self) -> None:
        """Stop the loader's worker processes (also done at exit)."""
        self._close()

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        item = next(self._iter)
        if isinstance(item, str):
            raise DataError(f"the training shards in {self.folder} look unusable: {item}; check them (or download "
                            f"them again) and rerun")
        batch, (logical, segment, raw, skipped, wall_us, cpu_us) = unpack(item)
        self.positions[logical] = WorkerPosition(segment, raw, skipped)
        self.work = self.work.plus(wall_us / 1e6, cpu_us / 1e6)
        return batch

    def take_work(self) -> LoaderWork:
        """What the batches taken since the last call cost their loaders; starts a new count."""
        work, self.work = self.work, LoaderWork()
        return work

    @property
    def skipped(self) -> int:
        return sum(p.skipped for p in self.positions.values())

    def state(self) -> dict:
        return {"signature": self.signature,
                "workers": {str(k): vars(p).copy() for k, p in sorted(self.positions.items())}}


class WithoutPosition:
    """The part of ``TrainBatches``' interface a source of batches without euclip's position has
    (OpenCLIP's pipeline, one batch repeated): a resume starts it afresh, it counts no unreadable
    samples, and what its batches cost is not known."""

    resumed_exactly = False
    skipped = 0
    normalization: Optional[Normalization] = None  # batches come as float32, normalised
    device_crops: Optional[DeviceCrops] = None

    def __iter__(self) -> Iterator[Batch]:
        return self

    def take_work(self) -> LoaderWork:
        return LoaderWork()

    def state(self) -> Optional[dict]:
        return None


class RepeatBatches(WithoutPosition):
    """The first batch of ``source`` again and again (``data.pipeline = "repeat"``): the trainer's pace
    with the loaders taken out, its batches still fed to the device. For timing the step (the GPU
    checklist); a run trained on it has seen one batch."""

    def __init__(self, source: TrainBatches):
        self.folder, self.normalization, self.device_crops = source.folder, source.normalization, source.device_crops
        try:
            self.batch = next(source)
        finally:
            source.close()

    def __next__(self) -> Batch:
        return self.batch

    def close(self) -> None:
        """Its loader was closed after the one batch."""

