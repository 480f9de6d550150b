"""``euclip import``: released checkpoints become runs whose embeddings and logits are the releases' own.

Test checkpoints carry the EuCLIP authors' fork's layout (OpenCLIP's ``{"state_dict": ...}`` with
DistributedDataParallel's ``module.`` prefix, open_clip's CLIP key names, log-space ``alpha_img``,
``alpha_txt`` and ``curvature`` for hyperbolic models, ``params.txt`` one folder up) on a small
ViT, with random weights. The reference forward is written from the fork's formulas (its
``CLIP.forward`` and ``METRICS``) in fp64, on open_clip's own towers loaded with the same weights.
"""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.encode import load_model
from euclip_cli.rundir import RunDir
from euclip_cli.towers import build_clip, remove_final_layernorm, tokenizer_for

runner = CliRunner()
ARCH = "tiny-vit"
SCALARS = {"alpha_img": -2.1, "alpha_txt": -2.4, "curvature": 3.0}  # exp(3) = 20: above the fork's clamp at 10


def fork_checkpoint(folder, geometry, final_ln=True, params=True, seed=0, extra=None, drop=None):
    """A checkpoint as the fork's training writes it: logs/NAME/{params.txt, checkpoints/epoch_3.pt}."""
    torch.manual_seed(seed)
    clip = build_clip(ARCH)
    if not final_ln:
        remove_final_layernorm(clip)
    with torch.no_grad():
        clip.logit_scale.fill_(math.log(30.0))
        for p in clip.parameters():
            p.add_(0.02 * torch.randn_like(p))  # off the initialisation, so nothing matches by accident
    state = {f"module.{k}": v for k, v in clip.state_dict().items()}
    if geometry.startswith("hyperbolic"):
        state.update({f"module.{k}": torch.tensor(v) for k, v in SCALARS.items()})
    state.update(extra or {})
    for key in drop or []:
        del state[key]
    (folder / "checkpoints").mkdir(parents=True)
    path = folder / "checkpoints" / "epoch_3.pt"
    torch.save({"epoch": 3, "name": folder.name, "state_dict": state}, path)
    if params:
        model = ARCH + ("" if final_ln else "-no-final-ln")
        (folder / "params.txt").write_text(f"accum_freq: 1\ngeometry: {geometry}\nlr: 0.0005\nmodel: {model}\n")
    return path


def reference(path, geometry, final_ln, images, tokens):
    """The fork's forward in fp64: image and text embeddings (tangent vectors for hyperbolic) and logits."""
    state = torch.load(path, weights_only=True)["state_dict"]
    state = {k.removeprefix("module."): v.double() for k, v in state.items()}
    clip = build_clip(ARCH).double()
    if not final_ln:
        remove_final_layernorm(clip)
    clip.load_state_dict({k: v for k, v in state.items() if k not in SCALARS})
    with torch.no_grad():
        f_img, f_txt = clip.encode_image(images), clip.encode_text(tokens)  # open_clip's padded text forward
    scale = state["logit_scale"].exp()
    dim = f_img.shape[1]
    if geometry == "clip":
        x, y = f_img / f_img.norm(dim=1, keepdim=True), f_txt / f_txt.norm(dim=1, keepdim=True)
        return x, y, scale * x @ y.T
    if geometry.startswith("euclidean"):
        x, y = f_img / math.sqrt(dim), f_txt / math.sqrt(dim)
        sq = (x * x).sum(1)[:, None] - 2 * x @ y.T + (y * y).sum(1)[None]  # the fork's law-of-cosines form
        return x, y, scale * (-sq if geometry == "euclidean-squared" else -sq.sqrt())
    x, y = state["alpha_img"].exp() * f_img, state["alpha_txt"].exp() * f_txt
    c = state["curvature"].exp().clamp(0.1, 10.0)  # clamped in the fork's forward

    def lift(v):
        r = c.sqrt() * v.norm(dim=1, keepdim=True)
        space = torch.sinh(r) / r * v
        return space, (1 / c + (space * space).sum(1)).sqrt()

    (xs, xt), (ys, yt) = lift(x), lift(y)
    dist = torch.acosh(-c * (xs @ ys.T - xt[:, None] * yt[None])) / c.sqrt()
    return x, y, scale * (-dist.square() if geometry == "hyperbolic-squared" else -dist)


def imported(runs, name):
    model, cfg, _, _ = load_model(RunDir(runs / name), torch.device("cpu"))
    return model.double(), cfg


@pytest.mark.parametrize("geometry,final_ln", [("clip", True), ("euclidean-squared", False),
                                               ("hyperbolic", True), ("hyperbolic-squared", False)])
def test_an_authors_checkpoint_gives_the_forks_embeddings_and_logits(tmp_path, geometry, final_ln):
    path = fork_checkpoint(tmp_path / "logs" / "run", geometry, final_ln)
    runs = tmp_path / "runs"
    result = runner.invoke(app, ["import", "euclip-authors", str(path), "--name", "authors", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    model, cfg = imported(runs, "authors")
    assert cfg.model.final_ln == final_ln and cfg.model.arch == ARCH
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(3, 3, 64, 64, generator=gen, dtype=torch.float64)
    tokens = tokenizer_for(ARCH)(["a red star", "two small blue circles on the left", "a shape"])
    want_x, want_y, want_logits = reference(path, geometry, final_ln, images, tokens)
    with torch.no_grad():
        x, y = model.encode_image(images), model.encode_text(tokens)
        logits = model.logit_scale() * model.geometry.similarity(x, y, model.curvature())
    torch.testing.assert_close(x, want_x, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(y, want_y, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(logits, want_logits, atol=1e-6, rtol=1e-6)
    meta = json.loads((runs / "authors" / "meta.json").read_text())["imported"]
    assert meta["format"] == "euclip-authors" and meta["fork_geometry"] == geometry and len(meta["sha256"]) == 64
    if geometry.startswith("hyperbolic"):
        assert model.curvature().item() == pytest.approx(10.0)  # the fork's clamp, applied at import

    again = runner.invoke(app, ["import", "euclip-authors", str(path), "--name", "authors", "--runs-dir", str(runs)])
    assert again.exit_code == 0, again.output  # the same import twice is a no-op


def test_without_params_txt_the_geometry_comes_from_the_command_line(tmp_path):
    path = fork_checkpoint(tmp_path / "logs" / "run", "euclidean-squared", params=False)
    runs = tmp_path / "runs"
    refused = runner.invoke(app, ["import", "euclip-authors", str(path), "--name", "a", "--runs-dir", str(runs)])
    assert refused.exit_code == 2 and "give --geometry and --logit" in refused.output
    assert not (runs / "a").exists()
    result = runner.invoke(app, ["import", "euclip-authors", str(path), "--name", "a", "--runs-dir", str(runs),
                                 "--geometry", "euclidean", "--logit", "d2", "--arch", ARCH])
    assert result.exit_code == 0, result.output
    assert json.loads((runs / "a" / "config.json").read_text())["geometry"]["logit"] == "d2"


@pytest.mark.parametrize("case,code,message", [
    ("missing key", 2, "key(s) the model needs are missing (first: clip.text_projection)"),
    ("unexpected key", 2, "key(s) are not in the model (first: clip.poincare_ball)"),
    ("wrong geometry", 2, "key(s) are not in the model (first: log_alpha_img)"),
    ("unknown geometry", 2, "names the geometry 'poincare'"),
    ("wrong arch", 2, "has shape"),
    ("corrupt file", 1, "not a readable torch checkpoint"),
    ("no file", 2, "no such file"),
])
def test_a_bad_checkpoint_is_named_in_one_line_and_nothing_is_written(tmp_path, case, code, message):
    folder = tmp_path / "logs" / "run"
    extra = {"module.poincare_ball": torch.zeros(2)} if case == "unexpected key" else None
    drop = ["module.text_projection"] if case == "missing key" else None
    geometry = "hyperbolic" if case == "wrong geometry" else "clip"
    path = fork_checkpoint(folder, geometry, extra=extra, drop=drop)
    args = []
    if case == "wrong geometry":  # hyperbolic weights read as a Euclidean model: its scalars have no home
        args = ["--geometry", "euclidean", "--logit", "d2"]
    if case == "unknown geometry":
        (folder / "params.txt").write_text(f"geometry: poincare\nmodel: {ARCH}\n")
    if case == "wrong arch":
        args = ["--arch", "tiny-vit-32"]  # the same ViT layout, patch 4 instead of 8
    if case == "corrupt file":
        path.write_bytes(path.read_bytes()[:5000])
    if case == "no file":
        path = folder / "epoch_99.pt"
    runs = tmp_path / "runs"
    result = runner.invoke(app, ["import", "euclip-authors", str(path), "--name", "bad", "--runs-dir", str(runs),
                                 *args])
    assert result.exit_code == code, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 or "error:" in result.output.splitlines()[0]
    assert not (runs / "bad").exists()


def test_a_hub_id_is_read_through_huggingface_hubs_cache(tmp_path, monkeypatch):
    """hf://OWNER/REPO/PATH in offline mode, from a cache laid out as huggingface_hub writes it."""
    from huggingface_hub import constants

    source = tmp_path / "logs" / "run"
    path = fork_checkpoint(source, "hyperbolic")
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--nahidalam--geometries"
    snapshot = repo / "snapshots" / revision / "meru-b16"
    (snapshot / "checkpoints").mkdir(parents=True)
    (snapshot / "checkpoints" / "epoch_3.pt").write_bytes(path.read_bytes())
    (snapshot / "params.txt").write_text((source / "params.txt").read_text())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    # HF_HUB_CACHE and HF_HUB_OFFLINE as huggingface_hub holds them: it read the variables once, on import.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    command = ["import", "euclip-authors", "hf://nahidalam/geometries/meru-b16/checkpoints/epoch_3.pt", "--name", "hub",
               "--runs-dir", str(tmp_path / "runs")]
    done = runner.invoke(app, command)
    assert done.exit_code == 0, done.output
    config = json.loads((tmp_path / "runs" / "hub" / "config.json").read_text())
    assert config["geometry"]["name"] == "hyperbolic"  # from the params.txt one folder up, in the cache
    missing = runner.invoke(app, [*command[:2], "hf://nahidalam/geometries/nothing.pt", *command[3:-1],
                                  str(tmp_path / "runs2")])
    assert missing.exit_code == 1 and "not in the local Hugging Face cache" in " ".join(missing.output.split())


@pytest.mark.slow
def test_an_imported_run_evaluates_analyses_and_reports_like_a_trained_one(tmp_path, world):
    path = fork_checkpoint(tmp_path / "logs" / "run", "hyperbolic")
    runs = tmp_path / "runs"
    assert runner.invoke(app, ["import", "euclip-authors", str(path), "--name", "authors-meru",
                               "--runs-dir", str(runs)]).exit_code == 0
    result = runner.invoke(app, ["eval", str(runs / "authors-meru"), "--tasks", "world:main", "--world", str(world)])
    assert result.exit_code == 0, result.output
    for analysis in (["distances", "--protocol", "euclip"], ["isotropy", "--k", "8"], ["traverse", "--images", "5"]):
        result = runner.invoke(app, ["analyze", analysis[0], "authors-meru", *analysis[1:], "--world", str(world),
                                     "--runs-dir", str(runs)])
        assert result.exit_code == 0, result.output
    report = runner.invoke(app, ["report", "--table", "embedded", "--runs-dir", str(runs), "--out",
                                 str(tmp_path / "tables")])
    assert report.exit_code == 0, report.output
    assert "authors-meru (imported: euclip-authors)" in (tmp_path / "tables" / "embedded.md").read_text()


# ---- MERU's checkpoints (facebookresearch/meru): its key names, written out; small towers for speed.
MERU_TEST = dict(embed_dim=32, text_cfg=dict(context_length=77, vocab_size=49408, width=64, heads=2, layers=2))
MERU_SCALARS = {"visual_alpha": 0.3, "textual_alpha": -2.5, "curv": 3.0}  # alpha > 0 and c = 20: both clamped


@pytest.fixture
def meru_test_arch(monkeypatch):
    from euclip_cli.towers import archs

    monkeypatch.setitem(archs.ARCHS, "meru-test", archs.meru_arch("meru-test", "vit_tiny_patch16_224", **MERU_TEST))
    return "meru-test"


def meru_checkpoint(path, hyperbolic=True, seed=0):
    """MERU's layout: timm's ViT under visual.*, its text encoder under textual.*, bias-free projections."""
    import timm

    torch.manual_seed(seed)
    trunk = timm.create_model("vit_tiny_patch16_224", num_classes=0, global_pool="token",
                              norm_layer=torch.nn.LayerNorm)
    state = {f"visual.{k}": v + 0.02 * torch.randn_like(v) for k, v in trunk.state_dict().items()}
    w, layers, embed = 64, 2, 32
    state.update({"textual.token_embed.weight": 0.02 * torch.randn(49408, w),
                  "textual.posit_embed": 0.01 * torch.randn(77, w),
                  "textual.ln_final.weight": 1 + 0.1 * torch.randn(w), "textual.ln_final.bias": 0.1 * torch.randn(w),
                  "textual.attn_mask": torch.triu(torch.ones(77, 77, dtype=torch.bool), diagonal=1),
                  "visual_proj.weight": torch.randn(embed, 192) / 192 ** 0.5,
                  "textual_proj.weight": torch.randn(embed, w) / w ** 0.5,
                  "logit_scale": torch.tensor(math.log(30.0)),
                  "pixel_mean": torch.tensor([0.485, 0.456, 0.406]).view(-1, 1, 1),
                  "pixel_std": torch.tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)})
    for i in range(layers):
        block = f"textual.resblocks.{i}."
        state.update({block + "attn.in_proj_weight": torch.randn(3 * w, w) / w ** 0.5,
                      block + "attn.in_proj_bias": 0.1 * torch.randn(3 * w),
                      block + "attn.out_proj.weight": torch.randn(w, w) / w ** 0.5,
                      block + "attn.out_proj.bias": 0.1 * torch.randn(w),
                      block + "ln_1.weight": 1 + 0.1 * torch.randn(w), block + "ln_1.bias": 0.1 * torch.randn(w),
                      block + "mlp.c_fc.weight": torch.randn(4 * w, w) / w ** 0.5,
                      block + "mlp.c_fc.bias": 0.1 * torch.randn(4 * w),
                      block + "mlp.c_proj.weight": torch.randn(w, 4 * w) / (4 * w) ** 0.5,
                      block + "mlp.c_proj.bias": 0.1 * torch.randn(w),
                      block + "ln_2.weight": 1 + 0.1 * torch.randn(w), block + "ln_2.bias": 0.1 * torch.randn(w)})
    if hyperbolic:
        state.update({k: torch.tensor(v) for k, v in MERU_SCALARS.items()})
    torch.save({"model": state, "iteration": 120000}, path)
    return state


def meru_reference(state, images01, tokens, hyperbolic):
    """MERU's forward written out in fp64: its image normalisation, timm ViT, its text blocks, its scalars."""
    import timm

    f = torch.nn.functional
    s = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    trunk = timm.create_model("vit_tiny_patch16_224", num_classes=0, global_pool="token",
                              norm_layer=torch.nn.LayerNorm).double()
    trunk.load_state_dict({k[len("visual."):]: v for k, v in s.items() if k.startswith("visual.")})
    with torch.no_grad():
        image = trunk((images01 - s["pixel_mean"]) / s["pixel_std"]) @ s["visual_proj.weight"].T
    n = tokens.shape[1]
    x = s["textual.token_embed.weight"][tokens] + s["textual.posit_embed"][:n]
    mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
    heads, w = 2, x.shape[-1]
    for i in range(2):
        b = {k.split(f"resblocks.{i}.")[1]: v for k, v in s.items() if f"resblocks.{i}." in k}
        h = f.layer_norm(x, (w,), b["ln_1.weight"], b["ln_1.bias"])
        q, k, v = (h @ b["attn.in_proj_weight"].T + b["attn.in_proj_bias"]).split(w, dim=-1)
        split = lambda t: t.reshape(*t.shape[:2], heads, w // heads).transpose(1, 2)  # noqa: E731
        att = torch.softmax(split(q) @ split(k).transpose(-1, -2) / math.sqrt(w // heads) + mask, dim=-1)
        out = (att @ split(v)).transpose(1, 2).reshape(x.shape)
        x = x + out @ b["attn.out_proj.weight"].T + b["attn.out_proj.bias"]
        h = f.layer_norm(x, (w,), b["ln_2.weight"], b["ln_2.bias"])
        x = x + f.gelu(h @ b["mlp.c_fc.weight"].T + b["mlp.c_fc.bias"]) @ b["mlp.c_proj.weight"].T + b["mlp.c_proj.bias"]
    x = f.layer_norm(x, (w,), s["textual.ln_final.weight"], s["textual.ln_final.bias"])
    text = x[torch.arange(len(tokens)), tokens.argmax(dim=-1)] @ s["textual_proj.weight"].T
    scale = s["logit_scale"].exp()
    if not hyperbolic:
        image, text = f.normalize(image, dim=-1), f.normalize(text, dim=-1)
        return image, text, scale * image @ text.T
    image = image * s["visual_alpha"].clamp(max=0).exp()
    text = text * s["textual_alpha"].clamp(max=0).exp()
    c = s["curv"].clamp(math.log(0.1), math.log(10)).exp()

    def lift(v):
        # MERU's exp_map0 caps the sinh argument at asinh(2^15) (meru/lorentz.py); these features reach it.
        r = c.sqrt() * v.norm(dim=1, keepdim=True)
        space = torch.sinh(r.clamp(1e-8, math.asinh(2 ** 15))) / r * v
        return space, (1 / c + (space * space).sum(1)).sqrt()

    (xs, xt), (ys, yt) = lift(image), lift(text)
    return image, text, -scale * torch.acosh(-c * (xs @ ys.T - xt[:, None] * yt[None])) / c.sqrt()


@pytest.mark.parametrize("hyperbolic", [True, False])
def test_a_meru_checkpoint_gives_merus_embeddings_and_logits(tmp_path, meru_test_arch, hyperbolic):
    from euclip_cli.towers import transforms_for

    path = tmp_path / ("meru_vit_test.pth" if hyperbolic else "clip_vit_test.pth")
    state = meru_checkpoint(path, hyperbolic)
    runs = tmp_path / "runs"
    result = runner.invoke(app, ["import", "meru", str(path), "--name", "meru", "--runs-dir", str(runs),
                                 "--arch", meru_test_arch])
    assert result.exit_code == 0, result.output
    model, cfg = imported(runs, "meru")
    assert cfg.geometry.name == ("hyperbolic" if hyperbolic else "clip")
    assert cfg.eval.tasks == "meru"  # evaluated on MERU's own suite unless --tasks says otherwise
    gen = torch.Generator().manual_seed(2)
    images01 = torch.rand(2, 3, 224, 224, generator=gen, dtype=torch.float64)
    tokens = tokenizer_for(meru_test_arch)(["a red star", "two small blue circles on the left", "a shape"])
    want_x, want_y, want_logits = meru_reference(state, images01, tokens, hyperbolic)
    normalize = transforms_for(model.clip)[1].transforms[-1]  # the run's own eval normalisation: ImageNet's
    with torch.no_grad():
        x, y = model.encode_image(normalize(images01)), model.encode_text(tokens)
        logits = model.logit_scale() * model.geometry.similarity(x, y, model.curvature())
    torch.testing.assert_close(x, want_x, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(y, want_y, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(logits, want_logits, atol=1e-6, rtol=1e-6)
    assert json.loads((runs / "meru" / "meta.json").read_text())["imported"]["format"] == "meru"


def test_a_meru_checkpoint_with_a_wrong_geometry_or_unknown_width_is_named(tmp_path, meru_test_arch):
    path = tmp_path / "meru.pth"
    meru_checkpoint(path)
    runs = tmp_path / "runs"
    wrong = runner.invoke(app, ["import", "meru", str(path), "--name", "m", "--runs-dir", str(runs),
                                "--geometry", "euclidean", "--logit", "d2"])
    assert wrong.exit_code == 2 and "is hyperbolic (d)" in wrong.output
    width = runner.invoke(app, ["import", "meru", str(path), "--name", "m", "--runs-dir", str(runs)])
    assert width.exit_code == 2 and "no MERU ViT of width 192" in width.output
    assert not (runs / "m").exists()


def test_merus_released_towers_hold_merus_key_layout():
    """euclip's meru-vit-s|b|l take MERU's checkpoint keys one to one (shapes from MERU's configs)."""
    from euclip_cli.released import _meru_key
    from euclip_cli.towers import build_clip

    for arch, width, depth in (("meru-vit-s", 384, 12), ("meru-vit-b", 768, 12)):
        with torch.device("meta"):
            clip = build_clip(arch)
        expected = {"clip." + k: v.shape for k, v in clip.state_dict().items()}
        # MERU's text keys for L12_W512 and its projections, from its text_encoders.py and models.py.
        meru = {"visual_proj.weight": (512, width), "textual_proj.weight": (512, 512),
                "textual.token_embed.weight": (49408, 512), "textual.posit_embed": (77, 512),
                "textual.ln_final.weight": (512,), "textual.ln_final.bias": (512,), "logit_scale": ()}
        for i in range(12):
            meru.update({f"textual.resblocks.{i}.attn.in_proj_weight": (1536, 512),
                         f"textual.resblocks.{i}.mlp.c_fc.weight": (2048, 512)})
        meru.update({"visual." + k[len("clip.visual.trunk."):]: v for k, v in expected.items()
                     if k.startswith("clip.visual.trunk.")})
        for key, shape in meru.items():
            name, value = _meru_key(key, torch.empty(shape, device="meta"))
            assert name in expected and tuple(value.shape) == tuple(expected[name]), key
        assert clip.visual.trunk.blocks[0].attn.num_heads == (12 if arch == "meru-vit-s" else 12)
        assert len(clip.visual.trunk.blocks) == depth


def test_the_released_table_puts_each_import_beside_its_published_row():
    from euclip_cli.report.tables import Run, released_table

    def run(name, fmt, arch, final_ln, geometry, logit, imagenet, meta=None):
        config = {"model": {"arch": arch, "final_ln": final_ln}, "geometry": {"name": geometry, "logit": logit}}
        return Run(name, "", config, {"datacomp": {"main": imagenet}}, fmt, meta or {"format": fmt})

    table = released_table([
        run("authors-euclip", "euclip-authors", "ViT-B-16", False, "euclidean", "d2", 0.3600),
        run("authors-meru", "euclip-authors", "ViT-B-16", True, "hyperbolic", "d", None),
        run("meru-b", "meru", "meru-vit-b", True, "hyperbolic", "d", 0.3700, {"format": "meru", "model": "MERU"}),
        run("clip-s", "meru", "meru-vit-s", True, "clip", "cos", 0.3430, {"format": "meru", "model": "CLIP baseline"}),
        run("odd", "euclip-authors", "ViT-B-32", True, "elliptic", "arccos", 0.2),
    ]).set_index("run")
    assert table.loc["authors-euclip", "published row"] == "EuCLIP Table 1: EuCLIP"
    assert table.loc["authors-euclip", "ImageNet (published)"] == 35.17 and table.loc["authors-euclip", "Δ"] == "+0.83"
    assert table.loc["authors-meru", "ImageNet (published)"] == 33.84 and table.loc["authors-meru", "Δ"] == "missing"
    assert table.loc["meru-b", "ImageNet (published)"] == 37.5 and table.loc["meru-b", "Δ"] == "-0.50"
    assert table.loc["clip-s", "ImageNet (published)"] == 34.3 and table.loc["clip-s", "Δ"] == "+0.00"
    assert table.loc["odd", "published row"] == "missing"  # no published model of that kind


@pytest.mark.parametrize("file, model, geometry", [("hycoclip_vit_test.pth", "HyCoCLIP", "hyperbolic"),
                                                   ("meru_vit_test.pth", "MERU", "hyperbolic"),
                                                   ("clip_vit_test.pth", "CLIP", "clip")])
def test_hycoclips_release_imports_each_model_as_merus_layout_named_by_its_file(tmp_path, meru_test_arch, file, model,
                                                                                geometry):
    """HyCoCLIP's checkpoints are MERU's layout (its HyCoCLIP class is MERU's model with another loss): the
    weights come in as MERU's import brings them, and the released file's name says which model it is."""
    path = tmp_path / file
    meru_checkpoint(path, hyperbolic=geometry == "hyperbolic")
    runs = tmp_path / "runs"
    for fmt in ("hycoclip", "meru"):
        result = runner.invoke(app, ["import", fmt, str(path), "--name", fmt, "--runs-dir", str(runs),
                                     "--arch", meru_test_arch])
        assert result.exit_code == 0, result.output
    (theirs, cfg), (merus, _) = imported(runs, "hycoclip"), imported(runs, "meru")
    assert cfg.geometry.name == geometry and cfg.eval.tasks == "meru"
    state, want = theirs.state_dict(), merus.state_dict()
    assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)
    meta = json.loads((runs / "hycoclip" / "meta.json").read_text())["imported"]
    assert meta["format"] == "hycoclip" and meta["model"] == model


@pytest.mark.parametrize("file, hyperbolic, message", [
    ("hycoclip_vit_test.pth", False, "named as HyCoCLIP's HyCoCLIP model, but its weights lack a curvature"),
    ("clip_vit_test.pth", True, "named as HyCoCLIP's CLIP model, but its weights hold a curvature"),
    ("renamed.pth", True, "import the file under its released name")])
def test_a_hycoclip_checkpoint_whose_name_and_weights_disagree_is_refused(tmp_path, meru_test_arch, file, hyperbolic,
                                                                          message):
    path = tmp_path / file
    meru_checkpoint(path, hyperbolic=hyperbolic)
    runs = tmp_path / "runs"
    result = runner.invoke(app, ["import", "hycoclip", str(path), "--name", "h", "--runs-dir", str(runs),
                                 "--arch", meru_test_arch])
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (runs / "h").exists()


def test_hycoclips_table_puts_each_import_beside_its_model_zoo_row():
    from euclip_cli.protocol.tasks import TASKS
    from euclip_cli.report.tables import HYCOCLIP_COLUMNS, Run, hycoclip_table, released_table

    assert all(task in TASKS and TASKS[task].suite == "meru" for _, _, task, _ in HYCOCLIP_COLUMNS)

    def run(name, arch, geometry, model, results, fmt="hycoclip"):
        config = {"model": {"arch": arch, "final_ln": True}, "geometry": {"name": geometry, "logit": "d"}}
        return Run(name, "", config, {"datacomp": {"main": None}}, fmt, {"format": fmt, "model": model}, results)

    results = {"meru/imagenet": {"mean_per_class_recall": 0.4210}, "meru/coco": {"text_retrieval_recall@10": 0.79,
                                                                                 "image_retrieval_recall@10": 0.6}}
    runs = [run("hyco-s", "meru-vit-s", "hyperbolic", "HyCoCLIP", results),
            run("clip-b", "meru-vit-b", "clip", "CLIP", {}),
            run("meru-release", "meru-vit-s", "hyperbolic", "MERU", results, fmt="meru")]  # MERU's own: not here
    table = hycoclip_table(runs)
    assert set(table["run"]) == {"hyco-s", "clip-b"} and len(table) == 10
    hyco = table[table["run"] == "hyco-s"].set_index("metric")
    assert hyco["model"].iloc[0] == "HyCoCLIP ViT-S/16"
    imagenet = table[(table["run"] == "hyco-s") & (table["dataset"] == "ImageNet")].iloc[0]
    assert (imagenet["HyCoCLIP"], imagenet["ours"], imagenet["Δ"]) == (41.7, "42.10", "+0.40")
    assert (hyco.loc["text_retrieval_recall@10", "Δ"], hyco.loc["image_retrieval_recall@10", "Δ"]) == ("-0.50", "-6.60")
    assert (table[table["run"] == "clip-b"]["Δ"] == "missing").all()
    assert table[(table["run"] == "clip-b") & (table["dataset"] == "Food-101")]["HyCoCLIP"].iloc[0] == 48.6
    empty = hycoclip_table([])
    assert len(empty) == 6 * len(HYCOCLIP_COLUMNS) and (empty["run"] == "missing").all()
    released = released_table(runs).set_index("run")
    assert released.loc["hyco-s", "published row"] == "HyCoCLIP's model zoo: HyCoCLIP ViT-S/16"
    assert released.loc["hyco-s", "ImageNet (published)"] == 41.7
