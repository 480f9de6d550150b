"""MERU's embedding-width study (its Table 3): a run starts from another run's towers (``model.init_from``),
frozen or not (``model.freeze_towers``), under fresh projections of its own width (``model.embed_dim``)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from typer.testing import CliRunner

from euclip_cli import config as C
from euclip_cli.cli.main import app
from euclip_cli.model import EuclipModel
from euclip_cli.rundir import RunDir, load_checkpoint
from euclip_cli.towers import archs, build_clip, projection_names
from euclip_cli.towers.text import text_features
from tests.test_datacomp_eval import TINY

runner = CliRunner()
# MERU's ViT-B and ViT-L are ViT-S's code at 4x and 13x its size: ViT-S stands for them here.
LARGE = {"meru-vit-b", "meru-vit-l"}


@pytest.mark.parametrize("arch,class_tokens", [(a, 1) for a in archs.local_names() if a not in LARGE]
                         + [("tiny-vit-c16", 8)])
def test_the_projections_are_the_last_maps_of_both_towers(arch, class_tokens):
    """Found from shapes alone, they are what each tower's output passes through last: with them zeroed
    both towers output zeros, at any width (an open_clip ViT's ``proj``, a ResNet's attention-pool output,
    a timm head, the class tokens' projections)."""
    names = projection_names(arch, class_tokens)
    assert any(n.startswith("visual.") for n in names) and any(not n.startswith("visual.") for n in names)
    torch.manual_seed(0)
    clip = build_clip(arch, class_tokens, 16 * class_tokens).eval()
    size = clip.visual.image_size
    images = torch.randn(2, 3, *(size if isinstance(size, (tuple, list)) else (size, size)))
    tokens = archs.lookup(arch).tokenizer()(["a red square", "two blue circles"])
    with torch.no_grad():
        assert clip.encode_image(images).shape == (2, 16 * class_tokens)
        assert text_features(clip, tokens).abs().amax() > 0
        state = clip.state_dict()
        for name in names:
            state[name].zero_()
        assert clip.encode_image(images).abs().amax() == 0 and text_features(clip, tokens).abs().amax() == 0


def test_frozen_towers_keep_their_batchnorm_statistics_while_the_projections_learn():
    cfg = C.load_config("tiny-clip", ["model.arch=tiny", "model.init_from=elsewhere", "model.freeze_towers=true"])
    model = EuclipModel(cfg).train()
    learning = {name for name, p in model.named_parameters() if p.requires_grad}
    assert learning == {"clip." + n for n in model.projection_names} | {"clip.logit_scale"}
    before = {k: v.clone() for k, v in model.clip.state_dict().items() if "running" in k}
    assert before
    model.encode_image(torch.randn(4, 3, 64, 64))
    assert all(torch.equal(model.clip.state_dict()[k], v) for k, v in before.items())
    # A model of free towers moves them: the check above can fail.
    free = EuclipModel(C.load_config("tiny-clip", ["model.arch=tiny"])).train()
    free.encode_image(torch.randn(4, 3, 64, 64))
    assert not all(torch.equal(free.clip.state_dict()[k], v) for k, v in before.items())


@pytest.fixture(scope="module")
def source(world, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    result = runner.invoke(app, ["train", "--recipe", "tiny-meru", f"data.train_dir={world / 'train'}", *TINY,
                                 "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    return runs / "tiny-meru"


def train(world, source, name, *overrides, start="tiny-meru"):
    return runner.invoke(app, ["train", "--recipe", "tiny-meru", f"data.train_dir={world / 'train'}", *TINY,
                               "--runs-dir", str(source.parent), "--name", name, f"model.init_from={start}",
                               *overrides])


def weights(run):
    return load_checkpoint(RunDir(run).latest_checkpoint())


@pytest.mark.slow
def test_a_width_run_learns_new_projections_and_scalars_on_the_frozen_towers_of_another(world, source):
    from euclip_cli.encode import load_model

    result = train(world, source, "w32", "model.freeze_towers=true", "model.embed_dim=32")
    assert result.exit_code == 0, result.output
    run = source.parent / "w32"
    theirs, mine = weights(source)["model"], weights(run)
    fresh = {"clip.text_projection", "clip.visual.proj", "clip.logit_scale", "log_alpha_img", "log_alpha_txt",
             "log_curv"}
    assert all(torch.equal(theirs[k], v) for k, v in mine["model"].items() if k not in fresh)
    assert mine["model"]["clip.visual.proj"].shape == (128, 32) and mine["meta"]["embed_dim"] == 32
    # Only the projections and the scalars were in the optimizer.
    assert len(mine["optimizer"]["state"]) == len(fresh)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["init_from"] == {"run": str(source), "checkpoint": "step_2.pt", "step": 2}
    # It started from the source's towers and MERU's fresh scalars (alpha = 1/sqrt(32), c = 1), not the
    # source's, and its projections learned from there.
    start, _, _, _ = load_model(RunDir(run), torch.device("cpu"), at_init=True)
    assert start.log_alpha_img.item() == pytest.approx(-0.5 * math.log(32)) and start.log_curv.item() == 0
    assert torch.equal(start.clip.transformer.resblocks[0].mlp.c_fc.weight,
                       theirs["clip.transformer.resblocks.0.mlp.c_fc.weight"])
    assert not torch.equal(start.clip.visual.proj, mine["model"]["clip.visual.proj"])
    # Resumed (here: already complete), it needs its own checkpoint only, not the run it started from.
    moved = source.parent / "moved"
    shutil.move(source, moved)
    try:
        again = train(world, source, "w32", "model.freeze_towers=true", "model.embed_dim=32")
        assert again.exit_code == 0 and "already complete" in again.output, again.output
    finally:
        shutil.move(moved, source)


@pytest.mark.slow
def test_unfrozen_towers_start_from_the_other_run_and_learn(world, source):
    result = train(world, source, "warm", "model.embed_dim=64")
    assert result.exit_code == 0, result.output
    theirs, mine = weights(source)["model"], weights(source.parent / "warm")["model"]
    block = "clip.transformer.resblocks.0.mlp.c_fc.weight"
    assert not torch.equal(theirs[block], mine[block])
    assert (mine[block] - theirs[block]).abs().amax() < 1e-2  # two small steps from there, not a fresh start


def test_a_run_to_start_from_that_is_missing_empty_or_of_other_towers_is_named(world, source, tmp_path):
    missing = train(world, source, "a", start="nowhere")
    empty = source.parent / "empty"
    empty.mkdir(exist_ok=True)
    (empty / "config.json").write_text(json.dumps(C.to_dict(C.load_config("tiny-meru"))))
    no_checkpoint = train(world, source, "b", start="empty")
    other = train(world, source, "c", "model.arch=tiny-vit")
    unholdable = train(world, source, "d", start="x" * 300)  # no file system holds such a name
    frozen_alone = runner.invoke(app, ["train", "--recipe", "tiny-meru", "model.freeze_towers=true",
                                       "--runs-dir", str(tmp_path)])
    for result, words in ((missing, "model.init_from: no run 'nowhere'"), (no_checkpoint, "has no readable checkpoint"),
                          (other, "model.arch=tiny-vit-c16"), (frozen_alone, "model.init_from=RUN"),
                          (unholdable, "model.init_from: a name in")):
        text = " ".join(result.output.split())
        assert result.exit_code == 2 and words in text and "Traceback" not in text, text
    assert not (source.parent / "a").exists() and not (source.parent / "c").exists()
