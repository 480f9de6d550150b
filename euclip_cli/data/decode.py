"""A training image from its stored bytes: decoded, randomly cropped and resized.

This is the loader's work per sample, and on DataComp's 512-px JPEGs the bulk of a GPU node's host
time (``euclip bench decode`` measures its parts; docs/speed.md). Two choices make it cheaper
than OpenCLIP's path without changing what the model sees:

- **The crop leaves the worker as bytes.** open_clip's training transform ends by turning the crop
  into floats and normalising it: ``ToTensor`` (``x / 255``) and ``Normalize`` (``(x - mean) / std``),
  a sixth of a sample's CPU time at 224 px, and four times the bytes to hand over and copy to the
  device. ``CropDecoder`` stops at the ``uint8`` crop; ``Normalization`` applies the same two steps
  on the device, with the same floating-point operations in the same order, so the result is
  bitwise the transform's.
- **The decoder** (``DECODERS``): ``pil`` decodes the whole image with PIL and crops and resizes it
  with the transform's own ``RandomResizedCrop``, OpenCLIP's path. ``pil-draft`` draws the crop
  first, from the image's size alone (``RandomResizedCrop.get_params``: the same draws from the same
  generator as the transform's own), then has libjpeg decode at the smallest of 1/2, 1/4 and 1/8
  scale that still leaves the crop at least as large as the output (PIL's draft mode: the scaling
  happens inside the inverse DCT, so the pixels skipped are never computed), and resizes the crop
  from there with PIL's box resize. Where no reduction keeps the crop that large (at 224 px, a
  512-px photo's crop is reduced only when its short side is 448 px or more), or the image is not a
  JPEG, it takes exactly the ``pil`` path. Where it reduces, its pixels differ from ``pil``'s by the
  two resamplings' difference.

A transform that is not open_clip's training transform (crop, RGB, to tensor, normalise) is run
whole in the worker, and its float output handed over as it is (``normalization`` is then None).

**Decoding on the device** (``data.decode=device``) splits the work: a worker only reads the JPEG's
size from its header, draws the crop from it (the same draws as the transform's) and hands over the
compressed bytes with the crop (``DeferredCrop``); the trainer's process decodes the whole batch on the
device (``torchvision.io.decode_jpeg``: nvJPEG on a GPU, libjpeg-turbo on a CPU) and crops and resizes
each image there with torchvision's antialiased tensor resize, rounded to uint8 (``DeviceCrops``). The
same code runs on a CPU. Its crops differ from the worker path's by the two resize implementations'
difference (PIL's against torchvision's; ``euclip bench decode`` measures it as ``torchvision-io``).
It takes JPEGs only (DataComp's, RedCaps' and the world's images all are); a sample that is not one,
or whose bytes stop before the JPEG's end-of-image marker, is skipped and counted in the worker.
"""

from __future__ import annotations

import io
import math
from typing import Callable, Literal, NamedTuple, Optional

import numpy as np
import torch
from PIL import Image

Decoder = Literal["pil", "pil-draft"]
DECODERS: tuple[str, ...] = ("pil", "pil-draft")
DecodeOn = Literal["workers", "device"]
JPEG_END = b"\xff\xd9"  # the end-of-image marker
# libjpeg's DCT scalings that PIL's draft mode asks for, the largest reduction first.
DRAFT_REDUCTIONS = (8, 4, 2)


def draft_reduction(crop_h: int, crop_w: int, out_h: int, out_w: int) -> int:
    """The largest of ``DRAFT_REDUCTIONS`` by which a ``crop_h x crop_w`` crop can shrink and still be at
    least ``out_h x out_w`` (so that the final resize never enlarges); 1 when none can."""
    for reduction in DRAFT_REDUCTIONS:
        if crop_h // reduction >= out_h and crop_w // reduction >= out_w:
            return reduction
    return 1


class Normalization:
    """torchvision's ``ToTensor`` and ``Normalize`` for a batch of ``uint8`` crops, on any device."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        self.mean, self.std = tuple(mean), tuple(std)
        # Per device, made once: a tensor built from Python numbers on a GPU is a copy the host waits for.
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __eq__(self, other) -> bool:
        return isinstance(other, Normalization) and (self.mean, self.std) == (other.mean, other.std)

    def __repr__(self) -> str:
        return f"Normalization(mean={self.mean}, std={self.std})"

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` uint8 -> float32, as ``Normalize(ToTensor(crop))`` gives for each crop: the same
        operations in the same order (convert, divide by 255, subtract the mean, divide by the std)."""
        if images.device not in self._constants:
            self._constants[images.device] = tuple(
                torch.tensor(v, dtype=torch.float32).view(-1, 1, 1).to(images.device) for v in (self.mean, self.std))
        mean, std = self._constants[images.device]
        return images.to(torch.float32).div(255).sub_(mean).div_(std)


def crop_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image as a ``(3, H, W)`` uint8 tensor (``ToTensor``'s layout, before its division): a
    channels-last view, made contiguous by the one copy that stacks it into its batch's buffer."""
    return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)


class CropDecoder:
    """Stored image bytes -> a training crop by ``decoder`` (``DECODERS``): a ``(3, H, W)`` uint8 tensor
    for ``normalization`` to finish, or, for a transform that is not open_clip's training transform,
    that transform's float output (``normalization`` None)."""

    def __init__(self, transform: Callable, decoder: Decoder = "pil"):
        from torchvision import transforms as T

        if decoder not in DECODERS:
            raise ValueError(f"decoder {decoder!r} is not one of {', '.join(DECODERS)}")
        self.transform, self.decoder = transform, decoder
        steps = list(getattr(transform, "transforms", []))
        names = [type(step).__name__ for step in steps]
        standard = (len(steps) == 4 and isinstance(steps[0], T.RandomResizedCrop)
                    and names[1] == "MaybeConvertMode" and getattr(steps[1], "mode", None) == "RGB"
                    and names[2] in ("MaybeToTensor", "ToTensor") and isinstance(steps[3], T.Normalize))
        self.crop = steps[0] if standard else None
        self.normalization: Optional[Normalization] = (
            Normalization(tuple(map(float, steps[3].mean)), tuple(map(float, steps[3].std))) if standard else None)

    def __call__(self, data: bytes) -> torch.Tensor:
        image = Image.open(io.BytesIO(data))
        if self.crop is None:
            return self.transform(image.convert("RGB"))
        if self.decoder == "pil":
            return crop_tensor(self.crop(image.convert("RGB")))
        return crop_tensor(self._draft_crop(image))

    def _draft_crop(self, image: Image.Image) -> Image.Image:
        from torchvision.transforms import functional as F

        crop = self.crop
        width, height = image.size
        # Drawn from the image's size before any pixel is decoded: the same draws as crop.forward's.
        top, left, crop_h, crop_w = crop.get_params(image, crop.scale, crop.ratio)
        out_h, out_w = crop.size
        reduction = draft_reduction(crop_h, crop_w, out_h, out_w)
        if reduction > 1 and image.format == "JPEG":
            image.draft("RGB", (math.ceil(width / reduction), math.ceil(height / reduction)))
        image = image.convert("RGB")
        if image.size == (width, height):
            return F.resized_crop(image, top, left, crop_h, crop_w, crop.size, crop.interpolation,
                                  antialias=crop.antialias)
        # The crop's box in the reduced image's coordinates (fractional: PIL's box resize samples it
        # exactly rather than rounding it to whole reduced pixels).
        sx, sy = image.width / width, image.height / height
        box = (left * sx, top * sy, (left + crop_w) * sx, (top + crop_h) * sy)
        return image.resize((out_w, out_h), _PIL_FILTERS[crop.interpolation.value], box=box)


_PIL_FILTERS = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
                "bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS,
                "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING}


def open_clip_crop(transform: Callable):
    """The ``RandomResizedCrop`` of an open_clip training transform (crop, RGB, to tensor, normalise) and its
    ``Normalization``; ``(None, None)`` for any other transform."""
    decoder = CropDecoder(transform)
    return decoder.crop, decoder.normalization


class Deferred(NamedTuple):
    """A sample as a worker hands it over for decoding on the device: the crop ``(top, left, height,
    width)`` in the stored image's pixels, and the JPEG's bytes."""

    crop: tuple[int, int, int, int]
    data: bytes


class DeferredCrop:
    """A worker's share of ``data.decode=device``: the crop drawn from the JPEG's size, the bytes kept."""

    def __init__(self, transform: Callable):
        self.crop, self.normalization = open_clip_crop(transform)
        if self.crop is None:
            raise ValueError("data.decode=device needs open_clip's training transform (crop, RGB, to tensor, "
                             "normalise)")

    def __call__(self, data: bytes) -> Deferred:
        image = Image.open(io.BytesIO(data))  # reads the header only
        if image.format != "JPEG":
            raise ValueError(f"a {image.format} image: data.decode=device decodes JPEGs only")
        if not data.rstrip(b"\0").endswith(JPEG_END):
            raise ValueError("a JPEG cut short (no end-of-image marker)")
        crop = self.crop
        return Deferred(tuple(crop.get_params(image, crop.scale, crop.ratio)), data)


class DeviceCrops:
    """The trainer's share of ``data.decode=device``: a batch of JPEGs decoded on ``device`` and each cropped
    and resized there, ``-> (B, 3, H, W)`` uint8 for ``Normalization`` to finish."""

    def __init__(self, transform: Callable):
        self.crop, _ = open_clip_crop(transform)

    def __call__(self, jpegs: list[torch.Tensor], crops: list[tuple[int, int, int, int]],
                 device: torch.device) -> torch.Tensor:
        """``jpegs``: each image's bytes as a 1-D uint8 host tensor; ``crops``: its ``(top, left, h, w)``."""
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms import functional as F

        crop = self.crop
        images = decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=device)
        out = torch.empty(len(jpegs), 3, *crop.size, dtype=torch.uint8, device=device)
        for k, (image, (top, left, h, w)) in enumerate(zip(images, crops)):
            # In float: antialiased resizing is not implemented for uint8 on every device; rounded back
            # to uint8 as PIL's resize leaves its pixels.
            resized = F.resized_crop(image[None].float(), top, left, h, w, list(crop.size), crop.interpolation,
                                     antialias=True)
            out[k] = resized[0].round_().clamp_(0, 255)
        return out
