"""Compositional evaluation: SugarCrepe and Winoground in every geometry (clip-benchmark's selection rule with
the geometry's similarity), fetched from stand-ins on 127.0.0.1 and scored through the CLI."""

import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from clip_benchmark.metrics import image_caption_selection
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.evaluate.selection import selection_metrics, selection_outcomes
from euclip_cli.geometry.registry import get_geometry
from euclip_cli.data.world_tasks import NEGATIVE_KINDS as SUGARCREPE_SPLITS
from euclip_cli.protocol.tasks import select
from tests.test_evalsets import FakeHub, download_from
from tests.trained import copy_run
from tests.webfakes import StaticHost

runner = CliRunner()


class Features(torch.nn.Module):
    """A stand-in model for clip-benchmark's loop: an "image" is a tensor holding its row's index in ``images``,
    a "token" the index of its caption in ``texts``."""

    def __init__(self, images: torch.Tensor, texts: torch.Tensor):
        super().__init__()
        self.images, self.texts = images, texts

    def encode_image(self, pixels):
        return self.images[pixels.flatten(1)[:, 0].long()]

    def encode_text(self, tokens):
        return self.texts[tokens]


def clip_benchmark_scores(image_emb: torch.Tensor, text_emb: torch.Tensor) -> dict:
    """clip-benchmark's own ``image_caption_selection.evaluate`` on these features (N instances of I images and T
    captions), in batches of three instances."""
    n, i, _ = image_emb.shape
    t = text_emb.shape[1]
    model = Features(image_emb.reshape(n * i, -1), text_emb.reshape(n * t, -1))
    batches = [(torch.arange(s * i, min(s + 3, n) * i, dtype=torch.float).reshape(-1, i, 1, 1, 1).squeeze(1),
                [[str(k * t + j) for j in range(t)] for k in range(s, min(s + 3, n))]) for s in range(0, n, 3)]
    return image_caption_selection.evaluate(model, batches, lambda texts: torch.tensor([int(x) for x in texts]),
                                            "cpu", amp=False)


@pytest.mark.parametrize("images, captions", [(1, 2), (2, 2)], ids=["sugarcrepe", "winoground"])
def test_the_clip_geometry_scores_as_clip_benchmark_on_the_same_features(images, captions):
    g = torch.Generator().manual_seed(images)
    # Nearby features, so that many instances are lost: a rule that differed would show.
    image_emb = torch.nn.functional.normalize(torch.randn(40, images, 6, generator=g), dim=-1)
    text_emb = torch.nn.functional.normalize(image_emb.mean(1, keepdim=True) + 0.8 * torch.randn(40, captions, 6, generator=g), dim=-1)
    ours = selection_metrics(get_geometry("clip"), image_emb, text_emb)
    theirs = clip_benchmark_scores(image_emb, text_emb)
    assert ours == pytest.approx(theirs, abs=1e-12)
    assert 0 < ours["acc"] < 1  # neither all right nor all wrong: the comparison can fail
    if images == 1:
        assert ours["image_acc"] == 1 and ours["acc"] == ours["text_acc"]


def lorentz_distance(u: np.ndarray, v: np.ndarray, c: float) -> float:
    """MERU's distance between two tangent vectors at the origin, lifted by its exponential map (float64)."""
    def lift(w):
        r = np.linalg.norm(w)
        space = np.sinh(np.sqrt(c) * r) * w / (np.sqrt(c) * r)
        return space, np.sqrt(1 / c + space @ space)

    (us, ut), (vs, vt) = lift(u), lift(v)
    return float(np.arccosh(max(1.0, -c * (us @ vs - ut * vt))) / np.sqrt(c))


def winoground_by_definition(distance) -> tuple[bool, bool]:
    """Winoground's text and image scores as its paper defines them (Thrush et al. 2022, section 3.3) for one
    instance, with ``distance(image k, caption j)``: lower is closer."""
    s = lambda k, j: -distance(k, j)  # noqa: E731
    text = s(0, 0) > s(0, 1) and s(1, 1) > s(1, 0)
    image = s(0, 0) > s(1, 0) and s(1, 1) > s(0, 1)
    return text, image


@pytest.mark.parametrize("name", ["euclidean", "hyperbolic"])
def test_a_geometry_scores_by_its_own_distance(name):
    rng = np.random.default_rng(3)
    # Features of unequal norms: the cosine and the geometry's distance disagree on some instances.
    image_emb = rng.normal(size=(60, 2, 4)) * rng.uniform(0.2, 2.0, size=(60, 2, 1))
    text_emb = rng.normal(size=(60, 2, 4)) * rng.uniform(0.2, 2.0, size=(60, 2, 1))
    c = 0.7
    if name == "euclidean":
        distance = lambda u, v: float(np.linalg.norm(u - v))  # noqa: E731
    else:
        distance = lambda u, v: lorentz_distance(u, v, c)  # noqa: E731
    expected = [winoground_by_definition(lambda k, j, n=n: distance(image_emb[n, k], text_emb[n, j])) for n in range(60)]
    cosine = lambda u, v: 1 - u @ v / np.linalg.norm(u) / np.linalg.norm(v)  # noqa: E731
    by_cosine = [winoground_by_definition(lambda k, j, n=n: cosine(image_emb[n, k], text_emb[n, j])) for n in range(60)]
    found = selection_outcomes(get_geometry(name, logit="d"), torch.tensor(image_emb), torch.tensor(text_emb),
                               torch.tensor(c, dtype=torch.float64))
    assert [(bool(t), bool(i)) for t, i in zip(found["text"], found["image"])] == expected
    assert expected != by_cosine  # the geometry decided some instances the cosine decides otherwise
    assert found["group"].tolist() == [t and i for t, i in expected]


# ---------------------------------------------------------------- the sets, served from 127.0.0.1

def world_jpegs(world, n: int) -> list[bytes]:
    with tarfile.open(world / "eval" / "retrieval" / "test" / "0.tar") as tar:
        return [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")][:n]


def sugarcrepe_host(jpegs: list[bytes]) -> StaticHost:
    """SugarCrepe's seven files (three pairs each, on the first five images) and a val2017.zip that also holds
    an image no split names."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for i, data in enumerate(jpegs):
            z.writestr(f"val2017/{i:012d}.jpg", data)
    files = {"zips/val2017.zip": archive.getvalue()}
    for s, split in enumerate(SUGARCREPE_SPLITS):
        pairs = {str(10 * s + k): {"filename": f"{(s + k) % 5:012d}.jpg", "caption": f"a red circle {split} {k}",
                                   "negative_caption": f"a blue square {split} {k}"} for k in range(3)}
        files[f"data/{split}.json"] = json.dumps(pairs).encode()
    return StaticHost(files)


def winoground_examples(n: int) -> list[dict]:
    return [{"id": i, "caption_0": f"a small star left of a large circle {i}",
             "caption_1": f"a large star left of a small circle {i}", "image_0": f"ex_{i}_img_0",
             "image_1": f"ex_{i}_img_1", "tag": "Object"} for i in range(n)]


def winoground_hub(jpegs: list[bytes]) -> FakeHub:
    """Winoground as the Hub has kept it: data/examples.jsonl and data/images.zip (PNG images)."""
    from PIL import Image

    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for i, data in enumerate(jpegs[:8]):
            png = io.BytesIO()
            Image.open(io.BytesIO(data)).save(png, format="PNG")
            z.writestr(f"images/ex_{i // 2}_img_{i % 2}.png", png.getvalue())
    lines = "".join(json.dumps(e) + "\n" for e in winoground_examples(4))
    return FakeHub({"facebook/winoground/data/examples.jsonl": lines.encode(),
                    "facebook/winoground/data/images.zip": archive.getvalue()})


@pytest.fixture(scope="module")
def compositional_sets(world, tmp_path_factory):
    """The eight tasks' sets, fetched through the CLI from the stand-ins."""
    root = tmp_path_factory.mktemp("compositional") / "eval"
    jpegs = world_jpegs(world, 8)
    host, hub = sugarcrepe_host(jpegs[:6]), winoground_hub(jpegs)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("HF_TOKEN", "hf_stand_in")
            result = runner.invoke(app, ["download", "evalsets", "--tasks", "compositional", "--root", str(root),
                                         "--base-url", hub.url, "--sugarcrepe-url", f"{host.url}/data",
                                         "--coco-url", f"{host.url}/zips/val2017.zip"])
    finally:
        host.stop()
        hub.server.shutdown()
    assert result.exit_code == 0, result.output
    return root, result.output


def test_the_sets_are_written_where_the_readers_look(compositional_sets):
    root, output = compositional_sets
    output = " ".join(output.split())
    assert "sugar_crepe: 21 pairs of all seven splits and 5 images" in output
    assert "winoground: instances and images" in output
    names = sorted(p.name for p in (root / "sugar_crepe" / "val2017").iterdir())
    assert names == [f"{i:012d}.jpg" for i in range(5)]  # the image no split names is left in the zip
    assert not (root / "sugar_crepe" / "val2017.zip").exists()
    assert {p.name for p in root.joinpath("sugar_crepe").glob("*.json")} == {f"{s}.json" for s in SUGARCREPE_SPLITS}
    lines = [json.loads(line) for line in (root / "winoground" / "examples.jsonl").read_text().splitlines()]
    assert [e["image_1"] for e in lines] == [f"ex_{i}_img_1.png" for i in range(4)]
    assert len(list((root / "winoground" / "images").glob("*.png"))) == 8


def test_a_second_download_fetches_nothing(compositional_sets):
    root, _ = compositional_sets
    result = runner.invoke(app, ["download", "evalsets", "--tasks", "compositional", "--root", str(root),
                                 "--base-url", "http://127.0.0.1:9", "--sugarcrepe-url", "http://127.0.0.1:9",
                                 "--coco-url", "http://127.0.0.1:9/val2017.zip"])
    assert result.exit_code == 0, result.output
    assert " ".join(result.output.split()).count("(0 fetched, 1 already there)") == 2


def test_the_cli_scores_every_task_and_clip_matches_clip_benchmark(compositional_sets, tiny_clip, tmp_path):
    from clip_benchmark.datasets.builder import build_dataset, image_captions_collate_fn

    from euclip_cli.encode import load_model
    from euclip_cli.evaluate.selection import WinogroundSet
    from euclip_cli.rundir import RunDir
    from euclip_cli.towers import tokenizer_for, transforms_for

    root, _ = compositional_sets
    run = copy_run(tiny_clip, tmp_path / "runs")
    result = runner.invoke(app, ["eval", str(run), "--tasks", "compositional", "--eval-root", str(root),
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "compositional (8/8 tasks)" in result.output
    lines = {line["key"]: line for line in RunDir(run).eval_lines()}
    assert set(lines) == {t.key for t in select("compositional")}

    model, cfg, _, _ = load_model(RunDir(run), torch.device("cpu"))
    _, transform = transforms_for(model.clip)
    for key, line in lines.items():
        ds = (WinogroundSet(root / "winoground", transform) if key == "winoground" else
              build_dataset(key, root=str(root / "sugar_crepe"), transform=transform, split="test",
                            task="image_caption_selection"))
        loader = torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=image_captions_collate_fn)
        theirs = image_caption_selection.evaluate(model, loader, tokenizer_for(cfg.model.arch), "cpu", amp=False)
        assert {k: line["metrics"][k] for k in theirs} == pytest.approx(theirs, abs=1e-9), key
        assert line["metrics"]["main_metric"] == line["metrics"]["acc"]
    assert len(lines["winoground"]["hits"]["acc"]) > 0


def test_without_the_sets_eval_names_the_download(tiny_clip, tmp_path):
    run = copy_run(tiny_clip, tmp_path / "runs")
    result = runner.invoke(app, ["eval", str(run), "--tasks", "compositional", "--eval-root", str(tmp_path / "none"),
                                 "--device", "cpu"])
    assert result.exit_code == 1
    assert "euclip download evalsets --tasks compositional" in result.output and "Traceback" not in result.output


def test_winoground_without_a_token_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    result = runner.invoke(app, ["download", "evalsets", "--tasks", "winoground", "--root", str(tmp_path),
                                 "--base-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "HF_TOKEN" in result.output and "huggingface.co/datasets/facebook/winoground" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "winoground" / "examples.jsonl").exists()


def test_winoground_as_parquet_is_read_too(world, tmp_path, monkeypatch):
    jpegs = world_jpegs(world, 4)
    table = pa.Table.from_pylist([{"id": i, "image_0": {"bytes": jpegs[2 * i], "path": None},
                                   "image_1": {"bytes": jpegs[2 * i + 1], "path": None},
                                   "caption_0": f"one {i}", "caption_1": f"two {i}"} for i in range(2)])
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in")
    result = download_from({"facebook/winoground/data/test-00000-of-00001.parquet": buffer.getvalue(),
                            "facebook/winoground/README.md": b"gated"}, "winoground", tmp_path)
    assert result.exit_code == 0, result.output
    from PIL import Image

    from euclip_cli.evaluate.selection import WinogroundSet

    ds = WinogroundSet(tmp_path / "winoground")
    images, captions = ds[1]
    assert captions == ["one 1", "two 1"] and len(ds) == 2
    assert np.array_equal(np.asarray(images[0].convert("RGB")), np.asarray(Image.open(io.BytesIO(jpegs[2])).convert("RGB")))


def test_the_report_has_a_compositional_table(compositional_sets, tiny_clip, world, tmp_path):
    root, _ = compositional_sets
    runs = tmp_path / "runs"
    for name in ("a", "b"):  # one run, twice: the table reads each run's own lines
        run = copy_run(tiny_clip, runs, name)
        assert runner.invoke(app, ["eval", str(run), "--tasks", "sugar_crepe/swap_obj,winoground,world/hard-negatives",
                                   "--eval-root", str(root), "--world", str(world), "--device", "cpu"]).exit_code == 0
    result = runner.invoke(app, ["report", "--table", "compositional", "--runs-dir", str(runs), "--out",
                                 str(tmp_path / "tables")])
    assert result.exit_code == 0, result.output
    from euclip_cli.report.tables import MISSING
    from euclip_cli.rundir import RunDir

    lines = {line["key"]: line["metrics"] for line in RunDir(runs / "a").eval_lines()}
    text = (tmp_path / "tables" / "compositional.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| tiny-clip"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    found = dict(zip(header, cells))
    assert found["seeds"] == "2"
    assert found["Winoground text"] == f"{100 * lines['winoground']['text_acc']:.1f} ± 0.0 (n=2)"
    assert found["SugarCrepe swap-obj"] == f"{100 * lines['sugar_crepe/swap_obj']['acc']:.1f} ± 0.0 (n=2)"
    # A split not scored is missing, and so is a mean of one split of seven.
    assert found["SugarCrepe add-att"] == MISSING and found["SugarCrepe"] == MISSING
    assert found["geometry"] == "clip"
    hard = lines["world/hard-negatives"]
    assert found["world hard negatives"] == f"{100 * hard['acc']:.1f} ± 0.0 (n=2)"
    assert found["text alone"] == f"{100 * hard['text_only_acc']:.1f} ± 0.0 (n=2)"


# ---------------------------------------------------------------- the embedded world's hard negatives

def read_listing(caption: str) -> list[dict]:
    """The mentions of "a red circle on the left and a small blue star at the top", read back by pattern."""
    import re

    from euclip_cli.data import world as w

    places = "|".join(re.escape(p) for p in w.POSITION_PHRASE.values())
    pattern = re.compile(rf"^an? (?:(small|large) )?({'|'.join(w.COLOURS)}) ({'|'.join(w.SHAPES)}) ({places})$")
    found = []
    for part in caption.split(" and "):
        size, colour, shape, place = pattern.match(part).groups()
        position = next(k for k, v in w.POSITION_PHRASE.items() if v == place)
        found.append({"colour": colour, "shape": shape, "position": position} | ({"size": size} if size else {}))
    return found


def true_of(mentions: list[dict], scene: list[dict]) -> bool:
    return all(any(all(o[k] == v for k, v in m.items()) for o in scene) for m in mentions)


def test_every_world_pair_is_a_true_caption_and_a_false_negative_of_its_kind(world):
    from euclip_cli.worlddir import WorldDir

    folder = WorldDir(world).task("hard-negatives")
    scenes = json.loads((folder / "scenes.json").read_text())
    kinds = json.loads(WorldDir(world).negative_kinds_file("hard-negatives").read_text())
    with tarfile.open(folder / "test" / "0.tar") as tar:
        pairs = [tar.extractfile(m).read().decode().split("\n") for m in tar.getmembers() if m.name.endswith(".txt")]
    assert len(pairs) == len(scenes) == len(kinds) == 120 and set(kinds) == set(SUGARCREPE_SPLITS)
    for (caption, negative), scene, kind in zip(pairs, scenes, kinds):
        mine, theirs = read_listing(caption), read_listing(negative)
        assert true_of(mine, scene) and not true_of(theirs, scene), (kind, caption, negative)
        if kind.startswith("swap"):  # the same words, moved
            assert sorted(caption.split()) == sorted(negative.split()) and caption != negative
        elif kind.startswith("replace"):  # one property of one object
            assert len(mine) == len(theirs) and sum(a != b for a, b in zip(mine, theirs)) == 1
        elif kind == "add_att":
            assert [set(m) for m in theirs] != [set(m) for m in mine] and theirs[1] == mine[1]
        else:
            assert len(theirs) == len(mine) + 1 and theirs[0] == mine[0]


def test_the_text_only_baseline_is_a_bigram_model_of_the_training_captions():
    from euclip_cli.data.world_tasks import BigramScorer

    scorer = BigramScorer(["a red circle", "a red star", "a blue star"])
    # Vocabulary <s> a red blue circle star </s> and an unknown word: 8; counts of "a" as a first word: 3.
    expected = np.log((3 + 1) / (3 + 8)) + np.log((2 + 1) / (3 + 8)) + np.log((1 + 1) / (2 + 8)) + np.log((2 + 1) / (2 + 8))
    assert scorer.score("a red star") == pytest.approx(expected)
    assert scorer.picks_caption("a red star", "a star red") == 1.0
    assert scorer.picks_caption("a red star", "a red star") == 0.5


def test_the_world_task_is_scored_beside_text_alone_and_chance(world, tiny_clip, tmp_path):
    from euclip_cli.protocol.hits import unpack_hits
    from euclip_cli.rundir import RunDir
    from euclip_cli.worlddir import WorldDir

    run = copy_run(tiny_clip, tmp_path / "runs")
    result = runner.invoke(app, ["eval", str(run), "--tasks", "world/hard-negatives", "--world", str(world),
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    (line,) = RunDir(run).eval_lines()
    metrics = line["metrics"]
    baseline = json.loads(WorldDir(world).text_only_file("hard-negatives").read_text())
    kinds = json.loads(WorldDir(world).negative_kinds_file("hard-negatives").read_text())
    assert metrics["text_only_acc"] == baseline["acc"] and metrics["chance"] == 0.5
    assert sum(metrics[f"pairs_{k}"] for k in SUGARCREPE_SPLITS) == 120
    hits = np.array(unpack_hits(line["hits"]["acc"]))
    assert metrics["acc"] == pytest.approx(hits.mean())
    for kind in SUGARCREPE_SPLITS:
        assert metrics[f"acc_{kind}"] == pytest.approx(hits[np.array(kinds) == kind].mean())
        assert metrics[f"text_only_acc_{kind}"] == baseline[f"acc_{kind}"]
    assert metrics["main_metric"] == metrics["acc"]
    from euclip_cli.protocol.aggregate import aggregate

    # Outside the world's groups and average, which studies compare: scored, it counts in none of them.
    found = aggregate(RunDir(run).latest_results(), "world")
    assert (found["tasks_done"], found["tasks_total"], found["average"]) == (0, 10, None)
    assert f"acc {metrics['acc']:.4f} (text alone {baseline['acc']:.4f}, chance 0.50)" in " ".join(result.output.split())


def test_a_world_from_before_the_hard_negatives_gains_them_unchanged_otherwise(world, tmp_path):
    import hashlib
    import shutil

    from euclip_cli.worlddir import WorldDir

    old = Path(shutil.copytree(world, tmp_path / "world"))
    written = (old / "eval" / "hard-negatives" / "text_only.json").read_text()
    shutil.rmtree(old / "eval" / "hard-negatives")
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["eval_tasks"].remove("hard-negatives")
    manifest["files"] = {k: v for k, v in manifest["files"].items() if "hard-negatives" not in k}
    (old / "manifest.json").write_text(json.dumps(manifest, indent=2))
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in old.rglob("*") if p.is_file()}
    identity = WorldDir(old).identity()
    args = ["download", "world", "--out", str(old), "--seed", "7", "--samples", "1500", "--mismatch", "0.1",
            "--eval-size", "120"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "added the evaluation task(s) it lacked: hard-negatives" in " ".join(result.output.split())
    assert (old / "eval" / "hard-negatives" / "text_only.json").read_text() == written  # as a new world has it
    assert WorldDir(old).identity() == identity
    changed = [p for p, d in digests.items() if hashlib.sha256(p.read_bytes()).hexdigest() != d]
    assert changed == [old / "manifest.json"]
    assert "hard-negatives" in json.loads((old / "manifest.json").read_text())["eval_tasks"]
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "nothing to do" in again.output


@pytest.mark.parametrize("examples", [b"<html>a proxy's page</html>\n", b"[1, 2]\n"], ids=["not-json", "not-examples"])
def test_winoground_examples_that_are_not_the_datasets_are_one_line(tmp_path, monkeypatch, examples):
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in")
    result = download_from({"facebook/winoground/data/examples.jsonl": examples,
                            "facebook/winoground/data/images.zip": b"PK"}, "winoground", tmp_path)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "winoground" in result.output and not (tmp_path / "winoground" / "examples.jsonl").exists()


def test_a_host_that_answers_the_listing_with_a_page_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in")
    host = StaticHost({"api/datasets/facebook/winoground": b"<html>sign in</html>"})
    try:
        result = runner.invoke(app, ["download", "evalsets", "--tasks", "winoground", "--root", str(tmp_path),
                                     "--base-url", host.url])
    finally:
        host.stop()
    assert result.exit_code == 1 and "did not answer with the Hub's file listing" in " ".join(result.output.split())
    assert "Traceback" not in result.output
