"""The towers: open_clip's image and text encoders as euclip builds them.

``build_clip`` makes an arch of the registry (``towers.archs``) with euclip's attention
(``towers.attention``) and m class tokens (``towers.vision``, ``towers.text``); the text tower
runs each caption on its shortest exact context (``towers.text.text_features``).
"""

from __future__ import annotations

from typing import Optional

import open_clip
import torch
from torch import nn

from euclip_cli.errors import UsageError
from euclip_cli.towers import archs, text, vision
from euclip_cli.towers.attention import pack_attention


def token_width(arch: str, class_tokens: int = 1, embed_dim: Optional[int] = None) -> int:
    """n, the width each of m = ``class_tokens`` class tokens projects to (D/m, for D = ``embed_dim`` or the
    arch's dimension), found without building anything; a usage error for an unknown arch or an m that does
    not divide D."""
    found = archs.lookup(arch)
    width = embed_dim or found.embed_dim
    if width % class_tokens:
        raise UsageError(f"model.class_tokens={class_tokens} does not divide {arch}'s embedding dimension {width}")
    return width // class_tokens


def build_clip(arch: str, class_tokens: int = 1, embed_dim: Optional[int] = None) -> open_clip.CLIP:
    """open_clip's towers for ``arch`` projecting to ``embed_dim`` (default: the arch's); with
    m = ``class_tokens`` > 1, Multi(D/m, m): each class token projected to D/m, so the concatenated feature
    keeps the dimension D."""
    clip = archs.lookup(arch).build(token_width(arch, class_tokens, embed_dim))
    pack_attention(clip)
    if class_tokens > 1:
        text.add_class_tokens(clip, class_tokens)
        vision.add_class_tokens(clip.visual, class_tokens)
    return clip


def projection_names(arch: str, class_tokens: int = 1) -> frozenset[str]:
    """The state-dict names of the towers' projections: every tensor whose shape depends on the embedding
    width, found by building the towers at two widths on the meta device (no memory, no arithmetic), so an
    arch registered later needs no list of its own (open_clip's ``proj``, a ResNet's attention-pool output,
    a timm head, extra class tokens' projections)."""
    width = token_width(arch, class_tokens) * class_tokens
    with torch.device("meta"):
        one = build_clip(arch, class_tokens, width).state_dict()
        two = build_clip(arch, class_tokens, 2 * width).state_dict()
    return frozenset(name for name, value in one.items() if value.shape != two[name].shape)


def batchnorm_statistics(module: nn.Module) -> dict[str, torch.Tensor]:
    """The running statistics of every BatchNorm layer (``running_mean``, ``running_var``,
    ``num_batches_tracked``) by their state-dict names; empty for towers without BatchNorm."""
    return {f"{name}.{key}": buffer for name, layer in module.named_modules()
            if isinstance(layer, nn.modules.batchnorm._BatchNorm)
            for key, buffer in layer.named_buffers(recurse=False) if buffer is not None}


def remove_final_layernorm(clip: open_clip.CLIP) -> None:
    """Replace the vision ``ln_post`` and text ``ln_final`` with identities; nothing else changes.

    A ResNet image tower has no final LayerNorm (its attention pool projects directly), so only
    the text tower changes there.
    """
    if hasattr(clip.visual, "ln_post"):
        clip.visual.ln_post = nn.Identity()
    clip.ln_final = nn.Identity()


def image_size(clip: open_clip.CLIP) -> int:
    size = clip.visual.image_size
    return size[0] if isinstance(size, (tuple, list)) else size


def tokenizer_for(arch: str):
    return archs.lookup(arch).tokenizer()


def transforms_for(clip: open_clip.CLIP, crop_scale: Optional[float] = None, resize: str = "crop"):
    """open_clip's (train, eval) image transforms at the model's resolution, with the tower's mean
    and std where it names them (open_clip's pretrained models, MERU's towers), else OpenAI's; a training
    crop keeps at least ``crop_scale`` of the image's area (``data.crop_scale``; unset: open_clip's own).
    The eval transform resizes the shorter side and crops the centre (``resize="crop"``: DataComp's, and
    MERU's for classification) or resizes both sides to the size, the aspect lost (``"squeeze"``: MERU's
    retrieval, which keeps the whole image)."""
    from open_clip.transform import AugmentationCfg

    size = image_size(clip)
    stats = dict(mean=getattr(clip.visual, "image_mean", None), std=getattr(clip.visual, "image_std", None))
    augment = None if crop_scale is None else AugmentationCfg(scale=(crop_scale, 1.0))
    modes = {"crop": "shortest", "squeeze": "squash"}  # open_clip's names
    return (open_clip.image_transform(size, is_train=True, aug_cfg=augment, **stats),
            open_clip.image_transform(size, is_train=False, resize_mode=modes[resize], **stats))


def image_trunk_features(clip: open_clip.CLIP, images: torch.Tensor) -> torch.Tensor:
    """The image tower's features before its projection, ``(B, 3, H, W) -> (B, width)``: what MERU's and
    CLIP's linear probes read (for MERU, still in Euclidean space: nothing is lifted). A timm tower
    (MERU's) is its trunk, whose head is the projection; open_clip's ViT runs without its ``proj``."""
    from open_clip.transformer import VisionTransformer

    visual = clip.visual
    if hasattr(visual, "trunk"):
        return visual.trunk(images)
    if isinstance(visual, VisionTransformer):
        proj, visual.proj = visual.proj, None
        try:
            return visual(images)
        finally:
            visual.proj = proj
    raise UsageError(f"a linear probe reads a ViT's features before its projection; a {type(visual).__name__} "
                     f"image tower has no such point")
