"""What the project loads from outside is read as untrusted: pickles build no objects but data, archives
write nothing outside their folder and are refused, in one line, when they lie about their contents."""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.data.fetch import FetchError
from euclip_cli.download.webshards import load_asset

runner = CliRunner()


class RunsCode:
    """A pickle that, loaded by a full unpickler, creates a file: what a hostile asset would do."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_datacomp_asset_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"image_features": torch.zeros(2, 4), "extra": RunsCode(str(marker))}, tmp_path / "asset.pt")
    with pytest.raises(FetchError, match="asset.pt is not an asset of DataComp's kind"):
        load_asset(tmp_path / "asset.pt")
    assert not marker.exists()
    # The control: the same file, loaded as torch's full unpickler does, runs it.
    torch.load(tmp_path / "asset.pt", weights_only=False)
    assert marker.exists()


def test_datacomps_asset_kinds_load_as_they_were_saved(tmp_path):
    """A pickled NumPy array (the centroids) and a dict of tensors (the ImageNet embeddings)."""
    centroids = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    torch.save(centroids, tmp_path / "centroids.pt")
    features = {"image_features": torch.randn(3, 4).half()}
    torch.save(features, tmp_path / "imagenet.pt")
    assert np.array_equal(load_asset(tmp_path / "centroids.pt"), centroids)
    assert torch.equal(load_asset(tmp_path / "imagenet.pt")["image_features"], features["image_features"])


def winogavil_hub(archive: bytes):
    from tests.test_evalsets import FakeHub

    csv = 'ID,cue,candidates,associations\n0,moon,"[""a""]","[""a""]"\n'
    return FakeHub({"nlphuji/winogavil/winogavil_dataset.csv": csv.encode(),
                    "nlphuji/winogavil/winogavil_images.zip": archive})


def zip_of(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


def download_winogavil(archive: bytes, root):
    fake = winogavil_hub(archive)
    try:
        return runner.invoke(app, ["download", "evalsets", "--tasks", "misc/winogavil", "--root", str(root),
                                   "--base-url", fake.url])
    finally:
        fake.server.shutdown()


def test_archive_members_named_as_paths_land_inside_their_folder(tmp_path):
    """Members named ``../..``-something or absolute are written under their own base name only."""
    root = tmp_path / "eval"
    result = download_winogavil(zip_of({"../../../a.jpg": b"\xff\xd8one", "/etc/b.jpg": b"\xff\xd8two"}), root)
    assert result.exit_code == 0, result.output  # the csv's instance names image 'a', which the archive holds
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.jpg"))
    assert written == ["eval/winogavil/images/a.jpg", "eval/winogavil/images/b.jpg"], written
    assert not (tmp_path.parent.parent / "a.jpg").exists() and not os.path.exists("/etc/b.jpg")


@pytest.mark.parametrize("damage", ["crc", "size", "not a zip"])
def test_an_archive_that_lies_about_its_contents_is_one_line_naming_it(tmp_path, damage):
    archive = bytearray(zip_of({"winogavil_images/a.jpg": b"\xff\xd8" + b"x" * 200}))
    if damage == "crc":  # a byte of the stored member changed: its CRC no longer matches
        archive[archive.index(b"xxxx")] = ord("y")
    elif damage == "size":  # the central directory declares more than the member holds
        directory = archive.rindex(b"PK\x01\x02")
        archive[directory + 24:directory + 28] = (10 ** 9).to_bytes(4, "little")
    else:
        archive = bytearray(b"PK\x03\x04 not really a zip")
    result = download_winogavil(bytes(archive), tmp_path / "eval")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    text = " ".join(result.output.split())
    assert len(lines) == 1 and "winogavil_images.zip" in text, result.output
