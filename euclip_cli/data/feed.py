"""How a training batch reaches the device: one path for every device, CPU and GPU alike.

A batch arrives in the trainer's main thread as one buffer in shared memory (``loader.Batch``),
or as separate tensors (OpenCLIP's pipeline). ``DeviceFeed`` copies it into a staging slot that
was allocated once, and from there to the device:

- On a GPU the slots are page-locked, so the copy to the device runs asynchronously on a stream
  of its own; the step's stream waits for it on the device. Pageable memory could not be copied
  that way: the driver would first wait for every kernel already queued. Two slots alternate, and
  a slot is refilled only once its previous copy has finished, a wait on the copy stream alone,
  which holds nothing but copies.
- On a CPU the slot is the batch the step computes on: the same copy into a slot, with ordinary
  memory standing in for page-locked memory, so the CPU runs (and its tests check) the code a GPU
  runs up to the copy to the device itself (``Copies``).

``staging=False`` skips the slots, as OpenCLIP moves its batches: straight from shared memory with
``non_blocking=True``, which from pageable memory blocks the host until the copy is done.

Images that arrive as uint8 crops (euclip's loader) are normalised once they are on the device
(``decode.Normalization``): a quarter of the bytes to copy, and the division and subtraction that
open_clip's transform does per sample in a worker done for the whole batch by the device. A batch
of JPEGs (``data.decode=device``) is decoded, cropped and resized on the device from the host
buffer the worker filled (``decode.DeviceCrops``; nvJPEG reads its input from host memory), and only
its tokens go through a slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import torch

from euclip_cli.data.decode import DeviceCrops, Normalization
from euclip_cli.data.loader import IMAGE_DTYPES, Batch, BatchLayout

SLOTS = 2


class Fed(NamedTuple):
    """A batch on the device, with the host copy of its tokens for decisions taken on the host."""

    images: torch.Tensor
    tokens: torch.Tensor
    host_tokens: torch.Tensor


class HostCopies:
    """Staging on a CPU: ordinary memory, and the staged tensors are the device's."""

    def allocate(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(like.shape, dtype=like.dtype)

    def wait(self, done: Any) -> None:
        """Nothing is ever in flight on a CPU."""

    def to_device(self, staged: list[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
        return staged, None


class CudaCopies:
    """Staging for a GPU: page-locked slots, copied on a stream of their own."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def allocate(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)

    def wait(self, done: Optional[torch.cuda.Event]) -> None:
        if done is not None:
            done.synchronize()  # a copy on the copy stream, which holds only copies: done long ago, as a rule

    def to_device(self, staged: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.cuda.Event]:
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            on_device = [t.to(self.device, non_blocking=True) for t in staged]
            done = torch.cuda.Event()
            done.record(self.stream)
        compute.wait_stream(self.stream)  # on the device: the host goes on queueing the step
        for t in on_device:
            # Allocated on the copy stream, used on the step's: the allocator must not hand the memory
            # back to the copy stream before the step is done with it.
            t.record_stream(compute)
        return on_device, done


@dataclass
class _Slot:
    staged: list[torch.Tensor]  # the batch's buffer, or its images and tokens
    done: Any = None  # what says the slot's last copy to the device has finished
    shapes: list = field(default_factory=list)


class DeviceFeed:
    """Moves host batches to ``device`` through ``SLOTS`` staging slots (see the module's docstring).

    ``allocations`` counts the slots' allocations: as many as there are slots, in a run whose batches
    keep one shape. ``copies``: how slots are allocated and copied (default: by the device's kind).
    """

    def __init__(self, device: torch.device, staging: bool = True, copies: Any = None,
                 normalization: Optional[Normalization] = None, device_crops: Optional[DeviceCrops] = None):
        """``normalization``: what finishes uint8 crops on the device (the loader's); float images pass as they
        are. ``device_crops``: what decodes a batch of JPEGs there (the loader's, with data.decode=device)."""
        self.device, self.staging, self.normalization = device, staging, normalization
        self.device_crops = device_crops
        self.copies = copies or (CudaCopies(device) if device.type == "cuda" else HostCopies())
        self.slots: list[Optional[_Slot]] = [None] * SLOTS
        self.turn = 0
        self.allocations = 0

    def __call__(self, batch: Batch) -> Fed:
        fed = self._moved(batch)
        if fed.images.dtype == torch.uint8:
            if self.normalization is None:
                raise ValueError("a batch of uint8 crops reached a feed with no normalization to finish them")
            return fed._replace(images=self.normalization(fed.images))
        return fed

    def _moved(self, batch: Batch) -> Fed:
        if batch.jpegs is not None:
            if self.device_crops is None:
                raise ValueError("a batch of JPEGs reached a feed with nothing to decode them")
            tokens = self._moved(Batch(None, batch.tokens)).tokens if self.staging else batch.tokens.to(self.device)
            return Fed(self.device_crops(*batch.jpegs, self.device), tokens, batch.tokens)
        if not self.staging:
            return Fed(batch.images.to(self.device, non_blocking=True), batch.tokens.to(self.device, non_blocking=True),
                       batch.tokens)
        parts = ([batch.flat] if batch.flat is not None else
                 [batch.images, batch.tokens] if batch.images is not None else [batch.tokens])
        slot = self._slot(parts)
        self.copies.wait(slot.done)
        for staged, part in zip(slot.staged, parts):
            staged.copy_(part)
        on_device, slot.done = self.copies.to_device(slot.staged)
        if batch.images is None:  # the tokens alone
            return Fed(None, on_device[0], slot.staged[0])
        if batch.flat is None:
            return Fed(on_device[0], on_device[1], slot.staged[1])
        layout = BatchLayout(*batch.images.shape, batch.tokens.shape[1], IMAGE_DTYPES.index(batch.images.dtype))
        _, images, tokens = layout.views(on_device[0])
        host_tokens = tokens if on_device[0] is slot.staged[0] else layout.views(slot.staged[0])[2]
        return Fed(images, tokens, host_tokens)

    def _slot(self, parts: list[torch.Tensor]) -> _Slot:
        """This turn's slot, allocated where it is missing or does not fit ``parts``."""
        index, self.turn = self.turn, (self.turn + 1) % SLOTS
        slot = self.slots[index]
        shapes = [(t.shape, t.dtype) for t in parts]
        if slot is None or slot.shapes != shapes:
            if slot is not None:
                self.copies.wait(slot.done)  # its memory must not be freed while a copy still reads it
            slot = self.slots[index] = _Slot([self.copies.allocate(t) for t in parts], shapes=shapes)
            self.allocations += 1
        return slot
