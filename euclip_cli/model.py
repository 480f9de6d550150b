"""open_clip encoders plus the geometry's learnable scalars.

``EuclipModel`` wraps an ``open_clip.CLIP`` (built with ``pretrained=None``; its tokenizer is
open_clip's bundled BPE, so nothing is fetched) and adds what the geometry needs:
the logit scale t (open_clip's own ``logit_scale`` parameter, beta = exp(t)), and for
hyperbolic models the log embedding scales alpha_img, alpha_txt and the log curvature.
Features always come from ``encode_image/encode_text(normalize=False)``; the geometry,
not open_clip, decides what happens to them, in fp32 with autocast off.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import open_clip
import torch
from torch import nn
from torch.nn import functional as F

from euclip_cli import multitoken
from euclip_cli.config import Config, initial_logit_scale, resolved_logit
from euclip_cli.device import autocast_factory
from euclip_cli.errors import Failure, UsageError
from euclip_cli.geometry import get_geometry
from euclip_cli.loss import at_least_fp32

# In-code configs for runs that fit a CPU: open_clip CLIP(embed_dim, vision_cfg, text_cfg) arguments.
_TINY_TEXT = dict(context_length=32, vocab_size=49408, width=128, heads=2, layers=4)
LOCAL_ARCHS: dict[str, dict] = {
    # open_clip's ModifiedResNet image tower (width 16, ~0.5 s per step of 128 on 2 cores) and a
    # 4-layer text transformer; the tiny recipes' tower until tiny-vit-c16 (below) replaced it, and
    # still the tower of the temperature studies. Measured on the world: after 440 steps of 128 it
    # classifies shapes at 74% (chance 8%), where the 8 x 8-token ViTs below stay near chance in CLIP
    # within tiny-clip's budget (the conv-stem ViT learns shapes in four times that budget). The
    # world's captions name colours, sizes and fills beside shapes, and towers without batch
    # statistics learn those first and shapes only slowly (feature suppression): with GroupNorm for
    # its BatchNorm this tower scored 10-13% on shapes over three seeds. Its batch statistics also
    # make gradient accumulation inexact; the paper's ViTs have none.
    "tiny": dict(embed_dim=128, vision_cfg=dict(image_size=64, layers=[1, 1, 1, 1], width=16, head_width=32),
                 text_cfg=_TINY_TEXT),
    # The same shapes as a ViT (64 px, patch 8, width 128, 4 layers): the paper's tower family.
    "tiny-vit": dict(embed_dim=128, vision_cfg=dict(image_size=64, patch_size=8, width=128, layers=4, head_width=64),
                     text_cfg=_TINY_TEXT),
    # The same ViT with a convolutional stem in place of its patchify convolution (see CONV_STEMS).
    "tiny-vit-conv": dict(embed_dim=128, vision_cfg=dict(image_size=64, patch_size=8, width=128, layers=4,
                                                         head_width=64), text_cfg=_TINY_TEXT),
    # A ViT on 32 px images with 4 px patches: as many tokens as tiny-vit, each seeing a quarter of the area.
    "tiny-vit-32": dict(embed_dim=128, vision_cfg=dict(image_size=32, patch_size=4, width=128, layers=4, head_width=64),
                        text_cfg=_TINY_TEXT),
    # The tiny recipes' tower: a ViT on a 4 x 4 grid of tokens, each from a four-stage conv stem
    # (16 px of the image): a quarter of tiny-vit-conv's tokens and a third of its image-tower time,
    # a little under the ResNet's. It learns shapes within tiny-clip's budget in every geometry of the
    # study at lr 2.5e-4 with 100 warm-up steps, where the 8 x 8 ViTs need four times the budget in
    # CLIP; at 5e-4 the distance geometries collapse with it (docs/embedded-world.md).
    "tiny-vit-c16": dict(embed_dim=128, vision_cfg=dict(image_size=64, patch_size=16, width=128, layers=4,
                                                        head_width=64), text_cfg=_TINY_TEXT),
    # The speed benchmark's model (``euclip bench train``): the one OpenCLIP's trainer was first timed
    # with by hand on this project's CPUs, ~2.9 GFLOP per training sample.
    "bench-vit": dict(embed_dim=256, vision_cfg=dict(image_size=64, patch_size=8, width=256, layers=6, head_width=64),
                      text_cfg=dict(context_length=32, vocab_size=49408, width=256, heads=4, layers=6)),
    # The data-path bench's model (``euclip bench feed``): bench-vit's inputs (64 px, context 32, so the
    # same loaders) through towers so small that a step costs the host next to nothing beside them,
    # as on a very fast accelerator.
    "bench-feed": dict(embed_dim=32, vision_cfg=dict(image_size=64, patch_size=16, width=32, layers=1, head_width=32),
                       text_cfg=dict(context_length=32, vocab_size=49408, width=32, heads=1, layers=1)),
}

# MERU's released towers (facebookresearch/meru): a timm ViT-S/B/L/16 at 224 px (class-token
# pooling, a bias-free linear projection) and a 12-layer, width-512 causal text transformer; MERU
# builds its ViT with torch's LayerNorm (eps 1e-5, not timm's 1e-6) and normalises images with
# ImageNet's mean and std. ``euclip import meru`` loads their checkpoints into these.
_MERU_TEXT = dict(context_length=77, vocab_size=49408, width=512, heads=8, layers=12)
MERU_TIMM = {"meru-vit-s": "vit_small_mocov3_patch16_224", "meru-vit-b": "vit_base_patch16_224",
             "meru-vit-l": "vit_large_patch16_224"}
for _arch, _timm in MERU_TIMM.items():
    LOCAL_ARCHS[_arch] = dict(embed_dim=512, text_cfg=_MERU_TEXT,
                              vision_cfg=dict(timm_model_name=_timm, timm_model_pretrained=False, timm_pool="token",
                                              timm_proj="linear", image_size=224))
MERU_LAYERNORM_EPS = 1e-5
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _register_mocov3_small() -> None:
    """MERU's ViT-S: ViT-S/16 with 12 attention heads instead of timm's 6 (MoCo v3's choice)."""
    import timm
    from timm.models import vision_transformer as vit

    if "vit_small_mocov3_patch16_224" in timm.list_models():
        return

    @timm.models.register_model
    def vit_small_mocov3_patch16_224(pretrained=False, **kwargs):
        return vit._create_vision_transformer("vit_small_patch16_224", pretrained=pretrained,
                                              **dict(dict(patch_size=16, embed_dim=384, depth=12, num_heads=12),
                                                     **kwargs))


def meru_towers(clip: open_clip.CLIP) -> None:
    """Make a timm image tower MERU's: torch's LayerNorm epsilon, ImageNet's mean and std."""
    for module in clip.visual.trunk.modules():
        if isinstance(module, nn.LayerNorm):
            module.eps = MERU_LAYERNORM_EPS
    clip.visual.image_mean, clip.visual.image_std = IMAGENET_MEAN, IMAGENET_STD


# Archs whose ViT patchifies with a stack of stride-2 3x3 convolutions (Xiao et al. 2021, "Early
# convolutions help transformers see better") instead of one patch-sized convolution: the channels
# of each stride-2 layer; their total stride equals the patch size, so the token grid is unchanged.
CONV_STEMS: dict[str, tuple[int, ...]] = {"tiny-vit-conv": (32, 64, 128), "tiny-vit-c16": (16, 32, 64, 128)}


class ConvStem(nn.Sequential):
    """``(B, 3, H, W) -> (B, width, H / 2**k, W / 2**k)``, in the place of a ViT's ``conv1``.

    GroupNorm, not BatchNorm: no statistic depends on the batch, so gradient accumulation stays exact.
    """

    def __init__(self, width: int, channels: tuple[int, ...]):
        layers: list[nn.Module] = []
        c_in = 3
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1, bias=False), nn.GroupNorm(1, c), nn.GELU()]
            c_in = c
        layers.append(nn.Conv2d(c_in, width, 1))
        super().__init__(*layers)


def arch_embed_dim(arch: str) -> int:
    """The embedding dimension an arch projects to (open_clip's ``embed_dim``)."""
    if arch in LOCAL_ARCHS:
        return LOCAL_ARCHS[arch]["embed_dim"]
    cfg = open_clip.get_model_config(arch)
    if cfg is None:
        raise UsageError(f"model.arch '{arch}' is neither one of euclip's CPU archs ({', '.join(LOCAL_ARCHS)}) "
                         f"nor an open_clip model (open_clip.list_models(), e.g. ViT-B-32)")
    return cfg["embed_dim"]


class _DropMessage(logging.Filter):
    """Drops the log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


class PackedSelfAttention(nn.Module):
    """``nn.MultiheadAttention``'s self-attention (no dropout) on the same parameters, with a leaner backward.

    torch's module splits its packed q, k, v projection with three ``select``s, and the backward of
    each fills a zero tensor the size of all three before adding its part: measured on a 2-core
    CPU (``euclip bench profile``, bench-vit, batch 256), those fills and the layout copies around
    them were about a tenth of a training step. Here the projection is split by ``unbind``, whose
    backward stacks the three gradients in one copy. Parameters keep their names
    (``in_proj_weight``, ``in_proj_bias``, ``out_proj``), so checkpoints load either way; the
    result equals torch's within float rounding (``tests/test_model.py`` checks it in fp64).
    """

    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        self.num_heads, self.batch_first = mha.num_heads, mha.batch_first
        self.in_proj_weight, self.in_proj_bias, self.out_proj = mha.in_proj_weight, mha.in_proj_bias, mha.out_proj

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, need_weights: bool = False,
                attn_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, None]:
        """``(B, S, E)`` (or ``(S, B, E)`` unless batch-first) ``-> ((B, S, E), None)``, as the module it
        replaces returns with ``need_weights=False``. ``attn_mask`` is ``(S, S)`` or ``(B * heads, S, S)``,
        additive, or boolean with True where attention is not allowed (torch's convention there)."""
        if need_weights or key is not query or value is not query:
            raise NotImplementedError("PackedSelfAttention computes self-attention without weights only")
        x = query if self.batch_first else query.transpose(0, 1)
        batch, length, width = x.shape
        heads = self.num_heads
        q, k, v = (F.linear(x, self.in_proj_weight, self.in_proj_bias)
                   .view(batch, length, 3, heads, width // heads).permute(2, 0, 3, 1, 4).unbind(0))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(attn_mask, float("-inf"))
            if attn_mask.dim() == 3:
                attn_mask = attn_mask.view(batch, heads, length, length)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, heads, S, E / heads)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, width))
        return (out if self.batch_first else out.transpose(0, 1)), None


def pack_attention(clip: nn.Module) -> None:
    """Every open_clip residual block's ``nn.MultiheadAttention`` becomes a ``PackedSelfAttention`` on
    the same parameters (blocks that attend across modalities, as CoCa's decoder does, or with
    dropout or separate q, k, v projections keep torch's)."""
    for block in clip.modules():
        attn = getattr(block, "attn", None)
        if (isinstance(block, open_clip.transformer.ResidualAttentionBlock) and not hasattr(block, "ln_1_kv")
                and isinstance(attn, nn.MultiheadAttention) and attn._qkv_same_embed_dim and attn.dropout == 0
                and attn.in_proj_bias is not None):
            block.attn = PackedSelfAttention(attn)


def open_clip_model(arch: str, **kwargs) -> open_clip.CLIP:
    """open_clip's registered model ``arch`` as open_clip builds it, randomly initialised."""
    # open_clip warns on the root logger that the model is "initialized randomly"; euclip then
    # initialises or loads the weights itself (eval, resume, import), so the line would mislead.
    quiet = _DropMessage("No pretrained weights loaded for model")
    logging.getLogger().addFilter(quiet)
    try:
        return open_clip.create_model(arch, pretrained=None, **kwargs)
    finally:
        logging.getLogger().removeFilter(quiet)


def build_clip(arch: str, class_tokens: int = 1) -> open_clip.CLIP:
    """open_clip's towers for ``arch``; with m = ``class_tokens`` > 1, Multi(D/m, m) (``euclip_cli.multitoken``):
    each class token projected to D/m, so the concatenated feature keeps the arch's dimension D."""
    embed_dim = arch_embed_dim(arch)
    if embed_dim % class_tokens:
        raise UsageError(f"model.class_tokens={class_tokens} does not divide {arch}'s embedding dimension {embed_dim}")
    resize = {"embed_dim": embed_dim // class_tokens} if class_tokens > 1 else {}
    if arch not in LOCAL_ARCHS:
        clip = open_clip_model(arch, **resize)
    else:
        if arch in MERU_TIMM:
            _register_mocov3_small()
        clip = open_clip.CLIP(**dict(LOCAL_ARCHS[arch], **resize))
        if arch in MERU_TIMM:
            meru_towers(clip)
        if arch in CONV_STEMS:
            vision = LOCAL_ARCHS[arch]["vision_cfg"]
            if 2 ** len(CONV_STEMS[arch]) != vision["patch_size"]:
                raise ValueError(f"{arch}: the conv stem's stride must equal the patch size")  # a bug in the table
            clip.visual.conv1 = ConvStem(vision["width"], CONV_STEMS[arch])
    pack_attention(clip)
    multitoken.extend(clip, class_tokens)
    return clip


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
    if arch in LOCAL_ARCHS:
        return open_clip.tokenizer.SimpleTokenizer(context_length=LOCAL_ARCHS[arch]["text_cfg"]["context_length"])
    return open_clip.get_tokenizer(arch)


def transforms_for(clip: open_clip.CLIP):
    """open_clip's (train, eval) image transforms at the model's resolution, with the tower's mean
    and std where it names them (open_clip's pretrained models, MERU's towers), else OpenAI's."""
    size = image_size(clip)
    stats = dict(mean=getattr(clip.visual, "image_mean", None), std=getattr(clip.visual, "image_std", None))
    return (open_clip.image_transform(size, is_train=True, **stats),
            open_clip.image_transform(size, is_train=False, **stats))


# Trimmed contexts are rounded up to a multiple of this: few distinct shapes for torch.compile to
# specialise on, few groups per batch, and matrix sizes the kernels like.
TRIM_MULTIPLE = 8
# ``model.text_groups`` unset, by the kind of device the towers are on. A CPU is bound by arithmetic,
# so every length gets its own group (0); a GPU running towers of these sizes is bound by launching
# kernels, and each group launches the whole text tower again (``euclip bench ops`` counts the
# operations; docs/training.md has the measurement behind the 2).
TEXT_GROUPS_BY_DEVICE = {"cpu": 0, "cuda": 2}


def text_groups_for(setting: Optional[int], device: torch.device) -> int:
    """The most length groups a batch of captions may run in (0: no limit) for ``model.text_groups``."""
    return TEXT_GROUPS_BY_DEVICE.get(device.type, 0) if setting is None else setting


def _merge_lengths(lengths: list[int], counts: list[int], most: int) -> list[int]:
    """Which of the ascending ``lengths`` end a group when at most ``most`` groups may run: the cut that
    computes the fewest padded tokens (a group runs every caption at its longest length), by dynamic
    programming over the few distinct lengths. Returns the group lengths, ascending."""
    n = len(lengths)
    if most <= 0 or n <= most:
        return lengths
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    # cost[g][i]: fewest tokens covering the first i lengths with g groups; cut[g][i]: where the last starts.
    inf = float("inf")
    cost = [[inf] * (n + 1) for _ in range(most + 1)]
    cut = [[0] * (n + 1) for _ in range(most + 1)]
    cost[0][0] = 0
    for g in range(1, most + 1):
        for i in range(1, n + 1):
            for j in range(i):
                tokens = cost[g - 1][j] + (starts[i] - starts[j]) * lengths[i - 1]
                if tokens < cost[g][i]:
                    cost[g][i], cut[g][i] = tokens, j
    groups = min(range(1, most + 1), key=lambda g: cost[g][n])
    ends, i = [], n
    for g in range(groups, 0, -1):
        ends.append(lengths[i - 1])
        i = cut[g][i]
    return ends[::-1]


def _trimmable(clip: nn.Module) -> bool:
    """Whether a tower's text features can be computed on trimmed contexts (``context_groups``)."""
    if not isinstance(clip, open_clip.CLIP) or clip.attn_mask is None:
        return False
    return (clip.text_pool_type == "argmax"
            or clip.text_pool_type == "eos" and getattr(clip, "text_eos_id", None) is not None)


def context_groups(clip: nn.Module, tokens: torch.Tensor, max_groups: int = 0
                   ) -> Optional[list[tuple[torch.Tensor, int]]]:
    """``[(sample indices, context length), ...]`` covering the batch, ascending in length, or None
    where trimming is not exact. ``tokens (B, L)`` on the host.

    Exact for open_clip's ``CLIP`` text tower with a causal mask and end-of-text pooling: no
    position attends to a later one, so the tokens after a caption's pooled token cannot change
    its pooled feature or its gradient; and the tower treats each caption on its own (no batch
    statistics), so captions can run in groups. Each caption goes to the group of its pooled
    position rounded up to ``TRIM_MULTIPLE``: a few long captions no longer make the whole batch
    pay for the full context. With ``max_groups`` > 0, neighbouring lengths merge into at most that
    many groups (``_merge_lengths``). Towers without a causal mask, or pooling another position, keep it.
    """
    found = _length_groups(clip, tokens, max_groups)
    if found is None:
        return None
    group_of, lengths = found
    return [((group_of == g).nonzero().squeeze(1), length) for g, length in enumerate(lengths)]


def _length_groups(clip: nn.Module, tokens: torch.Tensor, max_groups: int
                   ) -> Optional[tuple[torch.Tensor, list[int]]]:
    """``(each caption's group (B,), the groups' context lengths ascending)`` for ``context_groups``."""
    if not _trimmable(clip):
        return None
    ends = multitoken.end_positions(clip, tokens)
    rounded = ((ends + TRIM_MULTIPLE) // TRIM_MULTIPLE * TRIM_MULTIPLE).clamp_max(tokens.shape[1])
    distinct, counts = rounded.unique(return_counts=True)
    lengths = _merge_lengths(distinct.tolist(), counts.tolist(), max_groups)
    return torch.bucketize(rounded, torch.tensor(lengths)), lengths  # each caption's first group long enough


@dataclass(frozen=True)
class TextPlan:
    """How one batch of captions runs through the text tower, decided on the host: the size and
    context length of each group, ascending in length (``context_groups``). With it the towers
    can run on a GPU without reading anything back: the device sorts its own copy of the tokens
    by end-of-text position, which puts the same captions in the same groups."""

    sizes: tuple[int, ...]
    lengths: tuple[int, ...]


def text_plan(clip: nn.Module, tokens: torch.Tensor, max_groups: int = 0) -> Optional[TextPlan]:
    """The plan for ``tokens (B, L)`` on the host, or None where trimming is not exact."""
    found = _length_groups(clip, tokens, max_groups)
    if found is None:
        return None
    group_of, lengths = found
    return TextPlan(tuple(group_of.bincount(minlength=len(lengths)).tolist()), tuple(lengths))


def _prefix_features(clip: open_clip.CLIP, tokens: torch.Tensor, length: int,
                     embedded: Optional[torch.Tensor] = None) -> torch.Tensor:
    """open_clip's ``CLIP.encode_text`` on the first ``length`` tokens. ``(B, L) -> (B, D)``.

    ``CLIP.encode_text`` adds the full positional table and causal mask, so a shorter context
    cannot be passed to it; this is its computation with both sliced. ``embedded``, when given, is
    ``clip.token_embedding(tokens)`` ``(B, L, W)``, looked up by the caller. Towers with several
    class tokens take theirs (``multitoken.multi_text_features``).
    """
    if multitoken.text_class_tokens(clip) > 1:
        return multitoken.multi_text_features(clip, tokens, length)
    tokens = tokens[:, :length]
    embedded = clip.token_embedding(tokens) if embedded is None else embedded[:, :length]
    cast = clip.transformer.get_cast_dtype()
    x = embedded.to(cast) + clip.positional_embedding[:length].to(cast)
    x = clip.ln_final(clip.transformer(x, attn_mask=clip.attn_mask[:length, :length]))
    x = open_clip.transformer.text_global_pool(x, tokens, clip.text_pool_type,
                                               eos_token_id=getattr(clip, "text_eos_id", None))
    if isinstance(clip.text_projection, nn.Linear):
        return clip.text_projection(x)
    return x @ clip.text_projection if clip.text_projection is not None else x


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device``. A host tensor bound for a GPU goes through pinned memory: a copy from
    pageable memory would wait for the GPU's queue to drain first."""
    if x.device == device:
        return x
    if device.type == "cuda" and x.device.type == "cpu" and not x.is_pinned():
        x = x.pin_memory()
    return x.to(device, non_blocking=True)


def text_features(clip: nn.Module, tokens: torch.Tensor, plan: Optional[TextPlan] = None,
                  max_groups: int = 0) -> torch.Tensor:
    """``clip.encode_text(tokens)`` computed on each caption's shortest exact context (``context_groups``).

    ``(B, L) -> (B, D)`` on the towers' device, rows in the input's order. ``plan``: the groups, decided
    on the host from a host copy of the same tokens (the trainer passes one, so that a step never
    reads a device tensor back); without it the plan is made here, from ``tokens`` (a GPU tensor is
    read back for it, a synchronisation). The device sorts its own tokens by end-of-text position
    (a stable sort), which puts each caption in its planned group with no index crossing over.
    """
    device = next(clip.parameters()).device
    if plan is None and _trimmable(clip):
        plan = text_plan(clip, tokens.cpu(), max_groups)
    tokens = _to_device(tokens, device)
    if plan is None or plan.lengths == (tokens.shape[1],):  # nothing to trim
        if multitoken.text_class_tokens(clip) > 1:
            return multitoken.multi_text_features(clip, tokens, tokens.shape[1])
        return clip.encode_text(tokens)
    if len(plan.sizes) == 1:  # one group: the batch cut to its longest caption, in its own order
        return _prefix_features(clip, tokens, plan.lengths[0])
    order = multitoken.end_positions(clip, tokens).argsort(stable=True)
    grouped = tokens[order]
    # One lookup for the batch: the backward of each lookup fills a gradient the size of the whole
    # vocabulary table (49,408 rows), measured at 3% of a bench step when done once per group.
    embedded = (clip.token_embedding(grouped).split(plan.sizes) if multitoken.text_class_tokens(clip) == 1
                else [None] * len(plan.sizes))
    features = [_prefix_features(clip, part, length, part_embedded) for length, part, part_embedded
                in zip(plan.lengths, grouped.split(plan.sizes), embedded)]
    return torch.cat(features)[order.argsort()]


def state_mismatch(model: nn.Module, state: dict) -> Optional[str]:
    """What stops ``state`` (a state dict) from loading into ``model``, in words, or None when it fits:
    the number and first of the missing and the unexpected keys, or the first tensor of another shape."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    problems = []
    if missing:
        problems.append(f"{len(missing)} key(s) the model needs are missing (first: {missing[0]})")
    if unexpected:
        problems.append(f"{len(unexpected)} key(s) are not in the model (first: {unexpected[0]})")
    if problems:
        return "; ".join(problems)
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            return f"'{key}' has shape {tuple(value.shape)} where the model has {tuple(expected[key].shape)}"
    return None


class CheckpointMisfit(Failure):
    """A run's own checkpoint does not fit the model its configuration builds."""


def load_run_weights(model: nn.Module, state: dict, source: Path) -> None:
    """Load a run checkpoint's ``state["model"]`` into ``model``, or say which file does not fit and how.
    A misfit means the code that builds the model changed since the checkpoint was written, or the file
    was copied in from another run: no older checkpoint of the run would fit better, so none is tried."""
    problem = state_mismatch(model, state["model"])
    if problem:
        raise CheckpointMisfit(f"{source} does not fit the model its configuration builds ({problem}): it was "
                               f"written by another euclip version or copied from another run; use the version "
                               f"that wrote it (meta.json names its git revision), or retrain")
    model.load_state_dict(state["model"])


class EuclipModel(nn.Module):
    def __init__(self, cfg: Config, clip: Optional[open_clip.CLIP] = None):
        """``clip``: already-built towers (e.g. an open_clip pretrained model) instead of fresh ones."""
        super().__init__()
        self.clip = clip if clip is not None else build_clip(cfg.model.arch, cfg.model.class_tokens)
        if not cfg.model.final_ln:
            remove_final_layernorm(self.clip)
        self.text_groups = cfg.model.text_groups
        g = cfg.geometry
        self.geometry = get_geometry(g.name, logit=resolved_logit(cfg), blocks=g.blocks)
        # Multi(n, m) towers project each of their m class tokens to n = text_projection's width.
        self.embed_dim = self.clip.text_projection.shape[-1] * multitoken.text_class_tokens(self.clip)
        if self.geometry.facts.uses_blocks and self.embed_dim % g.blocks:
            raise UsageError(f"geometry.blocks={g.blocks} does not divide the embedding dimension {self.embed_dim}")
        if clip is None:
            with torch.no_grad():
                self.clip.logit_scale.fill_(initial_logit_scale(cfg))
        self.clip.logit_scale.requires_grad_(g.learn_logit_scale)
        # The encoders' own autocast, for inference: evaluation on a GPU sets the run's precision
        # (``encode.load_model``), as DataComp evaluates under AMP. Training leaves it at fp32 and
        # wraps the whole step in its autocast instead. The geometry stays fp32 either way.
        self.encoder_precision = "fp32"
        self.max_log_scale = math.log(g.logit_scale_max)
        self.min_log_scale = g.logit_scale_min_log
        if self.geometry.learned_scales:
            # alpha = 1/sqrt(n) at init, the Euclidean geometry's fixed scale (paper, section 3.1).
            init = -0.5 * math.log(self.embed_dim)
            self.log_alpha_img = nn.Parameter(torch.tensor(init))
            self.log_alpha_txt = nn.Parameter(torch.tensor(init))
        if self.geometry.has_curvature:
            self.log_curv = nn.Parameter(torch.tensor(math.log(g.curvature_init)), requires_grad=g.learn_curvature)
            self.log_curv_range = (math.log(g.curvature_min), math.log(g.curvature_max))

    def _embed(self, features: torch.Tensor, log_scale: Optional[torch.Tensor]) -> torch.Tensor:
        with torch.autocast(features.device.type, enabled=False):
            return self.geometry.embed(at_least_fp32(features), log_scale)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """Images to fp32 output-space embeddings. ``(B, 3, H, W) -> (B, D)``."""
        with autocast_factory(self.encoder_precision, images.device)():
            features = self.clip.encode_image(images)
        return self._embed(features, getattr(self, "log_alpha_img", None))

    def encode_text(self, tokens: torch.Tensor, plan: Optional[TextPlan] = None) -> torch.Tensor:
        """Token ids to fp32 output-space embeddings. ``(B, L) -> (B, D)``; the context is trimmed exactly,
        as ``plan`` says (``text_plans``) or as planned here from ``tokens``."""
        device = next(self.clip.parameters()).device
        with autocast_factory(self.encoder_precision, device)():
            features = text_features(self.clip, tokens, plan, text_groups_for(self.text_groups, device))
        return self._embed(features, getattr(self, "log_alpha_txt", None))

    def text_plans(self, tokens: torch.Tensor, chunks: int = 1) -> list[Optional[TextPlan]]:
        """The text tower's plan for each of ``chunks`` micro-batches of ``tokens (B, L)``, on the host."""
        most = text_groups_for(self.text_groups, next(self.clip.parameters()).device)
        return [text_plan(self.clip, part, most) for part in tokens.chunk(chunks)]

    def logit_scale(self) -> torch.Tensor:
        """beta = exp(t), 0-dim. t is kept in range by ``clamp_scalars_`` after each step."""
        return at_least_fp32(self.clip.logit_scale).exp()

    def curvature(self) -> Optional[torch.Tensor]:
        return at_least_fp32(self.log_curv).exp() if self.geometry.has_curvature else None

    def loss_scalars(self) -> list[nn.Parameter]:
        """The learnable parameters that enter only the loss, not an encoder (t, and log c where
        learned): under several ranks they are live on rank 0 alone (``euclip_cli.step``)."""
        found = [self.clip.logit_scale] + ([self.log_curv] if self.geometry.has_curvature else [])
        return [q for q in found if q.requires_grad]

    def compile_encoders(self) -> None:
        """torch.compile both towers in place (``train.compile``): the state dict keeps its keys."""
        self.clip.visual.compile()
        self.clip.transformer.compile()

    @torch.no_grad()
    def clamp_scalars_(self) -> None:
        """Clamp t to [min, ln max] and log c to its interval, on the parameters themselves.

        Clamping the parameter (as OpenCLIP does for t and MERU for c), not the value inside
        forward (as the EuCLIP fork does for c), keeps the gradient alive at the bounds, so a
        curvature pushed to its floor can come back.
        """
        self.clip.logit_scale.clamp_(min=self.min_log_scale, max=self.max_log_scale)
        if self.geometry.has_curvature:
            self.log_curv.clamp_(*self.log_curv_range)

    def scalars(self) -> dict[str, float]:
        """The learnable scalars, for logging."""
        out = {"logit_scale": self.logit_scale().item()}
        if self.geometry.has_curvature:
            out["curvature"] = self.curvature().item()
        if self.geometry.learned_scales:
            out["alpha_img"] = self.log_alpha_img.exp().item()
            out["alpha_txt"] = self.log_alpha_txt.exp().item()
        return out


def initial_model(cfg: Config) -> EuclipModel:
    """The model a run of ``cfg`` starts training from, on the CPU: its weights are fixed by
    ``train.seed`` (the trainer builds it through this function, so a study can measure a run's
    untrained state without a checkpoint of it)."""
    import random

    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    return EuclipModel(cfg)
