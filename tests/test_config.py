"""The schema, recipes and strict overrides."""

import math

import pytest

from euclip_cli import config as C
from euclip_cli.published import euclip_tables as read_paper


def test_defaults_are_the_papers_common_setting():
    cfg = C.Config()
    assert (cfg.model.arch, cfg.data.batch_size, cfg.optim.lr, cfg.optim.warmup_steps) == ("ViT-B-32", 4096, 5e-4, 500)
    assert (cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay) == (0.9, 0.98, 1e-6, 0.2)
    assert C.total_steps(cfg) == 3125
    assert C.initial_logit_scale(cfg) == pytest.approx(math.log(1 / 0.07))


def test_d2_logits_start_at_beta_one():
    assert C.initial_logit_scale(C.load_config(None, ["geometry.name=euclidean", "geometry.logit=d2"])) == 0.0


def test_overrides_are_type_checked():
    cfg = C.load_config("tiny-clip", ["optim.lr=2e-3", "model.final_ln=false", "optim.samples=1.28e4",
                                      "geometry.logit_scale_min_log=none", "report.paper_rows=4:CLIP,8:CLIP"])
    assert cfg.optim.lr == 2e-3 and cfg.model.final_ln is False and cfg.optim.samples == 12800
    assert cfg.geometry.logit_scale_min_log is None and cfg.report.paper_rows == ["4:CLIP", "8:CLIP"]


def test_a_data_order_seed_that_is_not_an_integer_is_named_by_its_key():
    with pytest.raises(C.ConfigError) as err:
        C.load_config("tiny-clip", ["data.order_seed=abc"])
    assert err.value.problems == ["override 'data.order_seed=abc': bad value 'abc' for 'data.order_seed': "
                                  "expected an integer within 64 bits or none"]


def test_an_embedded_world_without_evaluation_images_is_refused_by_its_key():
    with pytest.raises(C.ConfigError) as err:
        C.load_config("tiny-clip", ["data.world_eval_size=0"])
    assert err.value.problems == ["data.world_eval_size: 0 must lie in [1, ∞)"]


@pytest.mark.parametrize("scale", ["0.2", "2.5"])
def test_an_object_scale_outside_its_range_is_refused_by_its_key(scale):
    with pytest.raises(C.ConfigError) as err:
        C.load_config("tiny-clip", [f"data.world_object_scale={scale}"])
    assert err.value.problems == [f"data.world_object_scale: {float(scale)} must lie in [0.3, 2]"]


def test_the_worlds_config_keys_and_download_options_are_its_settings():
    """Each embedded-world setting (``worlddir.WorldSettings``) is a config key ``data.world_<name>`` and a
    ``download world`` option with its default, type and help; nothing else spells them."""
    import typing

    from typer.testing import CliRunner

    from euclip_cli.cli.main import app
    from euclip_cli.worlddir import SETTINGS, WorldSettings

    hints, schema = typing.get_type_hints(WorldSettings), C.schema()["data"]
    data = C.DataConfig()
    assert [k for k in schema if k.startswith("world_")] == [f"world_{f.name}" for f in SETTINGS]
    for f in SETTINGS:
        assert schema[f"world_{f.name}"] is hints[f.name] and getattr(data, f"world_{f.name}") == f.default
    shown = CliRunner().invoke(app, ["download", "world", "--help"], env={"COLUMNS": "300"}).output
    for f in SETTINGS:
        line = next(l for l in shown.splitlines() if f"│ --{f.name.replace('_', '-')} " in l)
        assert f.metadata["help"][:30] in line and f"[default: {f.default}]" in line


@pytest.mark.parametrize("key,value,allowed", [("seed", 2 ** 63, "[-9223372036854775808, 9223372036854775807]"),
                                               ("samples", 0, "[1, ∞)"), ("mismatch", 1.0, "[0, 1)"),
                                               ("mismatch", -0.01, "[0, 1)"), ("object_scale", 2.01, "[0.3, 2]")])
def test_a_world_setting_outside_its_range_is_one_problem_naming_it(key, value, allowed):
    from euclip_cli.worlddir import WorldSettings, problems

    assert problems(WorldSettings(**{key: value})) == [(key, value, allowed)]
    edge = {"seed": 2 ** 63 - 1, "samples": 1, "mismatch": 0.0, "object_scale": 2.0}[key]
    assert problems(WorldSettings(**{key: edge})) == []


def test_a_temperature_rate_that_is_not_positive_is_refused_by_its_key():
    with pytest.raises(C.ConfigError) as err:
        C.load_config("tiny-clip", ["optim.scalar_lr_scale=0"])
    assert err.value.problems == ["optim.scalar_lr_scale: must be a positive finite number"]


def test_every_problem_is_reported_together_naming_key_and_allowed_values():
    with pytest.raises(C.ConfigError) as err:
        C.load_config("tiny-clip", ["optim.lrr=1", "geometry.name=poincare", "optim.lr=fast", "nodot", "train.precision=fp8"])
    problems = err.value.problems
    assert len(problems) == 5
    assert any("unknown key 'optim.lrr'" in p and "lr" in p for p in problems)
    assert any("'geometry.name'" in p and "clip, elliptic, euclidean, hyperbolic, product-sphere" in p for p in problems)
    assert any("'optim.lr'" in p and "a number" in p for p in problems)
    assert any("section.key=value" in p for p in problems)
    assert any("fp32, bf16, fp16" in p for p in problems)


def test_cross_field_rules():
    with pytest.raises(C.ConfigError, match="no entailment"):
        C.load_config(None, ["loss.entail_weight=0.1"])  # clip has no entailment cone
    with pytest.raises(C.ConfigError, match="not a logit of geometry"):
        C.load_config(None, ["geometry.logit=d2"])
    with pytest.raises(C.ConfigError, match="does not divide"):
        C.load_config("tiny-clip", ["optim.accum_steps=3"])
    with pytest.raises(C.ConfigError, match="only euclip's loader prefixes captions"):
        C.load_config("meru-vit-s", ["data.pipeline=openclip"])
    with pytest.raises(C.ConfigError, match="data.subreddit_prefix: a probability"):
        C.load_config("meru-vit-s", ["data.subreddit_prefix=1.5"])
    # A bound that is not positive is named; the lower bound is not compared with its logarithm.
    with pytest.raises(C.ConfigError, match="geometry.logit_scale_max: must be positive"):
        C.load_config("tiny-clip", ["geometry.logit_scale_max=0"])


def test_malformed_and_missing_recipes(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim\nlr = 1")
    with pytest.raises(C.ConfigError, match="not valid TOML"):
        C.load_config(str(bad))
    typo = tmp_path / "typo.toml"
    typo.write_text('extends = "tiny-clip"\n[optim]\nlearning_rate = 1e-3\n[geometri]\nname = "clip"\n')
    with pytest.raises(C.ConfigError) as err:
        C.load_config(str(typo))
    assert len(err.value.problems) == 2
    with pytest.raises(C.ConfigError, match="not found"):
        C.load_config("no-such-recipe")


def test_a_recipe_says_none_as_an_override_does(tmp_path):
    """TOML has no null: "none" unsets any optional key in a recipe, as ``key=none`` does on the command line."""
    recipe = tmp_path / "unset.toml"
    recipe.write_text('extends = "tiny-clip"\n[geometry]\nlogit_scale_min_log = "none"\nlogit_scale_init = 1.5\n'
                      '[optim]\ngrad_clip = "NONE"\n')
    cfg = C.load_config(str(recipe))
    assert cfg.geometry.logit_scale_min_log is None and cfg.optim.grad_clip is None
    assert cfg.geometry.logit_scale_init == 1.5
    with pytest.raises(C.ConfigError, match="expected a number or none"):
        C.load_config(str(recipe), ["geometry.logit_scale_min_log=nothing"])


def test_extends_chain_applies_parents_first():
    cfg = C.load_config("medium-b16-euclip")
    assert cfg.model.arch == "ViT-B-16"  # its own
    assert (cfg.geometry.name, cfg.geometry.logit, cfg.model.final_ln) == ("euclidean", "d2", False)  # medium-euclip
    assert cfg.optim.samples == 128_000_000  # medium-clip
    assert cfg.train.precision == "fp16"  # small-clip


def test_config_round_trips_through_json():
    cfg = C.load_config("tiny-meru")
    assert C.from_dict(C.to_dict(cfg)) == cfg


@pytest.mark.parametrize("name", C.list_recipes())
def test_every_shipped_recipe_validates_and_has_a_header(name):
    from euclip_cli.study.spec import load_study

    load_study(name) if C.is_study_recipe(name) else C.load_config(name)
    header = C.recipe_header(name)
    assert header.startswith(f"{name}:") and "Run:" in header and "Expected:" in header


# Multi(n, m) recipes reproduce Sun and Li's system, which the EuCLIP paper's tables do not cover.
# MERU's recipes reproduce MERU's own tables (tests/test_redcaps.py).
PAPER_RECIPES = [n for n in C.list_recipes() if not n.startswith(("tiny-", "meru-", "hycoclip-")) and not C.is_study_recipe(n)
                 and C.load_config(n).model.class_tokens == 1]


def test_a_study_recipe_given_as_a_run_recipe_says_which_command_takes_it():
    with pytest.raises(C.ConfigError, match="euclip study --recipe study-geometries"):
        C.load_config("study-geometries")


@pytest.mark.parametrize("name", PAPER_RECIPES)
def test_paper_recipes_name_rows_that_exist_and_match_them(name):
    cfg = C.load_config(name)
    paper = read_paper()
    assert cfg.report.paper_rows, f"{name} names no paper row"
    for tag in cfg.report.paper_rows:
        table, label = tag.split(":", 1)
        rows = paper[(paper.table == int(table)) & (paper.label == label) & (paper.model == cfg.model.arch)]
        assert len(rows) == 1, f"{name}: {tag} for {cfg.model.arch} not in the paper's tables"
        row = rows.iloc[0]
        assert row.geometry == cfg.geometry.name and row.logit == C.resolved_logit(cfg).replace("cos", "cos")
        assert (row.final_ln == "ln") == cfg.model.final_ln
        assert float(row.entail_lambda) == cfg.loss.entail_weight
        if cfg.loss.entail_weight:
            assert float(row.entail_K) == cfg.loss.entail_min_radius
        scale = "medium" if cfg.optim.samples == 128_000_000 else "small"
        assert row.scale == scale


def test_every_paper_row_has_a_recipe():
    covered = {(tag, C.load_config(n).model.arch) for n in PAPER_RECIPES for tag in C.load_config(n).report.paper_rows}
    paper = read_paper()
    missing = [f"{r.table}:{r.label} ({r.model})" for r in paper.itertuples() if (f"{r.table}:{r.label}", r.model) not in covered]
    assert not missing, missing


@pytest.mark.parametrize("override,key", [("optim.lr=nan", "optim.lr"), ("optim.lr=-1e-3", "optim.lr"),
                                          ("data.workers=-1", "data.workers"), ("train.log_every=0", "train.log_every"),
                                          ("optim.beta2=1.5", "optim.beta2"), ("eval.batch_size=0", "eval.batch_size"),
                                          ("optim.warmup_steps=-5", "optim.warmup_steps")])
def test_values_a_library_would_choke_on_are_named_by_their_key(override, key):
    with pytest.raises(C.ConfigError, match=key.replace(".", r"\.")):
        C.load_config("tiny-clip", [override])


def test_a_key_typed_twice_is_refused_where_each_must_be_given_once_and_layers_merge_explicitly():
    with pytest.raises(C.ConfigError, match=r"optim\.lr is already given \('optim\.lr=1e-3'\)"):
        C.load_config("tiny-clip", ["optim.lr=1e-3", "optim.lr=2e-3"], each_key_once=True)
    assert C.load_config("tiny-clip", ["optim.lr=1e-3", "optim.lr=2e-3"]).optim.lr == 2e-3  # layered by code
    merged = C.layered_overrides(["optim.lr=1e-3", "data.workers=2"], ["optim.lr = 2e-3", "train.seed=1"])
    assert merged == ["data.workers=2", "optim.lr = 2e-3", "train.seed=1"]
    C.load_config("tiny-clip", merged, each_key_once=True)  # one of each
