"""OpenCLIP's own training pipeline as a source of batches for euclip's trainer (``data.pipeline = "openclip"``).

``open_clip_train.data.get_wds_dataset`` as OpenCLIP's trainer calls it with ``--dataset-resampled``:
shards drawn with replacement, its 5,000-sample shuffle buffer, decoding and batching in its workers,
two tensors a batch handed over by torch's DataLoader, nothing pinned. Beside euclip's loader it
separates the data path from the step: one run of each on a GPU says which of the two sets the pace.

What it does not have: an exact position (a resumed run starts its streams afresh, and says so),
counts of unreadable samples (OpenCLIP logs and skips them), and what each batch cost its loader.
"""

from __future__ import annotations

import functools
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch

from euclip_cli.data.loader import Batch, WithoutPosition, leave_stop_signals_to_the_trainer


def openclip_compatible() -> None:
    """Let open_clip_train 3.3's pipeline read past the end of a shard with the pinned webdataset.

    webdataset 0.2.111 marks each shard's end with an empty sample, which open_clip_train's own
    grouping of tar members reads as a member and fails on (``KeyError: 'fname'``); webdataset's
    ``eof_value=None`` turns the marker off, as webdataset did before it had one. In place in the
    module, so that the workers forked from this process inherit it.
    """
    import webdataset.tariterators
    from open_clip_train import data

    data.tar_file_expander = functools.partial(webdataset.tariterators.tar_file_expander, eof_value=None)


class OpenCLIPBatches(WithoutPosition):
    """OpenCLIP's pipeline with the interface of ``loader.TrainBatches``, for one rank.

    ``samples``: the samples one epoch of it yields across ranks (OpenCLIP's ``--train-num-samples``);
    when they are used up a new epoch starts, as OpenCLIP's trainer starts one.
    """

    def __init__(self, shards: list[str], batch_size: int, transform: Callable, tokenizer: Callable, seed: int,
                 workers: int, rank: int, world: int, samples: int):
        from open_clip_train.data import get_wds_dataset

        openclip_compatible()
        args = SimpleNamespace(train_data="::".join(shards), train_num_samples=samples, dataset_resampled=True,
                               train_data_upsampling_factors=None, seed=seed, batch_size=batch_size,
                               world_size=world, workers=workers)
        self.info = get_wds_dataset(args, transform, is_train=True, epoch=0, tokenizer=tokenizer)
        # The trainer owns stop signals, as with euclip's loader (``leave_stop_signals_to_the_trainer``).
        self.info.dataloader.worker_init_fn = leave_stop_signals_to_the_trainer
        self.folder = Path(shards[0]).parent
        self.seed, self.rank, self.epoch = seed, rank, 0
        self._iter = self._start()
        # Workers that ignore SIGTERM would hold the interpreter's exit, and an iterator's own shutdown, left
        # to its garbage collection, swallows a Ctrl-C that arrives while it waits for them: shut them down
        # in order, at close() or at exit.
        self._close = weakref.finalize(self, _shutdown, self.info.dataloader)

    def _start(self):
        # OpenCLIP seeds each rank apart (its random_seed(seed, rank)); its workers' streams follow from
        # the generator's state when the loader starts them, so that state is set here, and put back.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + self.rank)
            return iter(self.info.dataloader)

    def __next__(self) -> Batch:
        try:
            images, tokens = next(self._iter)
        except StopIteration:
            self.epoch += 1
            self.info.set_epoch(self.epoch)
            self._iter = self._start()
            images, tokens = next(self._iter)
        return Batch(images, tokens)

    def close(self) -> None:
        """Stop the loader's worker processes (also done at exit)."""
        self._close()


def _shutdown(loader) -> None:
    """Stop the persistent workers of the torch DataLoader in OpenCLIP's ``loader``: a webdataset WebLoader,
    a pipeline whose stages hold it (its one iterator holds the workers)."""
    for stage in getattr(loader, "pipeline", [loader]):
        iterator = getattr(stage, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
