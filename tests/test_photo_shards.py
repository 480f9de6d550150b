"""DataComp-like shards: photo-like JPEGs as img2dataset writes DataComp's, in its layout."""

import io
import json
import statistics
import subprocess
import sys
import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from euclip_cli.data.photo_shards import (JPEG_QUALITY, LONGEST_SIDE, PhotoShardsExistError, encode, generate,
                                          photo, photo_size)
from euclip_cli.data.world_files import KEY_DIGITS, SHARD_DIGITS


def bytes_per_pixel(image: Image.Image) -> float:
    return len(encode(image)) / (image.width * image.height)


def as_stored(image: Image.Image) -> Image.Image:
    """Resized as img2dataset stores DataComp's images: longest side 512, never enlarged."""
    scale = LONGEST_SIDE / max(image.size)
    if scale < 1:
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BICUBIC)
    return image


def test_the_synthetic_photos_encode_to_as_many_bytes_a_pixel_as_real_photographs():
    """scikit-image's sample photographs (its colour photos, bundled with the package), stored as DataComp
    stores them, span the bytes per pixel that a JPEG decoder's time depends on; the generator's
    images must fall among them, not all at one end."""
    skimage_data = pytest.importorskip("skimage.data")
    real = [bytes_per_pixel(as_stored(Image.fromarray(getattr(skimage_data, name)()[..., :3])))
            for name in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field",
                         "retina")]
    rng = np.random.default_rng(0)
    synthetic = [bytes_per_pixel(photo(rng, *photo_size(rng))) for _ in range(24)]
    low, high = min(real), max(real)
    assert low <= statistics.median(synthetic) <= high
    assert sum(low <= s <= high for s in synthetic) >= 0.75 * len(synthetic)
    # Not flat images: the quartiles of real photographs' range are both reached.
    assert min(synthetic) < statistics.median(real) < max(synthetic)


def test_stored_sizes_are_datacomps_longest_side_512_or_smaller_originals_kept():
    rng = np.random.default_rng(1)
    sizes = [photo_size(rng) for _ in range(2000)]
    longest = [max(s) for s in sizes]
    assert max(longest) == LONGEST_SIDE and min(min(s) for s in sizes) >= 100
    assert 0.75 < sum(side == LONGEST_SIDE for side in longest) / len(sizes) < 0.95
    assert 0.5 < sum(w > h for w, h in sizes) / len(sizes) < 0.9  # landscape more common than portrait


def test_images_are_encoded_at_quality_95_with_4_2_0_subsampling():
    image = photo(np.random.default_rng(2), 320, 240)
    stored = Image.open(io.BytesIO(encode(image)))
    reference = io.BytesIO()
    image.save(reference, format="JPEG", quality=JPEG_QUALITY)
    assert stored.format == "JPEG" and stored.quantization == Image.open(reference).quantization
    from PIL import JpegImagePlugin
    assert JpegImagePlugin.get_sampling(stored) == 2  # 4:2:0


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("photos") / "shards"
    generate(out, samples=30, seed=3, workers=2)
    return out


def test_shards_have_datacomps_layout_and_every_sample_its_files(shards):
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["samples"] == 30 and manifest["shards"] == 1
    name = f"{0:0{SHARD_DIGITS}d}"
    assert {p.name for p in shards.iterdir()} == {f"{name}.tar", f"{name}.parquet", f"{name}_stats.json",
                                                   "manifest.json"}
    with tarfile.open(shards / f"{name}.tar") as tar:
        names = tar.getnames()
        keys = sorted({n.split(".")[0] for n in names})
        assert len(keys) == 30 and all(len(k) == SHARD_DIGITS + KEY_DIGITS for k in keys)
        assert set(names) == {f"{k}.{ext}" for k in keys for ext in ("jpg", "txt", "json")}
        meta = json.loads(tar.extractfile(f"{keys[0]}.json").read())
        image = Image.open(io.BytesIO(tar.extractfile(f"{keys[0]}.jpg").read()))
        caption = tar.extractfile(f"{keys[0]}.txt").read().decode()
    assert (meta["width"], meta["height"]) == image.size and meta["caption"] == caption and meta["status"] == "success"
    assert max(meta["original_width"], meta["original_height"]) >= max(image.size)
    table = pq.read_table(shards / f"{name}.parquet").to_pandas()
    assert sorted(table["key"]) == keys and set(table["status"]) == {"success"}
    assert json.loads((shards / f"{name}_stats.json").read_text())["successes"] == 30


def test_a_second_run_is_a_no_op_and_other_contents_are_refused(shards, tmp_path):
    assert generate(shards, samples=30, seed=3)["skipped"]
    with pytest.raises(PhotoShardsExistError, match="holds other shards"):
        generate(shards, samples=31, seed=3)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(PhotoShardsExistError, match="not these shards"):
        generate(tmp_path, samples=5)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "euclip_cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


@pytest.mark.slow
def test_the_loader_and_decode_benches_run_on_the_shards_through_the_cli(shards, tmp_path):
    from typer.testing import CliRunner

    from euclip_cli.cli.main import app

    runner = CliRunner()
    loader = runner.invoke(app, ["bench", "loader", "--shards", str(shards), "--workers", "1", "--device", "cpu",
                                 "--batch-size", "4", "--batches", "2", "--warmup", "1", "--rounds", "1", "--decoder",
                                 "pil-draft", "--out", str(tmp_path)])
    assert loader.exit_code == 0, loader.output
    result = json.loads(next(tmp_path.glob("loader-*.json")).read_text())
    assert result["settings"]["decoder"] == "pil-draft" and result["settings"]["shards"] == str(shards)
    assert all(m["samples_per_s"] > 0 for m in result["measurements"].values())
    decode = runner.invoke(app, ["bench", "decode", "--shards", str(shards), "--images", "10", "--rounds", "1", "--out",
                                 str(tmp_path)])
    assert decode.exit_code == 0, decode.output
    measured = json.loads(next(tmp_path.glob("decode-*.json")).read_text())["measurements"]
    assert {"openclip", "pil", "pil-draft", "torchvision-io"} <= set(measured)
    assert measured["pil"]["difference_from_openclip"]["max"] == 0  # the same crops, bitwise


def test_download_datacomp_like_refuses_a_folder_of_other_files_in_one_line(tmp_path):
    (tmp_path / "mine.txt").write_text("x")
    result = cli("download", "datacomp-like", "--out", str(tmp_path), "--samples", "2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "not these shards" in result.stderr and len(result.stderr.strip().splitlines()) == 1
