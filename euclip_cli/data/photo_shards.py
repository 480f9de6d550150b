"""DataComp-like training shards made here: photo-like JPEGs as img2dataset writes them for DataComp.

DataComp's shards hold JPEGs resized so that the longest side is at most 512 px, keeping the aspect
ratio and never enlarging (img2dataset ``image_size=512``, ``resize_mode="keep_ratio_largest"``,
``resize_only_if_bigger=True``), encoded at quality 95 with 4:2:0 chroma subsampling (OpenCV's
default, which img2dataset uses). Decoding and cropping such images is what a GPU node's loaders
spend their time on, and what the embedded world's 64-px images cannot measure. These shards have:

- the layout of ``world_files``' training shards (``NNNNN.tar`` with ``KEY.jpg``, ``KEY.txt``,
  ``KEY.json``, per-shard ``.parquet`` and ``_stats.json``), so every loader reads them as DataComp's;
- images of DataComp's sizes: most with a 512-px longest side at a common photographic aspect ratio,
  ``SMALL_SHARE`` smaller (an original below 512 px is kept as it is);
- photo-like content: a 1/f^a power spectrum (the statistics of natural images), coloured through a
  random channel mix, with flat-coloured shapes for edges, blurred as a lens blurs, then fine texture
  and sensor noise. Its bytes per pixel at quality 95 fall among real photographs' (checked against
  scikit-image's sample photographs in the tests): what a JPEG decoder's time depends on is the
  image size and its entropy-coded bytes, not what the picture shows;
- captions of DataComp's lengths (``synthetic_captions``).

The content carries no labels: these shards are for measuring the data path, not for learning.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from euclip_cli.errors import UsageError
from euclip_cli.rundir import read_json, whole_folder
from euclip_cli.workers import make_room_for_workers, pool_size, worker_pool

GENERATOR_VERSION = 1
LONGEST_SIDE = 512  # DataComp's img2dataset image_size
JPEG_QUALITY = 95  # img2dataset's encode_quality for DataComp
SAMPLES_PER_SHARD = 1000  # smaller than DataComp's 10,000: a benchmark's few thousand samples still span shards
# Aspect ratios (width / height) of photographs, with weights: landscape 4:3 and 3:2 most common.
ASPECTS = ((4 / 3, 0.3), (3 / 2, 0.25), (1.0, 0.15), (16 / 9, 0.1), (3 / 4, 0.1), (2 / 3, 0.1))
# The share of images whose original was smaller than 512 px, kept at their size by
# resize_only_if_bigger (their longest side uniform in [SMALL_SIDE, 512)).
SMALL_SHARE, SMALL_SIDE = 0.15, 200

# Web alt-text of DataComp's kind, as lengths: Li et al. 2024 ("What If We Recaption Billions of Web
# Images with LLaMA-3?", arXiv:2406.08478) report DataComp-1B's original captions at about ten words
# on average. No published distribution was found, so the shape is an assumption, stated: word
# counts log-normal with this log-space spread (median about three quarters of the mean; one caption
# in a thousand over 7.5x the mean).
CAPTION_WORDS_MEAN = 10.0
CAPTION_WORDS_SIGMA = 0.75
# Words that are each one token of open_clip's BPE, so a caption of n words is n + 2 tokens with its
# start and end tokens: the lengths drawn are the lengths the tower sees (up to the context).
ONE_TOKEN_WORDS = ("a the of in on at with and photo image picture dog cat bird car house tree street city beach "
                   "sunset red blue green white black old new small big man woman girl boy water sky road flower "
                   "garden table chair food view room wall door window light night day art design style home "
                   "vintage wedding dress shirt").split()


class PhotoShardsExistError(UsageError):
    """The output folder holds other shards or files; nothing is overwritten."""


def synthetic_captions(mean_words: float, count: int, seed: int = 0) -> list[str]:
    """``count`` captions whose word counts are log-normal with mean ``mean_words`` and log-space spread
    ``CAPTION_WORDS_SIGMA`` (at least one word each), made of one-token words: only the lengths
    matter to a timing (and to the text tower's trimming), not the words."""
    rng = np.random.default_rng(seed)
    # The log-normal's mean is exp(mu + sigma^2 / 2); mu is chosen so that it is mean_words.
    mu = float(np.log(mean_words)) - CAPTION_WORDS_SIGMA ** 2 / 2
    counts = np.maximum(1, np.rint(rng.lognormal(mu, CAPTION_WORDS_SIGMA, size=count))).astype(int)
    return [" ".join(rng.choice(ONE_TOKEN_WORDS, size=n)) for n in counts]


def photo_size(rng: np.random.Generator) -> tuple[int, int]:
    """``(width, height)`` of one stored image: the longest side 512 or, for ``SMALL_SHARE``, smaller."""
    ratios, weights = zip(*ASPECTS)
    ratio = ratios[rng.choice(len(ratios), p=np.array(weights) / sum(weights))]
    longest = LONGEST_SIDE if rng.random() >= SMALL_SHARE else int(rng.integers(SMALL_SIDE, LONGEST_SIDE))
    short = max(1, round(longest / max(ratio, 1 / ratio)))
    return (longest, short) if ratio >= 1 else (short, longest)


def _spectral_noise(rng: np.random.Generator, height: int, width: int, exponent: float) -> np.ndarray:
    """Three channels of noise with amplitude spectrum 1/f^exponent, each of unit spread: ``(3, H, W)``."""
    fy = np.fft.fftfreq(height).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(width).astype(np.float32)[None, :]
    frequency = np.sqrt(fx ** 2 + fy ** 2)
    frequency[0, 0] = 1.0  # the mean's term, zeroed below: 1 only keeps the power finite
    amplitude = frequency ** -exponent
    amplitude[0, 0] = 0.0
    phase = rng.uniform(0, 2 * np.pi, (3, *amplitude.shape)).astype(np.float32)
    noise = np.fft.irfft2(amplitude * np.exp(1j * phase), s=(height, width), axes=(-2, -1)).astype(np.float32)
    return noise / noise.std(axis=(1, 2), keepdims=True)


def photo(rng: np.random.Generator, width: int, height: int):
    """One photo-like RGB ``PIL.Image`` of ``width`` x ``height`` (see the module's docstring)."""
    from PIL import Image, ImageDraw, ImageFilter

    base = _spectral_noise(rng, height, width, rng.uniform(1.0, 1.4))
    mix = rng.normal(0, 0.35, (3, 3)) + np.eye(3) * rng.uniform(0.2, 0.6)
    rgb = np.einsum("ij,jhw->hwi", mix.astype(np.float32), base) * rng.uniform(25, 55) + rng.uniform(60, 190, 3)
    image = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 10))):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        radius = rng.uniform(0.05, 0.35) * max(width, height)
        colour = tuple(int(c) for c in rng.uniform(0, 255, 3))
        if rng.random() < 0.5:
            draw.ellipse([cx - radius, cy - radius * rng.uniform(0.4, 1), cx + radius,
                          cy + radius * rng.uniform(0.4, 1)], fill=colour)
        else:
            angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(3, 7))))
            draw.polygon([(cx + radius * np.cos(a), cy + radius * np.sin(a)) for a in angles], fill=colour)
    pixels = np.asarray(image.filter(ImageFilter.GaussianBlur(rng.uniform(0.6, 1.6))), dtype=np.float32)
    texture = _spectral_noise(rng, height, width, rng.uniform(0.6, 1.0)).transpose(1, 2, 0)
    pixels = pixels + texture * rng.uniform(3, 9) + rng.normal(0, rng.uniform(0.5, 2.0), pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def encode(image) -> bytes:
    """JPEG bytes as img2dataset writes them for DataComp (quality 95, 4:2:0)."""
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=JPEG_QUALITY, subsampling="4:2:0")
    return out.getvalue()


def _write_shard(out: str, seed: int, shard: int, count: int) -> int:
    from euclip_cli.data.world_files import write_train_shard

    rng = np.random.default_rng([seed, shard])
    captions = synthetic_captions(CAPTION_WORDS_MEAN, count, seed=int(rng.integers(2 ** 63)))

    def samples():
        for caption in captions:
            width, height = photo_size(rng)
            # A stored image of 512 px was resized from a larger original (resize_only_if_bigger).
            grown = 1.0 if max(width, height) < LONGEST_SIDE else float(rng.uniform(1.0, 4.0))
            yield encode(photo(rng, width, height)), caption, lambda key, width=width, height=height, grown=grown: {
                "uid": hashlib.md5(f"photo-{seed}-{key}".encode()).hexdigest(), "url": f"photo://{seed}/{key}",
                "width": width, "height": height, "original_width": round(width * grown),
                "original_height": round(height * grown)}

    return write_train_shard(Path(out), shard, samples())


def generate(out: Path, samples: int, seed: int = 0, workers: int = 2,
             progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Write ``samples`` photo-like samples as DataComp-layout shards into ``out``; a no-op when ``out``
    already holds the same ones. Raises ``PhotoShardsExistError`` when it holds anything else.
    ``progress(done, total)`` is called after each shard."""
    wanted = {"kind": "photo-shards", "generator_version": GENERATOR_VERSION, "seed": seed, "samples": samples}
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        found = read_json(manifest_path)
        if {k: found.get(k) for k in wanted} == wanted:
            return found | {"skipped": True}
        raise PhotoShardsExistError(f"{out} holds other shards ({', '.join(f'{k} {found.get(k)}' for k in wanted)}); "
                                    f"choose another --out or delete it")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PhotoShardsExistError(f"{out} exists and holds files that are not these shards (no manifest.json); "
                                    f"choose another --out or delete it")
    counts = [min(SAMPLES_PER_SHARD, samples - s) for s in range(0, samples, SAMPLES_PER_SHARD)]
    make_room_for_workers(pool_size(workers, len(counts)), "--workers")
    start = time.time()
    # Written whole or not at all: an interrupted run leaves nothing in ``out``, and the same command starts again.
    with whole_folder(out, lambda pid: PhotoShardsExistError(
            f"{out} is being written by another process (pid {pid}): wait for it, or choose another --out")) as staging:
        with worker_pool(workers, len(counts)) as pool:
            jobs = [pool.submit(_write_shard, str(staging), seed, i, n) for i, n in enumerate(counts)]
            for done, job in enumerate(jobs, 1):
                job.result()
                if progress:
                    progress(done, len(counts))
        sizes = [p.stat().st_size for p in sorted(staging.glob("*.tar"))]
        manifest = wanted | {"shards": len(counts), "bytes": sum(sizes), "seconds": round(time.time() - start, 1)}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest
