"""GRIT, HyCoCLIP's training data: ``euclip download grit`` against metadata in GRIT's own columns on a stand-in
Hub and images on 127.0.0.1, its boxes cut as HyCoCLIP's ``utils/prepare_GRIT_webdataset.py`` cuts them, and
HyCoCLIP's recipes."""

from __future__ import annotations

import io
import json
import tarfile

import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

from euclip_cli import config as C
from euclip_cli.cli.main import app
from euclip_cli.download.grit import phrase_boxes
from tests.test_download_datacomp import FAST, one_line_error
from tests.webfakes import FakeHub, ImageHost, image_bytes

runner = CliRunner()
CAPTION = "a red circle next to a blue square"


def span(phrase: str, box: tuple[float, float, float, float], caption: str = CAPTION, score: float = 0.8) -> list:
    start = caption.index(phrase)
    return [start, start + len(phrase), *box, score]


def grit_part(rows: list[dict]) -> bytes:
    """One metadata file in GRIT's columns (its dataset card's instance: key, the two CLIP similarities, the COYO
    id, url, caption, width, height, noun_chunks, ref_exps)."""
    frame = pd.DataFrame([{"key": f"{i:09d}", "clip_similarity_vitb32": 0.3, "clip_similarity_vitl14": 0.3,
                           "width": 64, "height": 48, **row} for i, row in enumerate(rows)])
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    return buffer.getvalue()


@pytest.fixture()
def grit_web(monkeypatch):
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    images = ImageHost(slow_s=4)
    whole, small = (0.0, 0.0, 1.0, 1.0), (0.0, 0.0, 0.2, 0.2)
    parts = {
        "grit-20m/coyo_0_snappy.parquet": grit_part([
            # Image 0 is 40 x 32: "a red circle" whole (1,280 px, kept), "a blue square" 8 x 6 (dropped),
            # "a red circle" again among the referring expressions (taken already), and the whole caption.
            {"id": 101, "url": f"{images.url}/ok/0.jpg", "caption": CAPTION,
             "noun_chunks": [span("a red circle", whole), span("a blue square", small)],
             "ref_exps": [span("a red circle", (0.5, 0.5, 1.0, 1.0)), span(CAPTION, (0.0, 0.0, 0.9, 1.0))]},
            # Every box too small: HyCoCLIP's preparation drops the pair.
            {"id": 102, "url": f"{images.url}/ok/1.jpg", "caption": CAPTION,
             "noun_chunks": [span("a red circle", small)], "ref_exps": []},
            {"id": 103, "url": f"{images.url}/missing/2.jpg", "caption": CAPTION,
             "noun_chunks": [span("a red circle", whole)], "ref_exps": []},
        ]),
        "grit-20m/coyo_1_snappy.parquet": grit_part([
            {"id": 201, "url": f"{images.url}/ok/3.jpg", "caption": "two shapes",
             "noun_chunks": [span("two shapes", whole, caption="two shapes")], "ref_exps": []},
        ]),
        # A part --parts 2 leaves alone: never fetched.
        "grit-20m/coyo_2_snappy.parquet": grit_part([{"id": 301, "url": f"{images.url}/ok/4.jpg", "caption": "x",
                                                      "noun_chunks": [], "ref_exps": []}]),
    }
    hub = FakeHub({"zzliang/GRIT": parts})
    yield hub, images
    hub.stop()
    images.stop()


def samples(shards) -> dict[str, dict[str, bytes]]:
    """uid -> {extension: bytes} over every tar in ``shards``."""
    found: dict[str, dict[str, bytes]] = {}
    for path in sorted(shards.glob("*.tar")):
        by_key: dict[str, dict[str, bytes]] = {}
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                key, _, ext = m.name.partition(".")
                by_key.setdefault(key, {})[ext] = tar.extractfile(m).read()
        found.update({json.loads(files["json"])["uid"]: files for files in by_key.values()})
    return found


@pytest.mark.slow
def test_grit_downloads_its_parts_and_cuts_each_pairs_boxes_as_hycoclip_prepares_them(grit_web, tmp_path):
    hub, images = grit_web
    out = tmp_path / "grit"
    args = ["download", "grit", "--parts", "2", "--hub-url", hub.url, "--out", str(out), *FAST]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    found = samples(out / "shards")
    assert set(found) == {"101", "201"}  # 102 kept no box, 103 is not on its host, part 2 was not asked for
    first = found["101"]
    assert first["txt"].decode() == CAPTION and first["numparents.txt"] == b"2"
    assert [first[f"parent{i:03d}.txt"].decode() for i in range(2)] == ["a red circle", CAPTION]
    # Each image, the pair's own too, scaled to a longest side of 224 and padded white to a square: image 0 is
    # 40 x 32 (one colour), so 224 x 179 between white bands; the caption's box 36 x 32, so 224 wide again.
    colour = Image.open(io.BytesIO(image_bytes(0))).convert("RGB").getpixel((20, 16))
    for name in ("jpg", "parent000.jpg", "parent001.jpg"):
        picture = Image.open(io.BytesIO(first[name])).convert("RGB")
        assert picture.size == (224, 224)
        assert all(abs(a - b) <= 6 for a, b in zip(picture.getpixel((112, 112)), colour)), name
        assert all(v >= 249 for v in picture.getpixel((112, 3)) + picture.getpixel((112, 220))), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["identity"]["source"] == "grit" and manifest["identity"]["parts"] == 2
    assert manifest["identity"]["image_size"] == 256 and manifest["identity"]["resize_mode"] == "keep_ratio"
    assert manifest["selected"] == 4 and manifest["downloaded"] == 3
    assert manifest["boxes"] == {"samples": 3, "with_boxes": 2, "boxes": 3, "unreadable": 0}
    assert not any("coyo_2" in r for r in hub.requests)
    # Done is done: a rerun fetches nothing again.
    before = (len(hub.requests), len(images.requests))
    assert runner.invoke(app, args).exit_code == 0 and (len(hub.requests), len(images.requests)) == before
    one_line_error(runner.invoke(app, [*args[:2], "--parts", "1", *args[4:]]), 2, "holds another download", "parts")

    # The box loader reads the shards as it reads the embedded world's: the two pairs, then one box of each.
    from euclip_cli.data.loader import TrainBatches, list_shards
    from euclip_cli.towers import build_clip, tokenizer_for, transforms_for

    stream = TrainBatches(list_shards(out / "shards", "x"), transform=transforms_for(build_clip("tiny"))[0],
                          tokenizer=tokenizer_for("tiny"), batch_size=2, seed=0, shuffle_buffer=4, segment_steps=2,
                          workers=0, boxes=True)
    batch, tokens, *_ = next(stream)
    assert batch.shape[0] == 4 and tokens.shape[0] == 4


def test_hycoclips_boxes_are_its_phrases_once_each_truncated_to_pixels_and_at_least_32_by_32():
    """HyCoCLIP's rules, one case each: the phrase is the caption's span; a phrase taken is skipped, whatever its
    box; fractions times the size truncate; a box of at most 1,024 pixels of area is dropped (33 x 32 is kept,
    32 x 32 is not)."""
    caption = "a dog on a mat"
    spans = [[0, 5, 0.0, 0.0, 0.33, 0.32, 0.9],       # "a dog": 33 x 32 at 100 x 100 px
             [9, 14, 0.0, 0.0, 0.32, 0.32, 0.9],      # "a mat": 32 x 32, dropped
             [0, 5, 0.5, 0.5, 1.0, 1.0, 0.9],         # "a dog" again: skipped
             [0, 14, 0.129, 0.0, 0.999, 0.999, 0.9]]  # the caption: 12.9 -> 12, 99.9 -> 99
    assert phrase_boxes(caption, spans, 100, 100) == [((0, 0, 33, 32), "a dog"), ((12, 0, 99, 99), caption)]


def test_grit_refuses_a_part_count_it_does_not_have_and_metadata_that_is_not_its(grit_web, tmp_path):
    hub, _ = grit_web
    result = runner.invoke(app, ["download", "grit", "--parts", "22", "--out", str(tmp_path / "g")])
    assert result.exit_code == 2 and "--parts" in result.output
    hub.repos["zzliang/GRIT"]["grit-20m/coyo_0_snappy.parquet"] = b"PAR1 not parquet"
    result = runner.invoke(app, ["download", "grit", "--parts", "1", "--hub-url", hub.url,
                                 "--out", str(tmp_path / "bad"), *FAST])
    one_line_error(result, 1, "is not GRIT's metadata", "coyo_0_snappy.parquet")


def test_hycoclips_recipes_are_its_configurations_on_grit():
    """HyCoCLIP's configs/train_hycoclip_vit_{s,b}.py (from train_hycoclip_vit_l.py): MERU's towers and scalars,
    GRIT, batch 768 for 500,000 iterations, AdamW lr 5e-4 with 4,000 warmup steps, weight decay 0.2, crops of
    50-100% of the area, entailment weight 0.2."""
    for name, arch in (("hycoclip-vit-s", "meru-vit-s"), ("hycoclip-vit-b", "meru-vit-b")):
        cfg = C.load_config(name)
        assert cfg.loss.kind == "hycoclip" and cfg.data.dataset == "grit" and cfg.model.arch == arch
        assert cfg.data.batch_size == 768 and cfg.optim.samples == 768 * 500_000
        assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.beta2, cfg.optim.warmup_steps) == (5e-4, 0.2, 0.98, 4000)
        assert cfg.data.crop_scale == 0.5 and cfg.data.subreddit_prefix == 0
        assert (cfg.geometry.name, cfg.geometry.logit) == ("hyperbolic", "d")
        assert (cfg.loss.entail_weight, cfg.loss.entail_min_radius) == (0.2, 0.1)
        assert C.train_dir(cfg) == C.train_dir(C.load_config("hycoclip-vit-s"))


def test_a_hycoclip_recipe_downloads_grit_where_its_training_reads(tmp_path, monkeypatch):
    from euclip_cli.data.fetch import FetchError
    from euclip_cli.download import grit

    asked = []

    def unreachable(out, options, command, say, parts, endpoint):
        asked.append((out, parts))
        raise FetchError("the Hub could not be reached")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(grit, "download_grit", unreachable)
    one_line_error(runner.invoke(app, ["download", "--recipe", "hycoclip-vit-b"]), 1, "could not be reached")
    assert asked == [(C.train_dir(C.load_config("hycoclip-vit-b")).parent, grit.PARTS)]
    assert C.train_dir(C.load_config("hycoclip-vit-b")).parts == ("data", "grit", "shards")
