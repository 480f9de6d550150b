"""The architecture registry: every pair of towers ``model.arch`` can name.

euclip's own towers (sized for a CPU, or MERU's) are ``Arch`` entries registered here, as timm
registers its models; any other name is looked up among open_clip's registered models. An entry
is an open_clip ``CLIP`` configuration (``embed_dim``, ``vision_cfg``, ``text_cfg``) and what
that configuration cannot say, done to the built towers (``finish``). A package of your own adds
one with ``register(Arch(...))`` in a module it names under the ``euclip.archs`` entry point, so
that every euclip process (a study's runs, torchrun's ranks) knows it; the benchmarks' models
(``euclip_bench.archs``) are registered so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import open_clip
import torch
from torch import nn

from euclip_cli.errors import UsageError
from euclip_cli.startup import hf_text_towers


@dataclass(frozen=True)
class Arch:
    """One pair of towers: open_clip's ``CLIP(embed_dim, vision_cfg, text_cfg)`` and its finishing touches."""

    name: str
    embed_dim: int
    vision_cfg: dict
    text_cfg: dict
    # Applied to the built towers: what open_clip's config cannot express (a conv stem, MERU's norms).
    finish: Optional[Callable[[open_clip.CLIP], None]] = None
    # Run before building (a timm model the vision config names, registered on first use).
    prepare: Optional[Callable[[], None]] = None
    # An open_clip registered model: open_clip builds it (custom text towers, Hugging Face ones).
    from_open_clip: bool = field(default=False, compare=False)

    def open_clip_config(self) -> dict:
        """The entry as an open_clip model-config file holds it (what OpenCLIP's own trainer reads)."""
        return {"embed_dim": self.embed_dim, "vision_cfg": self.vision_cfg, "text_cfg": self.text_cfg}

    @property
    def image_size(self) -> int:
        """The image tower's input side in pixels (open_clip's default 224 where the config names none)."""
        size = self.vision_cfg.get("image_size", 224)
        return max(size) if isinstance(size, (tuple, list)) else size

    @property
    def context_length(self) -> int:
        return self.text_cfg.get("context_length", 77)  # open_clip's default context

    def build(self, embed_dim: Optional[int] = None) -> open_clip.CLIP:
        """The towers, randomly initialised, projecting to ``embed_dim`` (default: the arch's own)."""
        resize = {} if embed_dim in (None, self.embed_dim) else {"embed_dim": embed_dim}
        if self.from_open_clip:
            return open_clip_model(self.name, **resize)
        if self.prepare is not None:
            self.prepare()
        clip = open_clip.CLIP(**dict(self.open_clip_config(), **resize))
        if self.finish is not None:
            self.finish(clip)
        return clip

    def tokenizer(self):
        """open_clip's bundled BPE at this context length (nothing is fetched for euclip's own archs)."""
        if self.from_open_clip:
            return open_clip.get_tokenizer(self.name)
        return open_clip.tokenizer.SimpleTokenizer(context_length=self.context_length)


ARCHS: dict[str, Arch] = {}


def register(arch: Arch) -> Arch:
    """Add ``arch`` to the registry under its name; a name already taken is refused (a bug in the caller)."""
    if arch.name in ARCHS:
        raise ValueError(f"model.arch '{arch.name}' is registered twice")
    ARCHS[arch.name] = arch
    return arch


def local_names() -> list[str]:
    """euclip's registered archs, in registration order."""
    return list(ARCHS)


def lookup(name: str) -> Arch:
    """The arch ``model.arch`` names: a registered one, else an open_clip model; else a usage error."""
    if name in ARCHS:
        return ARCHS[name]
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        raise UsageError(f"model.arch '{name}' is neither one of euclip's CPU archs ({', '.join(ARCHS)}) "
                         f"nor an open_clip model (open_clip.list_models(), e.g. ViT-B-32)")
    return Arch(name, cfg["embed_dim"], cfg.get("vision_cfg", {}), cfg.get("text_cfg", {}), from_open_clip=True)


class _DropMessage(logging.Filter):
    """Drops the log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def open_clip_model(name: str, **kwargs) -> open_clip.CLIP:
    """open_clip's registered model ``name`` as open_clip builds it, randomly initialised."""
    # open_clip warns on the root logger that the model is "initialized randomly"; euclip then
    # initialises or loads the weights itself (eval, resume, import), so the line would mislead.
    if (open_clip.get_model_config(name) or {}).get("text_cfg", {}).get("hf_model_name"):
        hf_text_towers()
    quiet = _DropMessage("No pretrained weights loaded for model")
    logging.getLogger().addFilter(quiet)
    try:
        return open_clip.create_model(name, pretrained=None, **kwargs)
    finally:
        logging.getLogger().removeFilter(quiet)


class ConvStem(nn.Sequential):
    """``(B, 3, H, W) -> (B, width, H / 2**k, W / 2**k)``, in the place of a ViT's ``conv1``: a stack of
    stride-2 3x3 convolutions (Xiao et al. 2021, "Early convolutions help transformers see better").

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


@dataclass(frozen=True)
class WithConvStem:
    """A ``finish`` that patchifies with a ``ConvStem`` of these stride-2 channels instead of one
    patch-sized convolution; their total stride must equal the patch size, so the token grid is unchanged."""

    channels: tuple[int, ...]

    def __call__(self, clip: open_clip.CLIP) -> None:
        patch = clip.visual.conv1.kernel_size[0]
        if 2 ** len(self.channels) != patch:
            raise ValueError(f"a conv stem of stride {2 ** len(self.channels)} on patches of {patch}")  # a bug in the table
        clip.visual.conv1 = ConvStem(clip.visual.conv1.out_channels, self.channels)


_TINY_TEXT = dict(context_length=32, vocab_size=49408, width=128, heads=2, layers=4)

# open_clip's ModifiedResNet image tower (width 16) and a 4-layer text transformer: the tower of the
# temperature studies. Its BatchNorm learns the world's shapes where towers without batch statistics
# learn colours, sizes and fills first (feature suppression; docs/embedded-world.md), but makes
# gradient accumulation inexact; the paper's ViTs have none.
register(Arch("tiny", 128, dict(image_size=64, layers=[1, 1, 1, 1], width=16, head_width=32), _TINY_TEXT))
# The same sizes as a ViT (64 px, patch 8, width 128, 4 layers): the paper's tower family.
register(Arch("tiny-vit", 128, dict(image_size=64, patch_size=8, width=128, layers=4, head_width=64), _TINY_TEXT))
# The same ViT with a convolutional stem in place of its patchify convolution.
register(Arch("tiny-vit-conv", 128, dict(image_size=64, patch_size=8, width=128, layers=4, head_width=64), _TINY_TEXT,
              finish=WithConvStem((32, 64, 128))))
# A ViT on 32 px images with 4 px patches: as many tokens as tiny-vit, each seeing a quarter of the area.
register(Arch("tiny-vit-32", 128, dict(image_size=32, patch_size=4, width=128, layers=4, head_width=64), _TINY_TEXT))
# The tiny recipes' tower: a ViT on a 4 x 4 grid of tokens, each from a four-stage conv stem (16 px of
# the image). It learns the world's shapes within tiny-clip's budget in every geometry of the study
# (docs/embedded-world.md says how it was chosen).
register(Arch("tiny-vit-c16", 128, dict(image_size=64, patch_size=16, width=128, layers=4, head_width=64), _TINY_TEXT,
              finish=WithConvStem((16, 32, 64, 128))))

# MERU's released towers (facebookresearch/meru): a timm ViT at 224 px (class-token pooling, a bias-free
# linear projection) and a 12-layer, width-512 causal text transformer; MERU builds its ViT with torch's
# LayerNorm (eps 1e-5, not timm's 1e-6) and normalises images with ImageNet's mean and std.
# ``euclip import meru`` loads their checkpoints into these.
MERU_TEXT = dict(context_length=77, vocab_size=49408, width=512, heads=8, layers=12)
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


def sincos_positions(rows: int, cols: int, width: int) -> torch.Tensor:
    """MoCo v3's fixed 2-D sine-cosine position embedding, which MERU's ViTs use: ``(1 + rows * cols, width)``,
    the class token's row zero, then the patches in timm's order (row by row). The patch in row r and column
    c gets ``[sin(r w), cos(r w), sin(c w), cos(c w)]`` with ``w_k = 10000^(-k / q)``, k < q = width / 4.
    (MoCo v3's code names the row's half "w"; on the square grids of these towers it is the row.)"""
    if width % 4:
        raise ValueError(f"a 2-D sine-cosine embedding needs a width divisible by 4, not {width}")  # a bug in the table
    q = width // 4
    omega = 10000.0 ** -(torch.arange(q, dtype=torch.float32) / q)
    row, col = torch.meshgrid(torch.arange(rows, dtype=torch.float32), torch.arange(cols, dtype=torch.float32),
                              indexing="ij")
    by_row, by_col = row.reshape(-1, 1) * omega, col.reshape(-1, 1) * omega
    patches = torch.cat([by_row.sin(), by_row.cos(), by_col.sin(), by_col.cos()], dim=1)
    return torch.cat([torch.zeros(1, width), patches])


def meru_towers(clip: open_clip.CLIP) -> None:
    """Make a timm image tower MERU's: torch's LayerNorm epsilon, ImageNet's mean and std, and fixed
    sine-cosine position embeddings (MERU's ``use_sincos2d_pos``: set once, never learned)."""
    trunk = clip.visual.trunk
    for module in trunk.modules():
        if isinstance(module, nn.LayerNorm):
            module.eps = MERU_LAYERNORM_EPS
    clip.visual.image_mean, clip.visual.image_std = IMAGENET_MEAN, IMAGENET_STD
    rows, cols = trunk.patch_embed.grid_size
    with torch.no_grad():
        trunk.pos_embed.copy_(sincos_positions(rows, cols, trunk.embed_dim)[None])
    trunk.pos_embed.requires_grad_(False)


def meru_arch(name: str, timm_model: str, embed_dim: int = 512, text_cfg: Optional[dict] = None) -> Arch:
    """MERU's towers around timm's ``timm_model``."""
    vision = dict(timm_model_name=timm_model, timm_model_pretrained=False, timm_pool="token", timm_proj="linear",
                  image_size=224)
    return Arch(name, embed_dim, vision, text_cfg or MERU_TEXT, finish=meru_towers, prepare=_register_mocov3_small)


for _name, _timm in {"meru-vit-s": "vit_small_mocov3_patch16_224", "meru-vit-b": "vit_base_patch16_224",
                     "meru-vit-l": "vit_large_patch16_224"}.items():
    register(meru_arch(_name, _timm))


# The entry point group under which a package names the modules that register its archs.
PLUGINS = "euclip.archs"


def _load_plugins() -> None:
    """Import every module a package names under ``euclip.archs``: their ``register`` calls add
    their towers in every process, beside euclip's own."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGINS):
        entry.load()


_load_plugins()
