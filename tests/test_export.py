"""``euclip export``: a run's model leaves euclip (safetensors, its geometry, a model card, the Hub) and comes
back, from a folder or from the Hub, with the same embeddings and the same zero-shot scores; a CLIP-geometry
model with its final LayerNorms loads in open_clip and in clip-benchmark's loader as their own.

The Hub is ``tests.webfakes.FakeHub``: private repositories readable with a token only, tokens accepted by
the Hub's host alone (its CDN, another host, gets the uploads and must never see one), LFS uploads through
the batch API, a commit that can be made to fail.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from euclip_cli import config as C
from euclip_cli import exported
from euclip_cli.cli.main import app
from euclip_cli.encode import load_model
from euclip_cli.evaluate.runner import evaluate_run
from euclip_cli.protocol.tasks import select
from euclip_cli.model import initial_model
from euclip_cli.released import import_run
from euclip_cli.rundir import RunDir, checkpoint_meta
from tests.webfakes import FakeHub

runner = CliRunner()
GEOMETRY_RECIPES = ("tiny-clip", "tiny-elliptic", "tiny-euclidean-d", "tiny-euclip", "tiny-hyperbolic-d2", "tiny-meru",
                    "tiny-multi", "tiny-product-sphere")
TOKEN = "hf_writer"
CAPTIONS = ["a small red square", "two large blue circles", "a green triangle beside a yellow star"]


def make_run(runs, recipe, overrides=(), name=None) -> RunDir:
    """A run of ``recipe`` holding its initial model as a step-7 checkpoint, every scalar outside the towers and
    the temperature moved off its initial value (an export that dropped one would load the initial value back)."""
    cfg = C.load_config(recipe, list(overrides))
    model = initial_model(cfg)
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if not key.startswith("clip.") or key == "clip.logit_scale":
                value.sub_(0.37)
    config = C.to_dict(cfg)
    run = RunDir(runs / (name or recipe))
    run.claim(config, {"git_revision": "0" * 40, "git_dirty": False})
    run.save_checkpoint({"model": model.state_dict(), "step": 7, "config": config,
                         "meta": checkpoint_meta(config, model.geometry.logit, model.embed_dim)}, 7, keep=1)
    return run


def embeddings(model, images, tokens):
    with torch.no_grad():
        return model.encode_image(images), model.encode_text(tokens)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The fake Hub as huggingface_hub's endpoint in this process, with a write token in HF_TOKEN."""
    import huggingface_hub.constants as constants

    fake = FakeHub({}, tokens=(TOKEN,))
    monkeypatch.setattr(constants, "ENDPOINT", fake.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", fake.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    yield fake
    fake.stop()


@pytest.mark.parametrize("recipe", GEOMETRY_RECIPES)
def test_every_geometry_round_trips_through_a_folder_and_the_hub(tmp_path, hub, recipe):
    from euclip_cli.publish import export_run, push

    run = make_run(tmp_path / "runs", recipe)
    folder = export_run(run, tmp_path / "export")
    push(folder, f"me/{recipe}")
    original, cfg, _, _ = load_model(run, torch.device("cpu"))
    images = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    loaded = exported.load(str(folder))
    tokens = loaded.tokenizer(CAPTIONS)
    want_img, want_txt = embeddings(original, images, tokens)
    for source in (str(folder), f"hf://me/{recipe}"):
        other = loaded if source == str(folder) else exported.load(source)
        got_img, got_txt = embeddings(other.model, images, tokens)
        assert torch.equal(got_img, want_img) and torch.equal(got_txt, want_txt), source
        want = original.geometry.similarity(want_img, want_txt, original.curvature())
        assert torch.equal(other.score(got_img, got_txt), want)
        assert other.model.scalars() == original.scalars()
    described = json.loads((folder / exported.CONFIG).read_text())
    assert described["geometry"]["name"] == cfg.geometry.name and described["final_ln"] == cfg.model.final_ln
    assert described["preprocess"]["image_size"] == 64 and described["tokenizer"]["context_length"] == 32
    # open_clip's own file only where open_clip scores the model as trained
    assert (folder / exported.OPEN_CLIP_CONFIG).exists() == (exported.open_clip_problem(run.config()) is None)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", GEOMETRY_RECIPES)
def test_an_imported_export_scores_the_zero_shot_tasks_as_its_run_did(tmp_path, hub, world, recipe):
    """Export -> push -> import from the Hub as a run -> the same zero-shot metrics; the card holds them."""
    from huggingface_hub import ModelCard

    from euclip_cli.publish import export_run, push

    run = make_run(tmp_path / "runs", recipe)
    tasks = select("world/shapes,world/colour")
    before = {line["key"]: line["metrics"] for line in evaluate_run(run.path, torch.device("cpu"), tasks,
                                                                     world=world).results}
    folder = export_run(run, tmp_path / "export")
    push(folder, f"me/{recipe}")
    back = import_run("euclip-export", f"hf://me/{recipe}", "back", tmp_path / "runs")
    after = {line["key"]: line["metrics"] for line in evaluate_run(back.path, torch.device("cpu"), tasks,
                                                                    world=world).results}
    assert before.keys() == after.keys() == {"world/shapes", "world/colour"}
    for key in before:
        for metric, value in before[key].items():
            assert after[key][metric] == pytest.approx(value, abs=1e-6), (key, metric)
    card = ModelCard.load(folder / exported.CARD)
    geometry = load_model(run, torch.device("cpu"))[0].geometry
    assert card.data.geometry == {"name": geometry.name, "logit": geometry.logit}
    for key, metrics in before.items():
        assert f"| {key} | " in card.text and f"{metrics['main_metric']:.4f} |" in card.text


def test_a_clip_export_with_its_layernorms_is_open_clips_and_clip_benchmarks_own_model(tmp_path):
    import open_clip
    from clip_benchmark.models import load_clip

    from euclip_cli.publish import export_run

    # tiny-vit: a plain open_clip ViT config (the tiny recipes' conv stem is euclip's own)
    run = make_run(tmp_path / "runs", "tiny-clip", ["model.arch=tiny-vit"])
    folder = export_run(run, tmp_path / "export")
    ours = exported.load(str(folder))
    theirs, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
    image = Image.fromarray((np.random.default_rng(0).random((80, 100, 3)) * 255).astype("uint8"))
    assert torch.equal(preprocess(image), ours.preprocess(image))
    assert torch.equal(tokenizer(CAPTIONS), ours.tokenizer(CAPTIONS))
    want_img, want_txt = embeddings(ours.model, ours.preprocess(image)[None], ours.tokenizer(CAPTIONS))
    with torch.no_grad():
        got_img = theirs.eval().encode_image(preprocess(image)[None], normalize=True)
        got_txt = theirs.encode_text(tokenizer(CAPTIONS), normalize=True)
    assert torch.allclose(got_img, want_img, atol=1e-5) and torch.allclose(got_txt, want_txt, atol=1e-5)
    assert torch.allclose(theirs.logit_scale.exp(), ours.model.logit_scale())
    # clip-benchmark's own loader (what its CLI runs for --model_type open_clip --model local-dir:DIR)
    model, transform, bench_tokenizer = load_clip("open_clip", f"local-dir:{folder}", pretrained="", cache_dir=None,
                                                  device="cpu")
    with torch.no_grad():
        bench_img = torch.nn.functional.normalize(model.eval().encode_image(transform(image)[None]), dim=-1)
    assert torch.allclose(bench_img, want_img, atol=1e-5)


@pytest.mark.slow
def test_clip_benchmarks_own_cli_scores_a_clip_export_as_euclip_eval_does(tmp_path, world):
    """clip_benchmark eval --model_type open_clip --model local-dir:DIR on the world's retrieval set (its
    classification metrics fail under numpy >= 2.4 in clip-benchmark 1.6.2 itself: docs/export.md)."""
    from euclip_cli.publish import export_run

    run = make_run(tmp_path / "runs", "tiny-clip", ["model.arch=tiny-vit"])
    ours = evaluate_run(run.path, torch.device("cpu"), select("world/retrieval"), world=world).results[0]["metrics"]
    folder = export_run(run, tmp_path / "export")
    output = tmp_path / "clip-benchmark.json"
    done = subprocess.run([sys.executable, "-m", "clip_benchmark.cli", "eval", "--model_type", "open_clip", "--model",
                           f"local-dir:{folder}", "--pretrained", "", "--dataset", "wds/retrieval", "--dataset_root",
                           str(world / "eval" / "retrieval"), "--task", "zeroshot_retrieval", "--recall_k", "1", "5",
                           "--output", str(output), "--batch_size", "32", "--num_workers", "0",
                           "--no_amp"],  # fp32, as euclip evaluates on a CPU (clip-benchmark's amp is bf16 there)
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    theirs = json.loads(output.read_text())["metrics"]
    assert set(theirs) == {f"{way}_retrieval_recall@{k}" for way in ("image", "text") for k in (1, 5)}
    for key, value in theirs.items():
        assert value == pytest.approx(ours[key], abs=1e-6), key


def test_open_clip_is_offered_only_what_it_scores_as_trained(tmp_path):
    ok = C.to_dict(C.load_config("tiny-clip", ["model.arch=tiny-vit"]))
    assert exported.open_clip_problem(ok) is None
    for recipe, overrides, why in [("tiny-euclip", ["model.arch=tiny-vit"], "scores by cosine"),
                                   ("tiny-clip", ["model.arch=tiny-vit", "model.final_ln=false"], "LayerNorm"),
                                   ("tiny-clip", [], "conv stem"),
                                   ("tiny-multi", ["model.arch=tiny-vit"], "product-sphere")]:
        assert why in exported.open_clip_problem(C.to_dict(C.load_config(recipe, overrides))), recipe


def one_error_line(result, code, *words):
    """Exit ``code`` and one ``error:`` line naming ``words`` (after what was done before the fault, if anything)."""
    assert result.exit_code == code, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "Traceback" not in result.output and len(errors) == 1, result.output
    assert result.output.rstrip().endswith(errors[0]) and all(word in errors[0] for word in words), result.output


def test_the_cli_exports_pushes_privately_and_sends_the_token_to_the_hub_alone(tmp_path, hub):
    make_run(tmp_path / "runs", "tiny-hyperbolic-d2", name="hyp")
    out = tmp_path / "exports" / "hyp"
    result = runner.invoke(app, ["export", "hyp", str(out), "--push", "me/hyp", "--license", "mit",
                                 "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert sorted(hub.models["me/hyp"]) == sorted(p.name for p in out.iterdir()) == sorted(exported.FILES[:2] +
                                                                                          (exported.CARD,))
    assert "me/hyp" in hub.private and {path.split("/")[0] for _, path in hub.authorized} <= {"api", "me", "verify"}
    hosts = {host for host, _ in hub.authorized}
    assert hosts == {hub.url.removeprefix("http://")}, hosts  # never the CDN (localhost) that took the upload
    assert any(path.startswith("upload/lfs/") for _, path, host in hub.requests if host.startswith("localhost"))
    assert "license: mit" in (out / exported.CARD).read_text()
    # private: without a token, nobody reads it, and the import says so in one line
    os.environ.pop("HF_TOKEN")
    result = runner.invoke(app, ["import", "euclip-export", "hf://me/hyp", "--name", "back", "--runs-dir",
                                 str(tmp_path / "runs")])
    one_error_line(result, 2, "me/hyp", "HF_TOKEN")
    assert not (tmp_path / "runs" / "back").exists()
    os.environ["HF_TOKEN"] = TOKEN
    result = runner.invoke(app, ["import", "euclip-export", "hf://me/hyp", "--name", "back", "--runs-dir",
                                 str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "runs" / "back" / "meta.json").read_text())["imported"]["exported_from"]["run"] == "hyp"


def test_a_push_that_cannot_be_done_leaves_nothing_behind(tmp_path, hub, monkeypatch):
    runs = tmp_path / "runs"
    make_run(runs, "tiny-meru", name="meru")
    hub.models["me/taken"] = {"README.md": b"someone else's"}
    # a taken name: the export folder is complete, the existing repository untouched, exit 2
    result = runner.invoke(app, ["export", "meru", str(tmp_path / "a"), "--push", "me/taken", "--runs-dir", str(runs)])
    one_error_line(result, 2, "me/taken", "already has", f"euclip push {tmp_path / 'a'}")
    assert hub.models["me/taken"] == {"README.md": b"someone else's"}
    assert exported.read(tmp_path / "a")[0]["provenance"]["run"] == "meru"  # whole, to push again from
    # the Hub fails the commit: the repository the push created is deleted, exit 1
    hub.refuse_commit = True
    result = runner.invoke(app, ["export", "meru", str(tmp_path / "b"), "--push", "me/new", "--runs-dir", str(runs)])
    one_error_line(result, 1, "me/new", "deleted", f"euclip push {tmp_path / 'b'} me/new")
    assert "me/new" not in hub.models and ("POST", "api/repos/create", hub.url.removeprefix("http://")) in hub.requests
    # pushed again, from the folder or straight from the run, once the Hub is back
    hub.refuse_commit = False
    assert runner.invoke(app, ["push", str(tmp_path / "b"), "me/new"]).exit_code == 0
    result = runner.invoke(app, ["push", "meru", "me/straight", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    assert sorted(hub.models["me/new"]) == sorted(hub.models["me/straight"]) == sorted(p.name for p in
                                                                                       (tmp_path / "b").iterdir())
    # no token: said before anything is written, locally or on the Hub
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    result = runner.invoke(app, ["export", "meru", str(tmp_path / "c"), "--push", "me/other", "--runs-dir", str(runs)])
    one_error_line(result, 2, "HF_TOKEN")
    assert not (tmp_path / "c").exists() and "me/other" not in hub.models


def test_bad_inputs_are_one_line_and_nothing_partial_is_left(tmp_path):
    runs = tmp_path / "runs"
    run = make_run(runs, "tiny-clip", name="clip")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["export", "clip", str(busy), "--runs-dir", str(runs)])
    one_error_line(result, 2, str(busy), "not empty")
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt"] and (busy / "notes.txt").read_text() == "mine"
    empty = RunDir(runs / "untrained")
    empty.claim(run.config(), {})
    result = runner.invoke(app, ["export", "untrained", str(tmp_path / "out"), "--runs-dir", str(runs)])
    one_error_line(result, 2, "no checkpoint")
    assert not (tmp_path / "out").exists()
    result = runner.invoke(app, ["export", "clip", str(tmp_path / "out2"), "--push", "not-a-repo", "--runs-dir",
                                 str(runs)])
    one_error_line(result, 2, "OWNER/NAME")
    # not an export, or a damaged one, as an import source: named in one line, no run written
    for folder, broken in [("plain", None), ("damaged", exported.WEIGHTS), ("badjson", exported.CONFIG)]:
        path = tmp_path / folder
        if folder != "plain":
            runner.invoke(app, ["export", "clip", str(path), "--runs-dir", str(runs)])
            (path / broken).write_bytes(b"\x00not what it should be")
        else:
            path.mkdir()
        result = runner.invoke(app, ["import", "euclip-export", str(path), "--name", folder, "--runs-dir", str(runs)])
        one_error_line(result, 2, broken or exported.CONFIG)
        assert not (runs / folder).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def _relabelled(described):  # the whole story changed to Euclidean d2; only the weights' header still says clip
    for geometry in (described["geometry"], described["config"]["geometry"]):
        geometry.update(name="euclidean", logit="d2")


@pytest.mark.parametrize("edit, named", [
    (_relabelled, "model.safetensors's header: geometry says 'clip', the run's config 'euclidean'"),
    (lambda d: d["geometry"].update(name="hyperbolic"), "geometry.name says 'hyperbolic', the run's config 'clip'"),
    (lambda d: d.update(final_ln=False), "final_ln says False, the run's config True"),
    (lambda d: d["preprocess"].update(image_size=224), "preprocess.image_size says 224, the run's config 64")])
def test_an_export_that_contradicts_itself_is_refused_naming_the_statement(tmp_path, edit, named):
    """A CLIP export relabelled as another geometry once imported with exit 0 and scored in that geometry."""
    runs = tmp_path / "runs"
    make_run(runs, "tiny-clip", name="clip")
    folder = tmp_path / "export"
    assert runner.invoke(app, ["export", "clip", str(folder), "--runs-dir", str(runs)]).exit_code == 0
    described = json.loads((folder / exported.CONFIG).read_text())
    edit(described)
    (folder / exported.CONFIG).write_text(json.dumps(described))
    result = runner.invoke(app, ["import", "euclip-export", str(folder), "--name", "back", "--runs-dir", str(runs)])
    one_error_line(result, 2, "contradicts itself", named)
    assert not (runs / "back").exists()


def test_a_failed_export_removes_its_staging_folder(tmp_path, monkeypatch):
    from euclip_cli import publish

    run = make_run(tmp_path / "runs", "tiny-clip")

    def broken_card(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish, "model_card", broken_card)
    with pytest.raises(OSError):
        publish.export_run(run, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


@pytest.mark.slow
def test_a_trained_run_goes_out_and_back_through_the_cli_in_fresh_processes(tmp_path, world):
    """The command line as a user runs it: train, eval, export --push to the Hub, import from it, eval."""
    hub = FakeHub({}, tokens=(TOKEN,))
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN, HF_HUB_CACHE=str(tmp_path / "cache"))
    runs = str(tmp_path / "runs")

    def euclip(*args):
        done = subprocess.run([sys.executable, "-m", "euclip_cli", *args], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    try:
        euclip("train", "--recipe", "tiny-euclip", "--name", "mine", "--runs-dir", runs, f"data.train_dir={world / 'train'}",
               "data.batch_size=32", "optim.samples=128", "optim.warmup_steps=2", "train.precision=fp32")
        euclip("eval", "mine", "--tasks", "world/shapes", "--world", str(world), "--runs-dir", runs)
        euclip("export", "mine", str(tmp_path / "out"), "--push", "me/mine", "--runs-dir", runs)
        euclip("import", "euclip-export", "hf://me/mine", "--name", "back", "--runs-dir", runs)
        euclip("eval", "back", "--tasks", "world/shapes", "--world", str(world), "--runs-dir", runs)
    finally:
        hub.stop()
    # What reads the imported run from its folder alone, in this process (the Hub plays no part).
    for args in (["analyze", "distances", "back", "--world", str(world), "--runs-dir", runs],
                 ["report", "--table", "embedded", "--runs-dir", runs, "--out", str(tmp_path / "tables")]):
        done = runner.invoke(app, args)
        assert done.exit_code == 0, done.output
    first, second = (RunDir(tmp_path / "runs" / name).latest_results()[0]["metrics"] for name in ("mine", "back"))
    assert second == pytest.approx(first, abs=1e-6)
    assert f"{first['main_metric']:.4f}" in (tmp_path / "out" / exported.CARD).read_text()
    assert "back (imported: euclip-export)" in (tmp_path / "tables" / "embedded.md").read_text()
    assert (tmp_path / "runs" / "back" / "analysis").is_dir()


def test_an_export_whose_weights_its_config_does_not_fit_gets_advice_this_import_takes(tmp_path):
    """An export's config names its own model, so import euclip-export refuses --geometry and --arch; its
    advice for weights that do not fit must not send the user to them."""
    runs = tmp_path / "runs"
    make_run(runs, "tiny-clip", name="clip")
    folder = tmp_path / "export"
    assert runner.invoke(app, ["export", "clip", str(folder), "--runs-dir", str(runs)]).exit_code == 0
    described = json.loads((folder / exported.CONFIG).read_text())
    described["config"]["model"]["class_tokens"] = 2  # a model the weights are not
    (folder / exported.CONFIG).write_text(json.dumps(described))
    result = runner.invoke(app, ["import", "euclip-export", str(folder), "--name", "back", "--runs-dir", str(runs)])
    one_error_line(result, 2, "euclip_config.json does not describe its weights", "export the run again")
    assert "--geometry" not in result.output
    assert not (runs / "back").exists()


def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """safetensors reports its write's OS error as a SafetensorError, which gave a traceback."""
    from safetensors import SafetensorError
    import safetensors.torch

    runs = tmp_path / "runs"
    make_run(runs, "tiny-clip", name="clip")

    def full_disk(tensors, filename, metadata=None):
        open(filename, "wb").write(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    result = runner.invoke(app, ["export", "clip", str(tmp_path / "out"), "--runs-dir", str(runs)])
    one_error_line(result, 1, "open_clip_model.safetensors could not be written", "No space left on device",
                   "export again")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
