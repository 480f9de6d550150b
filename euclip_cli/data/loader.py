"""The training loader: webdataset over img2dataset-format shards, sampled with replacement.

DataComp draws shards with replacement (``--dataset-resampled``), so the budget is counted
in samples seen, never epochs. Undecodable samples and unreadable shards are skipped and
counted, not fatal.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Iterator

import torch
import webdataset as wds


class DataError(Exception):
    """The training data is missing or unusable; the message says what to run."""


def list_shards(folder: Path, download_hint: str) -> list[str]:
    if not folder.is_dir():
        raise DataError(f"training data folder {folder} does not exist: run '{download_hint}' first")
    shards = sorted(str(p) for p in folder.glob("*.tar"))
    if not shards:
        raise DataError(f"no training shards (*.tar) in {folder}: run '{download_hint}' first")
    return shards


class SkipCounter:
    """A webdataset error handler that skips the bad sample or shard and counts it."""

    def __init__(self):
        self.skipped = 0

    def __call__(self, exn: Exception) -> bool:
        self.skipped += 1
        return True


def train_batches(shards: list[str], batch_size: int, transform: Callable, tokenizer: Callable,
                  seed: int, shuffle_buffer: int, skips: SkipCounter,
                  workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """An endless stream of ``(images (B, 3, H, W), tokens (B, L))`` batches.

    With ``workers > 0`` decoding runs in that many processes, each drawing its own
    resampled stream (webdataset seeds each worker from ``seed`` and its worker id);
    skips in worker processes are not counted in ``skips``.
    """
    pipeline = wds.DataPipeline(
        wds.ResampledShards(shards, seed=seed, deterministic=True),
        wds.tarfile_to_samples(handler=skips),
        wds.shuffle(shuffle_buffer, initial=shuffle_buffer, rng=random.Random(seed)),
        wds.decode("pilrgb", handler=skips),
        wds.to_tuple("jpg;png;webp;jpeg", "txt", handler=skips),
        wds.map_tuple(transform, lambda text: tokenizer(text)[0], handler=skips),
        wds.batched(batch_size, partial=False),
    )
    if workers == 0:
        return iter(pipeline)
    return iter(wds.WebLoader(pipeline, batch_size=None, num_workers=workers, persistent_workers=True,
                              prefetch_factor=2))
