"""Gradient accumulation gives exactly the full-batch loss and gradients, learnable scalars included."""

import contextlib

import pytest
import torch

from euclip_cli import config as C
from euclip_cli.model import EuclipModel
from euclip_cli.step import forward_backward

RECIPES = {
    "clip": [],
    "euclidean-d2 + entailment": ["geometry.name=euclidean", "geometry.logit=d2", "model.final_ln=false",
                                  "loss.entail_weight=0.1", "loss.entail_min_radius=0.3", "geometry.logit_scale_init=1.0"],
    "hyperbolic + entailment": ["geometry.name=hyperbolic", "geometry.logit=d", "loss.entail_weight=0.2"],
    # SigLIP's sigmoid loss, with its learnable bias: in CLIP's geometry (SigLIP's own) and in EuCLIP's.
    "clip + siglip": ["loss.kind=siglip"],
    "euclip + siglip": ["geometry.name=euclidean", "geometry.logit=d2", "model.final_ln=false", "loss.kind=siglip",
                        "loss.entail_weight=0.1", "loss.entail_min_radius=0.3"],
    # HyCoCLIP's loss on (image, box image, text, box text): its own geometry, and EuCLIP's cones.
    "hycoclip": ["geometry.name=hyperbolic", "geometry.logit=d", "loss.entail_weight=0.2", "loss.kind=hycoclip"],
    "euclip + hycoclip": ["geometry.name=euclidean", "geometry.logit=d2", "model.final_ln=false", "loss.kind=hycoclip",
                          "loss.entail_weight=0.1", "loss.entail_min_radius=0.3", "geometry.logit_scale_init=1.0"],
}


def with_boxes(cfg, images, tokens):
    """A box loader's batch where the loss needs one (``loss.kind=hycoclip``): the samples, then one box of each
    (here each image's left half, upscaled, and a phrase of 6 tokens). A box text must not be its caption's
    first tokens: the causal text tower would give both one embedding wherever the caption's end-of-text
    token (its largest id) fell among them, and a cone at a point holding itself has no angle to compare."""
    if cfg.loss.kind != "hycoclip":
        return images, tokens
    box_images = images[..., :, : images.shape[-1] // 2].repeat_interleave(2, dim=-1)
    box_tokens = torch.zeros_like(tokens)
    box_tokens[:, :6] = torch.randint(1, 400, (tokens.shape[0], 6), generator=torch.Generator().manual_seed(2))
    return torch.cat([images, box_images]), torch.cat([tokens, box_tokens])


def gradients(cfg, images, tokens, k):
    torch.manual_seed(0)
    model = EuclipModel(cfg).double()
    terms = forward_backward(model, *with_boxes(cfg, images, tokens), k, cfg.loss.entail_weight,
                             cfg.loss.entail_min_radius, contextlib.nullcontext, boxes=cfg.loss.kind == "hycoclip")
    return terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant", list(RECIPES))
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("arch", ["tiny-vit", "tiny-vit-c16"])
def test_accumulated_step_equals_full_batch(variant, k, arch):
    # ViT towers (the paper's family; tiny-vit-c16 with its conv stem): BatchNorm in the tiny ResNet
    # makes micro-batch statistics differ.
    cfg = C.load_config("tiny-clip", RECIPES[variant] + ["data.batch_size=8", f"model.arch={arch}"])
    torch.manual_seed(1)
    images = torch.randn(8, 3, 64, 64, dtype=torch.float64)
    tokens = torch.randint(1, 400, (8, 32))
    full_terms, full = gradients(cfg, images, tokens, 1)
    acc_terms, acc = gradients(cfg, images, tokens, k)
    assert full.keys() == acc.keys()
    for key in full_terms:
        torch.testing.assert_close(acc_terms[key], full_terms[key])
    scalars = [n for n in full if n in ("clip.logit_scale", "log_curv", "log_alpha_img", "log_alpha_txt", "logit_bias")]
    assert "clip.logit_scale" in scalars and ("logit_bias" in scalars) == ("siglip" in variant)
    assert ("entail_box_image_image" in full_terms) == ("hycoclip" in variant)
    for name in full:
        torch.testing.assert_close(acc[name], full[name], rtol=1e-9, atol=1e-12, msg=f"{variant}, k={k}: {name}")
