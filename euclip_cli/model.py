"""open_clip encoders plus the geometry's learnable scalars.

``EuclipModel`` wraps an ``open_clip.CLIP`` (built with ``pretrained=None``; its tokenizer is
open_clip's bundled BPE, so nothing is fetched) and adds what the geometry needs:
the logit scale t (open_clip's own ``logit_scale`` parameter, beta = exp(t)), and for
hyperbolic models the log embedding scales alpha_img, alpha_txt and the log curvature.
Features always come from ``encode_image/encode_text(normalize=False)``; the geometry,
not open_clip, decides what happens to them, in fp32 with autocast off.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import open_clip
import torch
from torch import nn

from euclip_cli.config import Config, initial_logit_scale, resolved_logit
from euclip_cli.device import autocast_factory
from euclip_cli.errors import Failure, UsageError
from euclip_cli.geometry import get_geometry
from euclip_cli.loss import at_least_fp32
from euclip_cli.rundir import RUNS_DIR, RunDir, path_problem, resolve
from euclip_cli.towers import build_clip, projection_names, remove_final_layernorm, token_width
from euclip_cli.towers.text import TextPlan, class_tokens, groups_for, text_features, text_plan


def state_mismatch(model: nn.Module | dict, state: dict) -> Optional[str]:
    """What stops ``state`` (a state dict) from loading into ``model`` (a module, or the state dict it
    expects), in words, or None when it fits: the number and first of the missing and the unexpected keys,
    or the first tensor of another shape."""
    expected = model if isinstance(model, dict) else model.state_dict()
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


def _geometry(cfg: Config, embed_dim: int):
    """The configured geometry for embeddings of ``embed_dim``; a usage error where its blocks do not divide it."""
    g = cfg.geometry
    geometry = get_geometry(g.name, logit=resolved_logit(cfg), blocks=g.blocks)
    if geometry.facts.uses_blocks and embed_dim % g.blocks:
        raise UsageError(f"geometry.blocks={g.blocks} does not divide the embedding dimension {embed_dim}")
    return geometry


def check_buildable(cfg: Config) -> None:
    """What ``EuclipModel(cfg)`` would refuse in the configuration (an unknown arch, class tokens or
    geometry blocks that do not divide its dimension), found from names and sizes without building a
    tower: the trainer checks this before it looks at the data, and builds the model after."""
    width = token_width(cfg.model.arch, cfg.model.class_tokens, cfg.model.embed_dim)
    _geometry(cfg, width * cfg.model.class_tokens)


class EuclipModel(nn.Module):
    def __init__(self, cfg: Config, clip: Optional[open_clip.CLIP] = None):
        """``clip``: already-built towers (e.g. an open_clip pretrained model) instead of fresh ones."""
        super().__init__()
        self.clip = clip if clip is not None else build_clip(cfg.model.arch, cfg.model.class_tokens,
                                                              cfg.model.embed_dim)
        if not cfg.model.final_ln:
            remove_final_layernorm(self.clip)
        # What starts fresh when the towers come from another run (``start_from``), and all that learns
        # besides the scalars when they are frozen.
        self.projection_names = (projection_names(cfg.model.arch, cfg.model.class_tokens)
                                 if cfg.model.init_from or cfg.model.freeze_towers else frozenset())
        self.towers_frozen = cfg.model.freeze_towers
        self.started_from: Optional[dict] = None  # set by ``initial_model`` when the towers come from a run
        if self.towers_frozen:
            for name, p in self.clip.named_parameters():
                p.requires_grad_(name in self.projection_names)
        self.text_groups = cfg.model.text_groups
        g = cfg.geometry
        # Multi(n, m) towers project each of their m class tokens to n = text_projection's width.
        self.embed_dim = self.clip.text_projection.shape[-1] * class_tokens(self.clip)
        self.geometry = _geometry(cfg, self.embed_dim)
        if clip is None:
            with torch.no_grad():
                self.clip.logit_scale.fill_(initial_logit_scale(cfg))
        self.clip.logit_scale.requires_grad_(g.learn_logit_scale)
        # SigLIP's learnable bias b on every logit (loss.kind = "siglip"); None with InfoNCE, whose softmax
        # a bias would not change.
        self.logit_bias: Optional[nn.Parameter] = (nn.Parameter(torch.tensor(float(cfg.loss.siglip_bias_init)))
                                                   if cfg.loss.kind == "siglip" else None)
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
        self.max_log_alpha = math.log(g.alpha_max) if g.alpha_max is not None else None
        if self.geometry.has_curvature:
            self.log_curv = nn.Parameter(torch.tensor(math.log(g.curvature_init)), requires_grad=g.learn_curvature)
            self.log_curv_range = (math.log(g.curvature_min), math.log(g.curvature_max))

    def train(self, mode: bool = True) -> "EuclipModel":
        """Frozen towers run as at evaluation (no BatchNorm statistic moves, no dropout) even while the
        projections train; a projection is a bare matrix or linear map, which no mode changes."""
        super().train(mode)
        if self.towers_frozen:
            self.clip.eval()
        return self

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
            features = text_features(self.clip, tokens, plan, groups_for(self.text_groups, device))
        return self._embed(features, getattr(self, "log_alpha_txt", None))

    def text_plans(self, tokens: torch.Tensor, chunks: int = 1) -> list[Optional[TextPlan]]:
        """The text tower's plan for each of ``chunks`` micro-batches of ``tokens (B, L)``, on the host."""
        most = groups_for(self.text_groups, next(self.clip.parameters()).device)
        return [text_plan(self.clip, part, most) for part in tokens.chunk(chunks)]

    def logit_scale(self) -> torch.Tensor:
        """beta = exp(t), 0-dim. t is kept in range by ``clamp_scalars_`` after each step."""
        return at_least_fp32(self.clip.logit_scale).exp()

    def curvature(self) -> Optional[torch.Tensor]:
        return at_least_fp32(self.log_curv).exp() if self.geometry.has_curvature else None

    def loss_scalars(self) -> list[nn.Parameter]:
        """The learnable parameters that enter only the loss, not an encoder (t, log c where learned, and
        SigLIP's b): under several ranks they are live on rank 0 alone (``euclip_cli.step``)."""
        found = [self.clip.logit_scale] + ([self.log_curv] if self.geometry.has_curvature else [])
        found += [self.logit_bias] if self.logit_bias is not None else []
        return [q for q in found if q.requires_grad]

    def compile_encoders(self) -> None:
        """torch.compile both towers in place (``train.compile``): the state dict keeps its keys."""
        self.clip.visual.compile()
        self.clip.transformer.compile()

    @torch.no_grad()
    def clamp_scalars_(self) -> None:
        """Clamp t to [min, ln max], log c to its interval and log alpha below ln alpha_max (where set), on the
        parameters themselves.

        Clamping the parameter (as OpenCLIP does for t and MERU for c), not the value inside
        forward (as the EuCLIP fork does for c), keeps the gradient alive at the bounds, so a
        curvature pushed to its floor can come back.
        """
        self.clip.logit_scale.clamp_(min=self.min_log_scale, max=self.max_log_scale)
        if self.geometry.has_curvature:
            self.log_curv.clamp_(*self.log_curv_range)
        if self.geometry.learned_scales and self.max_log_alpha is not None:
            self.log_alpha_img.clamp_(max=self.max_log_alpha)
            self.log_alpha_txt.clamp_(max=self.max_log_alpha)

    def scalars(self) -> dict[str, float]:
        """The learnable scalars, for logging."""
        out = {"logit_scale": self.logit_scale().item()}
        if self.geometry.has_curvature:
            out["curvature"] = self.curvature().item()
        if self.geometry.learned_scales:
            out["alpha_img"] = self.log_alpha_img.exp().item()
            out["alpha_txt"] = self.log_alpha_txt.exp().item()
        if self.logit_bias is not None:
            out["logit_bias"] = self.logit_bias.item()
        return out


def init_source(cfg: Config, runs_dir: Optional[Path] = None) -> RunDir:
    """The run ``model.init_from`` names (a path, or a name under ``runs_dir``, default the runs folder), or a
    usage error naming the key and the commands that make such a run."""
    name, runs_dir = cfg.model.init_from, runs_dir or RUNS_DIR
    for candidate in (Path(name), runs_dir / name):
        problem = path_problem(candidate)  # a path no file system holds: looking it up would fail in the OS
        if problem:
            raise UsageError(f"model.init_from: {problem}")
    try:
        return resolve(name, runs_dir)
    except UsageError:
        raise UsageError(f"model.init_from: no run '{name}' (neither a run folder nor a name under "
                         f"{runs_dir}); train it (euclip train --recipe RECIPE --name {name}) or import "
                         f"a released model under that name (euclip import FORMAT SOURCE --name {name})") from None


def start_from(model: EuclipModel, source: RunDir) -> dict:
    """Load the towers of ``source``'s latest checkpoint into ``model`` (``model.init_from``), all but the
    projections and the logit scale, which keep their fresh values, as do the geometry's other scalars;
    returns where they came from, for the run's metadata. A usage error names a source without a
    checkpoint or with other towers."""
    found, state = source.readable_checkpoint()
    if found is None:
        raise UsageError(f"model.init_from: {source.path} has no readable checkpoint: train it (euclip train) or "
                         f"import one (euclip import) first")
    fresh = model.projection_names | {"logit_scale"}
    theirs = {key.removeprefix("clip."): value for key, value in state["model"].items()
              if key.startswith("clip.") and key.removeprefix("clip.") not in fresh}
    ours = {key: value for key, value in model.clip.state_dict().items() if key not in fresh}
    problem = state_mismatch(ours, theirs)
    if problem:
        arch = state["config"]["model"]
        raise UsageError(f"model.init_from: the towers of {found} (model.arch={arch['arch']}, model.final_ln="
                         f"{arch['final_ln']}, model.class_tokens={arch['class_tokens']}) do not fit this run's "
                         f"({problem}); start from a run of this run's arch, final LayerNorm and class tokens")
    model.clip.load_state_dict(theirs, strict=False)
    return {"run": str(source.path), "checkpoint": found.name, "step": state["step"]}


def initial_model(cfg: Config, runs_dir: Optional[Path] = None, towers: bool = True) -> EuclipModel:
    """The model a run of ``cfg`` starts training from, on the CPU: its weights are fixed by
    ``train.seed`` and, with ``model.init_from`` (resolved under ``runs_dir``, default the runs folder), its
    towers are that run's (``towers=False`` leaves them fresh: a resumed run loads its own). The trainer
    builds it through this function, so a study can measure a run's untrained state without a checkpoint
    of it. ``model.started_from`` says where the towers came from (None: fresh)."""
    import random

    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    model = EuclipModel(cfg)
    if cfg.model.init_from and towers:
        model.started_from = start_from(model, init_source(cfg, runs_dir))
    return model
