"""Per-core decode measurement: a training image from its JPEG bytes to a training crop, by each way
there is (``euclip bench decode``).

Each way runs on one core (one torch thread, one process) over the same images, with the same
crops (the generator seeded per image), in interleaved rounds; its pixels are compared with
OpenCLIP's path, in 0-255 units of the un-normalised image.

- ``openclip``: OpenCLIP's worker, PIL's decode and open_clip's whole training transform, to the
  normalised float crop: the reference. Every other way stops at the uint8 crop, as euclip's loader
  hands it over (the device normalises it: ``decode.Normalization``).
- ``pil``, ``pil-draft``: the loader's own decoders (``euclip_cli.data.decode``).
- ``torchvision-io``: ``torchvision.io.decode_jpeg`` (libjpeg-turbo) on the CPU, then torchvision's
  tensor crop and antialiased bicubic resize: the path a device decode mirrors on the host.
- ``simplejpeg``: libjpeg-turbo with DCT scaling through simplejpeg's ``min_height``/``min_width``,
  the same reduction rule as ``pil-draft``, then PIL's box resize; measured where simplejpeg is
  installed (it is not a dependency of euclip).
"""

from __future__ import annotations

import math
import statistics
import tarfile
import time
from pathlib import Path
from typing import Callable

import torch

from euclip_cli.data.decode import CropDecoder, crop_tensor, draft_reduction


def shard_images(shards: Path, count: int) -> list[bytes]:
    """The first ``count`` JPEG images of a folder of img2dataset shards, in shard order."""
    images: list[bytes] = []
    for shard in sorted(shards.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.name.endswith((".jpg", ".jpeg")):
                    images.append(tar.extractfile(member).read())
                    if len(images) == count:
                        return images
    return images


def _shape_only(height: int, width: int) -> torch.Tensor:
    """A tensor of an image's shape and no pixels, for drawing a crop from the size alone."""
    return torch.empty((), dtype=torch.uint8).expand(3, height, width)


def openclip_path(transform) -> Callable[[bytes], torch.Tensor]:
    """OpenCLIP's worker: PIL's whole decode, then the whole transform (crop, to tensor, normalise)."""
    import io

    from PIL import Image

    return lambda data: transform(Image.open(io.BytesIO(data)).convert("RGB"))


def torchvision_io(transform) -> Callable[[bytes], torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import functional as F

    crop = transform.transforms[0]

    def decode(data: bytes) -> torch.Tensor:
        pixels = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        top, left, h, w = crop.get_params(pixels, crop.scale, crop.ratio)
        return F.resized_crop(pixels, top, left, h, w, crop.size, crop.interpolation, antialias=True)

    return decode


def simplejpeg_way(transform) -> Callable[[bytes], torch.Tensor]:
    import numpy as np
    import simplejpeg
    from PIL import Image

    crop = transform.transforms[0]
    out_h, out_w = crop.size

    def decode(data: bytes) -> torch.Tensor:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        top, left, h, w = crop.get_params(_shape_only(height, width), crop.scale, crop.ratio)
        reduction = draft_reduction(h, w, out_h, out_w)
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=math.ceil(height / reduction),
                                        min_width=math.ceil(width / reduction))
        image = Image.fromarray(np.ascontiguousarray(pixels))
        sx, sy = image.width / width, image.height / height
        box = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
        return crop_tensor(image.resize((out_w, out_h), Image.Resampling.BICUBIC, box=box))

    return decode


def ways_for(transform) -> dict[str, Callable[[bytes], torch.Tensor] | str]:
    """Each way's decode function, or why it is not measured here. All but ``openclip`` stop at the
    uint8 crop, as euclip's loader hands it over (normalised on the device)."""
    ways: dict = {"openclip": openclip_path(transform), "pil": CropDecoder(transform, "pil"),
                  "pil-draft": CropDecoder(transform, "pil-draft"), "torchvision-io": torchvision_io(transform)}
    try:
        ways["simplejpeg"] = simplejpeg_way(transform)
    except ImportError:
        ways["simplejpeg"] = "simplejpeg is not installed (pip install simplejpeg to measure it)"
    return ways


def pixel_difference(reference: list[torch.Tensor], other: list[torch.Tensor], std: torch.Tensor) -> dict:
    """Mean, 99th percentile and largest absolute difference, in 0-255 units of the un-normalised image."""
    diffs = torch.cat([((a - b).abs() * std * 255).flatten() for a, b in zip(reference, other)])
    sample = diffs[torch.randperm(diffs.numel(), generator=torch.Generator().manual_seed(0))[:1_000_000]]
    return {"mean": diffs.mean().item(), "p99": sample.quantile(0.99).item(), "max": diffs.max().item()}


def bench_decode(images: list[bytes], transform, rounds: int) -> dict:
    """Samples/s per core of each way over ``images`` (median over interleaved rounds), against OpenCLIP's
    path, and its pixel difference from OpenCLIP's result with the same crops."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ways = ways_for(transform)
        runnable = {name: way for name, way in ways.items() if callable(way)}

        def outputs(way) -> list[torch.Tensor]:
            results = []
            for index, data in enumerate(images):
                torch.manual_seed(index)
                results.append(way(data))
            return results

        normalization = runnable["pil"].normalization
        reference = outputs(runnable["openclip"])
        std = torch.tensor(normalization.std).view(3, 1, 1)
        differences = {name: pixel_difference(reference, [x if x.is_floating_point() else normalization(x[None])[0]
                                                          for x in outputs(way)], std)
                       for name, way in runnable.items()}
        rates: dict[str, list[float]] = {name: [] for name in runnable}
        for _ in range(rounds):
            for name, way in runnable.items():
                start = time.perf_counter()
                outputs(way)
                rates[name].append(len(images) / (time.perf_counter() - start))
    finally:
        torch.set_num_threads(threads)
    base = statistics.median(rates["openclip"])
    measurements = {name: {"samples_per_s": statistics.median(r), "per_round": r,
                           "vs_openclip": statistics.median(r) / base, "difference_from_openclip": differences[name]}
                    for name, r in rates.items()}
    pixels = [math.prod(_jpeg_size(data)) for data in images]
    return {"images": len(images), "mean_bytes": sum(map(len, images)) / len(images),
            "mean_pixels": sum(pixels) / len(pixels), "rounds": rounds, "measurements": measurements,
            "not_measured": {name: why for name, why in ways.items() if not callable(why)}}


def _jpeg_size(data: bytes) -> tuple[int, int]:
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data)).size
