"""RedCaps, MERU's training data: ``euclip download redcaps`` (and ``download --recipe meru-*``) against an
annotations archive in RedCaps' own format and an image host on 127.0.0.1; MERU's recipes; and the Hugging
Face token kept from every other host a download touches."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from typer.testing import CliRunner

from euclip_cli import config as C
from euclip_cli.cli.main import app
from euclip_cli.report.tables import Run, meru_model
from tests.test_download_datacomp import FAST, one_line_error, shard_samples
from tests.webfakes import ImageHost, StaticHost

runner = CliRunner()


def annotation_archive(host_url: str, more: int = 0) -> bytes:
    """RedCaps' release layout: ``annotations/{subreddit}_{year}.json``, each ``{"info", "annotations"}`` with
    the fields its downloader writes; one image of ``pics`` is gone from its host. ``more``: that many pairs
    more in ``earthporn``, for a download that lasts."""
    files = {
        "itookapicture_2020": [("ab1", "ok/1.jpg", "my dog in the snow"), ("ab2", "ok/2.jpg", "sunset over the bay")],
        "pics_2019": [("cd1", "ok/3.jpg", "a red door"), ("cd2", "missing/4.jpg", "gone"),
                      ("cd3", "ok/5.jpg", "old bridge")],
        "earthporn_2021": [("ef1", "ok/6.jpg", "mountains at dawn"),
                           *((f"gh{i}", f"ok/{10 + i}.jpg", f"view number {i}") for i in range(more))],
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, rows in files.items():
            subreddit = name.rsplit("_", 1)[0]
            annotations = [{"image_id": i, "subreddit": subreddit, "url": f"{host_url}/{path}", "caption": caption,
                            "raw_caption": caption.title(), "score": 10, "author": "someone", "created_utc": 1600000000,
                            "permalink": f"/r/{subreddit}/comments/{i}/"} for i, path, caption in rows]
            z.writestr(f"annotations/{name}.json", json.dumps({"info": {"version": "v1.0"}, "annotations": annotations}))
    return buffer.getvalue()


@pytest.fixture()
def redcaps_web(monkeypatch):
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    images = ImageHost(slow_s=4)
    archive = StaticHost({"redcaps_v1.0_annotations.zip": annotation_archive(images.url), "broken.zip": b"not a zip",
                          "empty.zip": zipfile_bytes({"README.txt": b"hello"})})
    yield archive
    archive.stop()
    images.stop()


def zipfile_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.slow
def test_redcaps_downloads_its_chosen_subreddits_into_datacomps_shard_format(redcaps_web, tmp_path):
    out = tmp_path / "redcaps"
    args = ["download", "redcaps", "--annotations-url", f"{redcaps_web.url}/redcaps_v1.0_annotations.zip",
            "--subreddits", "ITookAPicture,pics", "--out", str(out), *FAST]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    samples = shard_samples(out / "shards")
    # RedCaps' image_id is the uid; the caption as RedCaps cleaned it; the subreddit in each sample's json.
    assert set(samples) == {"ab1", "ab2", "cd1", "cd3"}
    assert samples["ab1"]["txt"] == "my dog in the snow" and samples["cd3"]["json"]["subreddit"] == "pics"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["identity"]["source"] == "redcaps" and manifest["identity"]["subreddits"] == ["itookapicture", "pics"]
    assert manifest["selected"] == 5 and manifest["downloaded"] == 4 and manifest["complete"]
    # Done is done: a rerun fetches nothing again, not even the archive.
    before = len(redcaps_web.requests)
    assert runner.invoke(app, args).exit_code == 0 and len(redcaps_web.requests) == before
    # Other subreddits are another download: refused by name, nothing changed.
    other = runner.invoke(app, [*args[:4], "--subreddits", "earthporn", *args[6:]])
    one_line_error(other, 2, "holds another download", "subreddits")


def test_an_archive_that_is_not_redcaps_is_named(redcaps_web, tmp_path):
    for name, fragment in (("broken.zip", "is not a ZIP archive"), ("empty.zip", "holds no annotations/*.json"),
                           ("absent.zip", "HTTP 404")):
        result = runner.invoke(app, ["download", "redcaps", "--annotations-url", f"{redcaps_web.url}/{name}",
                                     "--out", str(tmp_path / name), *FAST])
        one_line_error(result, 1, fragment)
    result = runner.invoke(app, ["download", "redcaps", "--annotations-url",
                                 f"{redcaps_web.url}/redcaps_v1.0_annotations.zip", "--subreddits", "nosuchplace",
                                 "--out", str(tmp_path / "none"), *FAST])
    one_line_error(result, 2, "no annotation", "nosuchplace")
    one_line_error(runner.invoke(app, ["download", "redcaps", "--subreddits", " , ", "--out", str(tmp_path / "x")]),
                   2, "--subreddits names no subreddit")


def test_a_meru_recipe_downloads_where_its_training_reads(tmp_path, monkeypatch):
    from euclip_cli.download import redcaps

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setattr(redcaps, "ANNOTATIONS_URL", "http://127.0.0.1:9/redcaps_v1.0_annotations.zip")
    result = runner.invoke(app, ["download", "--recipe", "meru-vit-s"])
    one_line_error(result, 1, "could not reach http://127.0.0.1:9/redcaps_v1.0_annotations.zip")
    manifest = json.loads((tmp_path / "data" / "redcaps" / "manifest.json").read_text())
    assert manifest["identity"]["source"] == "redcaps"
    assert C.train_dir(C.load_config("meru-vit-s")) == C.train_dir(C.load_config("meru-clip-vit-l"))


MERU_RECIPES = ["meru-vit-s", "meru-vit-b", "meru-vit-l", "meru-clip-vit-s", "meru-clip-vit-b", "meru-clip-vit-l"]


def test_each_meru_recipe_is_one_of_merus_published_models_with_merus_settings():
    from euclip_cli.published import meru_tables

    published = {(a, m) for a, m in meru_tables()[["arch", "model"]].itertuples(index=False)}
    found = set()
    for name in MERU_RECIPES:
        cfg = C.load_config(name)
        config = {"model": {"arch": cfg.model.arch}, "geometry": {"name": cfg.geometry.name}}
        found.add((cfg.model.arch, meru_model(Run(name, name, config, {}))))
        # MERU's section 4.1 and configs/train_meru_vit_l.py.
        assert cfg.data.dataset == "redcaps" and cfg.data.batch_size * 120_000 == cfg.optim.samples
        assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.beta2, cfg.optim.eps) == (5e-4, 0.2, 0.98, 1e-8)
        assert cfg.optim.warmup_steps == 4000 and cfg.geometry.logit_scale_max == 100.0
        assert cfg.data.subreddit_prefix == 0.5 and cfg.data.crop_scale == 0.5
        assert cfg.geometry.logit_scale_min_log is None and cfg.optim.decay_rule == "meru-code"
        # MERU's code clamps alpha <= 1 for its hyperbolic models (its CLIP has no alpha).
        assert cfg.geometry.alpha_max == (1.0 if cfg.geometry.name == "hyperbolic" else None)
        if cfg.geometry.name == "hyperbolic":
            assert (cfg.loss.entail_weight, cfg.loss.entail_min_radius) == (0.2, 0.1)
            assert (cfg.geometry.curvature_init, cfg.geometry.curvature_min, cfg.geometry.curvature_max) == (1, 0.1, 10)
    assert found == published


def test_merus_position_embeddings_are_moco_v3s_sine_cosine_table():
    """Against MoCo v3's construction written out entry by entry: its grid is indexed (w, h) and flattened, so
    on a square grid the first half of a patch's entries follow its row."""
    import math

    import torch

    from euclip_cli.towers import build_clip
    from euclip_cli.towers.archs import sincos_positions

    side, width = 3, 8
    q = width // 4
    want = torch.zeros(1 + side * side, width)
    for first in range(side):
        for second in range(side):
            token = 1 + first * side + second
            for k in range(q):
                angle = 1 / 10000 ** (k / q)
                want[token, [k, q + k, 2 * q + k, 3 * q + k]] = torch.tensor(
                    [math.sin(first * angle), math.cos(first * angle), math.sin(second * angle),
                     math.cos(second * angle)])
    torch.testing.assert_close(sincos_positions(side, side, width), want)
    trunk = build_clip("meru-vit-s").visual.trunk
    assert not trunk.pos_embed.requires_grad
    torch.testing.assert_close(trunk.pos_embed[0], sincos_positions(14, 14, 384))


@pytest.mark.slow
def test_a_meru_recipe_trains_a_step_on_the_cpu(world, tmp_path, monkeypatch):
    """MERU's ViT-S and text towers from scratch, hyperbolic, entailment on: one step of four pairs, MERU's
    crops, its position embeddings left as they were built."""
    from euclip_cli.rundir import RunDir, load_checkpoint
    from euclip_cli.towers.archs import sincos_positions
    from euclip_cli.train import loop

    scales = []
    real = loop.transforms_for
    monkeypatch.setattr(loop, "transforms_for", lambda clip, scale: scales.append(scale) or real(clip, scale))
    result = runner.invoke(app, ["train", "--recipe", "meru-vit-s", "data.dataset=world",
                                 f"data.train_dir={world / 'train'}", "data.batch_size=4", "optim.samples=4",
                                 "optim.warmup_steps=1", "train.precision=fp32", "train.tensorboard=false",
                                 "data.workers=1", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert scales == [0.5]
    metrics = [json.loads(line) for line in (tmp_path / "meru-vit-s" / "metrics.jsonl").read_text().splitlines()]
    assert any("entail" in key for key in metrics[-1]) and all(v == v for v in metrics[-1].values()
                                                                  if isinstance(v, float))
    state = load_checkpoint(RunDir(tmp_path / "meru-vit-s").latest_checkpoint())["model"]
    assert state["clip.visual.trunk.pos_embed"][0].equal(sincos_positions(14, 14, 384))


def test_the_hugging_face_token_goes_to_the_hub_only(monkeypatch, tmp_path):
    """Every download goes through ``fetch.open_url``: the token reaches the Hub (or the endpoint the user
    set), never another host, nor the CDN the Hub redirects to."""
    from euclip_cli.data.fetch import fetch_file

    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    cdn = StaticHost({"blob": b"payload"})
    hub = StaticHost({"plain": b"payload"}, redirects={"redirected": f"{cdn.url.replace('127.0.0.1', 'localhost')}/blob"})
    try:
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
        fetch_file(f"{hub.url}/plain", tmp_path / "a", None)
        assert hub.requests[-1] == ("plain", None)  # 127.0.0.1 is not the Hub
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        fetch_file(f"{hub.url}/plain", tmp_path / "b", None)
        assert hub.requests[-1] == ("plain", "Bearer hf_secret")
        fetch_file(f"{hub.url}/redirected", tmp_path / "c", None)
        assert hub.requests[-1] == ("redirected", "Bearer hf_secret") and cdn.requests[-1] == ("blob", None)
        assert (tmp_path / "c").read_bytes() == b"payload"
    finally:
        hub.stop()
        cdn.stop()


def test_merus_caption_prefix_as_its_mapper_writes_it():
    import torch

    from euclip_cli.data.redcaps import SubredditPrefix, subreddit_words

    sample = {"txt": b"my dog in the snow", "json": json.dumps({"uid": "ab1", "subreddit": "itookapicture"}).encode()}
    assert subreddit_words("itookapicture") == "i took a picture" and subreddit_words("EarthPorn") == "earth porn"
    assert SubredditPrefix(1.0)(sample) == "i took a picture : my dog in the snow"
    assert SubredditPrefix(0.0)(sample) == "my dog in the snow"
    assert SubredditPrefix(1.0)({"txt": b"no json"}) == "no json"  # a shard that is not RedCaps'
    torch.manual_seed(0)
    prefixed = sum(SubredditPrefix(0.5)(sample) != "my dog in the snow" for _ in range(2000))
    assert abs(prefixed / 2000 - 0.5) < 0.05


def redcaps_like_shards(folder, count: int = 48) -> list[str]:
    """A shard as ``euclip download redcaps`` writes them: jpg, txt and a json naming the subreddit."""
    import tarfile

    from tests.webfakes import image_bytes

    folder.mkdir(parents=True)
    with tarfile.open(folder / "00000000.tar", "w") as tar:
        for i in range(count):
            subreddit = ("itookapicture", "earthporn", "pics")[i % 3]
            for ext, data in (("jpg", image_bytes(i)), ("txt", f"caption {i}".encode()),
                              ("json", json.dumps({"uid": f"u{i}", "subreddit": subreddit}).encode())):
                info = tarfile.TarInfo(f"{i:08d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return [str(folder / "00000000.tar")]


def test_the_prefix_is_drawn_per_batch_so_a_resumed_loader_repeats_it(tmp_path):
    """The loader seeds torch per batch: the prefixes a resumed stream draws are those of the unbroken one."""
    import torch

    from euclip_cli.data.loader import TrainBatches
    from euclip_cli.data.redcaps import SubredditPrefix

    shards = redcaps_like_shards(tmp_path / "shards")

    def tokens(caption: str) -> torch.Tensor:  # the caption's characters, so a test can read them back
        return torch.tensor([[ord(c) for c in caption[:40].ljust(40)]])

    def stream(**kwargs):
        return TrainBatches(shards, 8, lambda image: torch.zeros(3, 4, 4), tokens, seed=5, shuffle_buffer=16,
                            segment_steps=3, caption=SubredditPrefix(0.5), **kwargs)

    unbroken = stream()
    expected = [next(unbroken)[1] for _ in range(5)]
    captions = ["".join(map(chr, row)).strip() for batch in expected for row in batch.tolist()]
    prefixed = [c for c in captions if " : caption " in c]
    assert 0 < len(prefixed) < len(captions)
    # Each prefix is its own sample's subreddit, segmented (sample i is of subreddit i % 3).
    words = ("i took a picture", "earth porn", "pics")
    assert all(c.split(" : ")[0] == words[int(c.rsplit(" ", 1)[1]) % 3] for c in prefixed)
    first = stream()
    for _ in range(2):
        next(first)
    resumed = stream(start=2, state=first.state())
    assert all(torch.equal(next(resumed)[1], want) for want in expected[2:])
    unbroken.close(), first.close(), resumed.close()
