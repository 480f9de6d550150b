"""open_clip surgery and the learnable scalars."""

import math

import pytest
import torch

from euclip_cli import config as C
from euclip_cli.model import EuclipModel, build_clip, remove_final_layernorm


def test_removing_the_final_layernorm_removes_exactly_ln_post_and_ln_final():
    clip = build_clip("tiny-vit")
    before = set(dict(clip.named_parameters()))
    remove_final_layernorm(clip)
    after = set(dict(clip.named_parameters()))
    assert before - after == {"visual.ln_post.weight", "visual.ln_post.bias", "ln_final.weight", "ln_final.bias"}
    assert after <= before


def test_final_ln_flag_builds_the_model_without_them():
    model = EuclipModel(C.load_config("tiny-euclip", ["model.arch=tiny-vit"]))
    names = {n for n, _ in model.named_parameters()}
    assert not any("ln_post" in n or "ln_final" in n for n in names)
    assert any("ln_pre" in n for n in names)  # everything else stays


def test_hyperbolic_scalars_start_as_the_paper_says():
    model = EuclipModel(C.load_config("tiny-meru"))
    n = model.embed_dim
    assert model.log_alpha_img.item() == pytest.approx(math.log(n ** -0.5))
    assert model.log_alpha_txt.item() == pytest.approx(math.log(n ** -0.5))
    assert model.curvature().item() == pytest.approx(1.0)
    assert model.logit_scale().item() == pytest.approx(1 / 0.07, rel=1e-5)
    assert not hasattr(EuclipModel(C.load_config("tiny-clip")), "log_curv")


def test_resnet_tower_has_no_final_layernorm_to_remove():
    model = EuclipModel(C.load_config("tiny-euclip"))  # the tiny default tower is a ResNet
    names = {n for n, _ in model.named_parameters()}
    assert not any("ln_final" in n for n in names) and not any("ln_post" in n for n in names)
    assert model.encode_image(torch.randn(2, 3, 64, 64)).shape == (2, 128)


def test_clamps_hold_the_scalars_in_range_after_a_step():
    model = EuclipModel(C.load_config("tiny-meru"))
    with torch.no_grad():
        model.clip.logit_scale.fill_(10.0)
        model.log_curv.fill_(-5.0)
    model.clamp_scalars_()
    assert model.logit_scale().item() == pytest.approx(100.0)
    assert model.curvature().item() == pytest.approx(0.1)


def test_logit_scale_lower_bound_is_a_recipe_option():
    """The authors clamp t >= 0 after every step, so an initial t = -1 lasts one step; none removes the bound."""
    authors = EuclipModel(C.load_config("tiny-euclip", ["geometry.logit_scale_init=-1"]))
    assert authors.clip.logit_scale.item() == pytest.approx(-1.0)
    authors.clamp_scalars_()
    assert authors.clip.logit_scale.item() == 0.0
    intent = EuclipModel(C.load_config("tiny-euclip", ["geometry.logit_scale_init=-1", "geometry.logit_scale_min_log=none"]))
    intent.clamp_scalars_()
    assert intent.clip.logit_scale.item() == pytest.approx(-1.0)


def test_frozen_logit_scale_gets_no_gradient():
    model = EuclipModel(C.load_config("tiny-clip", ["geometry.learn_logit_scale=false"]))
    assert not model.clip.logit_scale.requires_grad


def test_weight_decay_spares_gains_biases_and_scalars():
    from euclip_cli.train.optim import param_groups

    model = EuclipModel(C.load_config("tiny-meru", ["model.arch=tiny-vit"]))
    no_decay, decay = param_groups(model, 0.2)
    ids = {id(p) for p in no_decay["params"]}
    named = dict(model.named_parameters())
    for name in ("clip.logit_scale", "log_curv", "log_alpha_img", "log_alpha_txt", "clip.ln_final.weight",
                 "clip.visual.ln_post.bias"):
        assert id(named[name]) in ids, name
    assert id(named["clip.text_projection"]) not in ids and decay["weight_decay"] == 0.2


def test_an_unknown_arch_is_a_usage_error_naming_the_key():
    from euclip_cli.errors import UsageError
    from euclip_cli.model import build_clip

    with pytest.raises(UsageError, match="model.arch 'vit-tiny-typo'"):
        build_clip("vit-tiny-typo")
