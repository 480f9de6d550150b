"""open_clip surgery and the learnable scalars."""

import copy
import math

import pytest
import torch
from euclip_cli.towers.archs import ARCHS, WithConvStem

from euclip_cli import config as C
from euclip_cli.model import EuclipModel
from euclip_cli.towers import batchnorm_statistics, build_clip, remove_final_layernorm


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


@pytest.mark.parametrize("arch", [a.name for a in ARCHS.values() if isinstance(a.finish, WithConvStem)])
def test_a_conv_stem_feeds_the_vit_its_token_grid_and_keeps_images_independent(arch):
    clip = build_clip(arch).double()  # training mode, where a BatchNorm would use batch statistics
    torch.manual_seed(0)
    images = torch.randn(3, 3, 64, 64, dtype=torch.float64)
    # open_clip's position embedding has one row per patch plus the class token: the stem must tile
    # the image into exactly that many tokens, or the ViT would fail (or broadcast) on them.
    tokens = clip.visual.conv1(images)
    assert tokens.shape[2] * tokens.shape[3] + 1 == clip.visual.positional_embedding.shape[0]
    assert not batchnorm_statistics(clip.visual)
    # No statistic is taken over the batch, which is what keeps gradient accumulation exact.
    alone = torch.cat([clip.encode_image(images[i:i + 1]) for i in range(3)])
    torch.testing.assert_close(clip.encode_image(images), alone, rtol=1e-10, atol=1e-12)


def test_hyperbolic_scalars_start_as_the_paper_says():
    model = EuclipModel(C.load_config("tiny-meru"))
    n = model.embed_dim
    assert model.log_alpha_img.item() == pytest.approx(math.log(n ** -0.5))
    assert model.log_alpha_txt.item() == pytest.approx(math.log(n ** -0.5))
    assert model.curvature().item() == pytest.approx(1.0)
    assert model.logit_scale().item() == pytest.approx(1 / 0.07, rel=1e-5)
    assert not hasattr(EuclipModel(C.load_config("tiny-clip")), "log_curv")


def test_resnet_tower_has_no_final_layernorm_to_remove():
    model = EuclipModel(C.load_config("tiny-euclip", ["model.arch=tiny"]))  # the ResNet tower
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


def test_alpha_is_clamped_where_a_recipe_bounds_it_as_merus_code_does():
    bounded = EuclipModel(C.load_config("tiny-meru", ["geometry.alpha_max=1.0"]))
    free = EuclipModel(C.load_config("tiny-meru"))
    for model in (bounded, free):
        with torch.no_grad():
            model.log_alpha_img.fill_(0.5)
            model.log_alpha_txt.fill_(-0.5)
        model.clamp_scalars_()
    assert (bounded.log_alpha_img.item(), bounded.log_alpha_txt.item()) == (0.0, -0.5)
    assert free.log_alpha_img.item() == 0.5  # the EuCLIP authors' code: no bound
    with pytest.raises(C.ConfigError, match="geometry.alpha_max"):
        C.load_config("tiny-clip", ["geometry.alpha_max=1.0"])  # no alpha to bound
    with pytest.raises(C.ConfigError, match="geometry.alpha_max"):
        C.load_config("tiny-meru", ["geometry.alpha_max=0"])


def test_merus_codes_decay_rule_decays_all_but_the_learned_scalars():
    """MERU's set_weight_decay_per_param with gain_bias_decay=0.0: its `or` makes that 0.2, so only the names
    it excludes (logit_scale, the alphas, the curvature) escape decay."""
    from euclip_cli.optim import param_groups

    model = EuclipModel(C.load_config("tiny-meru", ["model.arch=tiny-vit"]))
    no_decay, decay = param_groups(model, 0.2, decay_rule="meru-code")
    spared = {name for name, p in model.named_parameters() if any(p is q for q in no_decay["params"])}
    assert spared == {"clip.logit_scale", "log_curv", "log_alpha_img", "log_alpha_txt"}
    decayed = {name for name, p in model.named_parameters() if any(p is q for q in decay["params"])}
    assert {"clip.ln_final.weight", "clip.visual.ln_post.bias", "clip.text_projection"} <= decayed
    assert len(spared) + len(decayed) == sum(p.requires_grad for p in model.parameters())


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
    from euclip_cli.optim import param_groups

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
    from euclip_cli.towers import build_clip

    with pytest.raises(UsageError, match="model.arch 'vit-tiny-typo'"):
        build_clip("vit-tiny-typo")


def _captions(tokenizer) -> torch.Tensor:
    tokens = tokenizer(["a red star", "two small blue circles above a large green square on the left",
                        "a shape", "a star"])
    tokens[2, :-1] = torch.arange(1, tokens.shape[1])  # a caption that fills the context ...
    tokens[2, -1] = int(tokens.max())  # ... and ends with end-of-text in the last position
    return tokens


@pytest.mark.parametrize("final_ln, max_groups, expected", [
    # Three groups: the two short captions share one, the long one and the full one get theirs.
    (True, 0, [([0, 3], 8), ([1], 16), ([2], 32)]),
    (False, 0, [([0, 3], 8), ([1], 16), ([2], 32)]),
    # At most two: the 16-token caption runs with the full one (8 x 2 + 32 x 2 = 80 tokens; 16 x 3 + 32
    # ties, and the earlier cut wins).
    (True, 2, [([0, 3], 8), ([1, 2], 32)]),
    (True, 1, [([0, 1, 2, 3], 32)]),
])
def test_trimmed_text_context_is_exact_in_embeddings_and_gradients(final_ln, max_groups, expected):
    """Padding after a caption's end-of-text token cannot matter under a causal mask (fp64)."""
    from euclip_cli.towers import tokenizer_for
    from euclip_cli.towers.text import context_groups, text_features

    torch.manual_seed(0)
    clip = build_clip("tiny").double()
    if not final_ln:
        remove_final_layernorm(clip)
    tokens = _captions(tokenizer_for("tiny"))
    groups = context_groups(clip, tokens, max_groups)
    assert [(rows.tolist(), length) for rows, length in groups] == expected

    def run(features):
        clip.zero_grad()
        out = features(tokens)
        (out.sin().sum()).backward()  # a loss that weighs every feature differently
        return out.detach(), {n: p.grad.clone() for n, p in clip.named_parameters() if p.grad is not None}

    trimmed, trimmed_grads = run(lambda t: text_features(clip, t, max_groups=max_groups))
    padded, padded_grads = run(clip.encode_text)  # open_clip's own computation on the full context
    torch.testing.assert_close(trimmed, padded, atol=1e-9, rtol=0)
    assert trimmed_grads.keys() == padded_grads.keys() and any("transformer" in n for n in padded_grads)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(trimmed_grads[name], grad, atol=1e-9, rtol=0, msg=name)


@pytest.mark.parametrize("recipe", ["tiny-clip", "tiny-multi"])
@pytest.mark.parametrize("max_groups", [0, 1, 2])
def test_trimming_runs_on_device_tokens_from_a_host_plan(recipe, max_groups):
    """The trainer plans the groups from its host copy of the tokens and hands the towers the device
    copy. The meta device stands in for a GPU: its tensors have shapes but no values, so any host
    decision taken from a device tensor (the captions' lengths) fails there, as it would synchronise
    a GPU."""
    from euclip_cli.towers import tokenizer_for
    from euclip_cli.towers.text import class_tokens, text_features, text_plan

    cfg = C.load_config(recipe)
    clip = build_clip(cfg.model.arch, cfg.model.class_tokens).to("meta")
    tokens = _captions(tokenizer_for(cfg.model.arch))
    plan = text_plan(build_clip(cfg.model.arch, cfg.model.class_tokens), tokens, max_groups)
    seen = []  # the meta device lets some ops take host indices; a real GPU would not
    clip.token_embedding.register_forward_pre_hook(lambda module, args: seen.append(args[0].device.type))
    out = text_features(clip, tokens.to("meta"), plan)
    assert seen and set(seen) == {"meta"}, seen
    width = clip.text_projection.shape[-1] * class_tokens(clip)
    assert out.device.type == "meta" and out.shape == (4, width)


def test_at_most_k_length_groups_compute_the_fewest_padded_tokens():
    """The merge of lengths into groups against every way of cutting them (an independent search)."""
    import itertools
    import random

    from euclip_cli.towers.text import _merge_lengths

    def tokens(lengths, counts, ends):
        total, start = 0, 0
        for end in ends:
            stop = lengths.index(end) + 1
            total += sum(counts[start:stop]) * end
            start = stop
        return total

    rng = random.Random(0)
    for _ in range(200):
        lengths = sorted(rng.sample(range(8, 80, 8), rng.randint(1, 7)))
        counts = [rng.randint(1, 40) for _ in lengths]
        most = rng.randint(1, 4)
        merged = _merge_lengths(lengths, counts, most)
        assert merged[-1] == lengths[-1] and len(merged) <= most and merged == sorted(merged)
        best = min(tokens(lengths, counts, list(cut) + [lengths[-1]])
                   for k in range(min(most, len(lengths)))
                   for cut in itertools.combinations(lengths[:-1], k))
        assert tokens(lengths, counts, merged) == best
    assert _merge_lengths([8, 16, 32], [5, 5, 5], 0) == [8, 16, 32]  # no limit: every length its own group


def test_trimming_is_refused_where_it_would_not_be_exact():
    from euclip_cli.towers import tokenizer_for
    from euclip_cli.towers.text import context_groups

    clip = build_clip("tiny")
    tokens = _captions(tokenizer_for("tiny"))
    clip.text_pool_type = "last"
    assert context_groups(clip, tokens) is None  # the pooled position is the context's last
    clip.text_pool_type = "argmax"
    clip.attn_mask = None
    assert context_groups(clip, tokens) is None  # bidirectional attention: padding is seen


@pytest.mark.parametrize("mask", ["none", "additive", "causal", "per_head", "boolean"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_packed_attention_equals_torchs_multihead_attention(mask, batch_first):
    """Outputs and every gradient equal to ``nn.MultiheadAttention``'s on the same parameters (fp64)."""
    from torch import nn

    from euclip_cli.towers.attention import PackedSelfAttention

    torch.manual_seed(0)
    batch, length, width, heads = 3, 7, 32, 4
    mha = nn.MultiheadAttention(width, heads, batch_first=batch_first).double()
    packed = PackedSelfAttention(copy.deepcopy(mha))
    masks = {"none": None, "additive": torch.randn(length, length),
             "causal": torch.full((length, length), float("-inf")).triu(1),
             "per_head": torch.randn(batch * heads, length, length),
             "boolean": torch.rand(length, length) > 0.6}  # True: not attended, torch's convention
    attn_mask = masks[mask]
    if mask == "boolean":
        attn_mask[:, 0] = False  # every query attends to something
    elif attn_mask is not None:
        attn_mask = attn_mask.double()
    shape = (batch, length, width) if batch_first else (length, batch, width)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    def run(module):
        out = module(x, x, x, need_weights=False, attn_mask=attn_mask)[0]
        return out, torch.autograd.grad(out.sin().sum(), [x, *module.parameters()])

    (reference, reference_grads), (out, grads) = run(mha), run(packed)
    torch.testing.assert_close(out, reference, atol=1e-12, rtol=0)
    assert len(grads) == len(reference_grads) == 5  # the input, in_proj weight and bias, out_proj weight and bias
    for grad, expected in zip(grads, reference_grads):
        torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("arch", ["tiny-vit-c16", "bench-vit"])
def test_built_towers_load_open_clips_weights_and_compute_what_open_clip_computes(arch):
    """build_clip's towers (packed attention) against open_clip's own, built from the same config and
    weights: the same state-dict keys and parameter order (checkpoints and optimizer states load
    either way), and the same embeddings and gradients (fp64)."""
    import open_clip

    from euclip_cli.towers import tokenizer_for
    from euclip_cli.towers.attention import PackedSelfAttention

    torch.manual_seed(0)
    ours, theirs = build_clip(arch).double(), open_clip.CLIP(**ARCHS[arch].open_clip_config()).double()
    if ARCHS[arch].finish is not None:  # a conv stem: open_clip's config cannot say it, so both get ours
        theirs.visual.conv1 = copy.deepcopy(ours.visual.conv1)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    theirs.load_state_dict(ours.state_dict())
    assert any(isinstance(m, PackedSelfAttention) for m in ours.modules())
    assert not any(isinstance(m, PackedSelfAttention) for m in theirs.modules())
    size = ARCHS[arch].vision_cfg["image_size"]
    images = torch.randn(2, 3, size, size, dtype=torch.float64)
    tokens = tokenizer_for(arch)(["a red circle", "a picture of a small blue square on a green field"])

    def run(clip):
        clip.zero_grad()
        out = torch.cat([clip.encode_image(images), clip.encode_text(tokens)])
        out.sin().sum().backward()
        # The logit scale is not in the encoders: it has no gradient here, in both.
        return out.detach(), [None if p.grad is None else p.grad.clone() for p in clip.parameters()]

    (out, grads), (reference, reference_grads) = run(ours), run(theirs)
    torch.testing.assert_close(out, reference, atol=1e-10, rtol=0)
    assert sum(g is not None for g in grads) > len(grads) - 3
    for (name, _), grad, expected in zip(ours.named_parameters(), grads, reference_grads):
        assert (grad is None) == (expected is None), name
        if grad is not None:
            torch.testing.assert_close(grad, expected, atol=1e-10, rtol=0, msg=name)


@pytest.mark.parametrize("name", list(ARCHS))
def test_every_registered_arch_builds_at_its_dimension_and_context(name):
    """The registry's entries as ``model.arch`` names them: the towers project to the entry's dimension
    and the tokenizer's context is the text tower's."""
    from euclip_cli.towers import tokenizer_for

    arch = ARCHS[name]
    clip = build_clip(name)
    assert clip.text_projection.shape[-1] == arch.embed_dim
    assert clip.positional_embedding.shape[0] == arch.context_length == tokenizer_for(name).context_length


def test_an_arch_registered_by_a_user_builds_through_the_model(monkeypatch):
    """``towers.archs.register`` is the way the docs give to add towers: the model builds them by name."""
    import dataclasses

    from euclip_cli.towers import archs

    mine = dataclasses.replace(ARCHS["tiny-vit"], name="my-vit", embed_dim=64)
    monkeypatch.setattr(archs, "ARCHS", dict(ARCHS))
    archs.register(mine)
    with pytest.raises(ValueError, match="registered twice"):
        archs.register(mine)
    model = EuclipModel(C.load_config("tiny-clip", ["model.arch=my-vit"]))
    assert model.encode_image(torch.randn(2, 3, 64, 64)).shape == (2, 64)
