"""A trained model outside its run directory: the export folder's layout, written and read here only.

An export is a folder (or a Hugging Face model repository holding one):

- ``open_clip_model.safetensors``: the towers, open_clip's ``CLIP`` state dict under open_clip's keys;
- ``euclip_config.json``: what rebuilds and scores the model: the run's whole config, the geometry and
  its learned scalars (log-space as trained, exactly, and as values), the final-LayerNorm switch, the
  tokenizer, the preprocessing and where the weights came from;
- ``open_clip_config.json``, only where open_clip can describe the towers (``open_clip_problem``):
  then ``open_clip.create_model_and_transforms("local-dir:DIR")`` (or ``"hf-hub:OWNER/REPO"``) loads
  them as open_clip's own model, whose cosine is this geometry's score;
- ``README.md``, the model card (written by ``euclip_cli.publish``).

``load(source)`` returns the towers, the transform, the tokenizer and the geometry's scorer from a
folder or ``hf://OWNER/REPO[@REVISION]``. The towers hold open_clip's keys whatever the geometry, so
only the scalars and the geometry live beside them; no pickle is read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from euclip_cli import config as C
from euclip_cli.data.fetch import configure_hub_client
from euclip_cli.errors import Failure, UsageError
from euclip_cli.model import EuclipModel, state_mismatch
from euclip_cli.towers import archs, image_size, tokenizer_for, transforms_for

FORMAT = "euclip-export"
FORMAT_VERSION = 1
WEIGHTS = "open_clip_model.safetensors"
CONFIG = "euclip_config.json"
OPEN_CLIP_CONFIG = "open_clip_config.json"
CARD = "README.md"
FILES = (WEIGHTS, CONFIG, OPEN_CLIP_CONFIG, CARD)
HUB_PREFIX = "hf://"
# open_clip's default image statistics (OpenAI's), which a tower that names none is normalised with.
OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


class ExportError(UsageError):
    """A folder or repository that is not a readable euclip export."""


def open_clip_problem(config: dict) -> Optional[str]:
    """Why open_clip cannot load these towers and score them as trained, or None when it can: open_clip
    scores by cosine (so the clip geometry only, whose config keeps one class token), always has its final
    LayerNorms, and builds only what its model config says (no conv stem or timm finishing of euclip's archs)."""
    model, geometry = config["model"], config["geometry"]
    if geometry["name"] != "clip":
        return f"open_clip scores by cosine, not by the {geometry['name']} geometry's similarity"
    if not model["final_ln"]:
        return "open_clip's towers always end in a LayerNorm; this model has none"
    arch = archs.lookup(model["arch"])
    if arch.finish is not None or arch.prepare is not None:
        return f"model.arch={arch.name} changes open_clip's towers after building them (a conv stem, timm towers)"
    return None


def open_clip_model_config(config: dict, embed_dim: int) -> dict:
    """The open_clip model config (``model_cfg``) that builds these towers at their embedding width."""
    arch = archs.lookup(config["model"]["arch"])
    if arch.from_open_clip:
        import open_clip

        found = dict(open_clip.get_model_config(arch.name))
    else:
        found = arch.open_clip_config()
    return {**found, "embed_dim": embed_dim}


def preprocessing(model: EuclipModel) -> dict:
    """What the evaluation transform does to an image: resize the shorter side, crop the centre, normalise."""
    visual = model.clip.visual
    return {"image_size": image_size(model.clip), "resize": "shortest side, then centre crop",
            "interpolation": "bicubic",
            "mean": list(getattr(visual, "image_mean", None) or OPENAI_MEAN),
            "std": list(getattr(visual, "image_std", None) or OPENAI_STD)}


def tokenizer_facts(config: dict) -> dict:
    arch = archs.lookup(config["model"]["arch"])
    return {"kind": f"open_clip.get_tokenizer('{arch.name}')" if arch.from_open_clip else "open_clip SimpleTokenizer "
            "(the bundled CLIP BPE, 49,408 tokens)", "context_length": arch.context_length}


def scalars_of(model: EuclipModel) -> dict[str, float]:
    """The geometry's learned scalars that live outside the towers, as stored (log-space), exactly."""
    return {name: value.item() for name, value in model.state_dict().items() if not name.startswith("clip.")}


def write(folder: Path, model: EuclipModel, config: dict, provenance: dict) -> dict:
    """Write the weights and the configs of ``model`` (built from ``config``) into ``folder``; returns the
    euclip config as written. The caller owns the folder's atomicity and the model card."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    towers = {key: value.detach().contiguous().cpu() for key, value in model.clip.state_dict().items()}
    try:
        save_file(towers, str(folder / WEIGHTS), metadata={"format": FORMAT, "geometry": config["geometry"]["name"]})
    except SafetensorError as err:  # safetensors reports its write's OS error (a full disk) as its own error
        raise Failure(f"{folder / WEIGHTS} could not be written ({str(err).splitlines()[0]}): free space where the "
                      f"export goes, or give another folder, and export again") from None
    embed_dim = int(model.clip.text_projection.shape[-1])
    problem = open_clip_problem(config)
    described = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "geometry": {"name": config["geometry"]["name"], "logit": model.geometry.logit,
                     "blocks": config["geometry"]["blocks"], **model.scalars()},
        "scalars": scalars_of(model),
        "final_ln": config["model"]["final_ln"], "embed_dim": model.embed_dim,
        "tokenizer": tokenizer_facts(config), "preprocess": preprocessing(model),
        "open_clip": problem or "loads with open_clip.create_model_and_transforms('local-dir:DIR')",
        "provenance": provenance, "config": config,
    }
    (folder / CONFIG).write_text(json.dumps(described, indent=2) + "\n")
    if problem is None:
        pre = described["preprocess"]
        (folder / OPEN_CLIP_CONFIG).write_text(json.dumps(
            {"model_cfg": open_clip_model_config(config, embed_dim),
             "preprocess_cfg": {"mean": pre["mean"], "std": pre["std"]}}, indent=2) + "\n")
    return described


def read_described(folder: Path) -> dict:
    """The euclip config an export folder holds, checked (and its weights file there, unread); an ``ExportError``
    names the file that is missing or not what an export holds."""
    config_file, weights_file = folder / CONFIG, folder / WEIGHTS
    for path in (config_file, weights_file):
        if not path.is_file():
            raise ExportError(f"{folder} is not a euclip export: it has no {path.name} "
                              f"(euclip export RUN DIR writes one)")
    try:
        described = json.loads(config_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ExportError(f"{config_file}: not JSON ({err})") from None
    if not isinstance(described, dict) or described.get("format") != FORMAT:
        raise ExportError(f"{config_file}: not a euclip export's config (no \"format\": \"{FORMAT}\")")
    if described.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{config_file}: export format version {described.get('format_version')!r}; this "
                          f"euclip reads version {FORMAT_VERSION}: use the euclip version that wrote it")
    for key in ("config", "scalars"):
        if not isinstance(described.get(key), dict):
            raise ExportError(f"{config_file}: no \"{key}\" object")
    return described


def contradictions(described: dict, header: dict) -> list[str]:
    """Where an export's statements about itself disagree with the run's config it holds, which is what
    rebuilds the model: the weights' safetensors header (its geometry), and the geometry, logit, blocks,
    final LayerNorm, tokenizer and image size that euclip_config.json states beside the config. An edit of
    one of them (a CLIP export relabelled Euclidean) would otherwise score the towers in another geometry."""
    try:
        cfg = C.from_dict(described["config"])
    except C.ConfigError:
        return []  # rebuild names a config this euclip cannot read
    stated, geometry = described.get("geometry") or {}, described["config"]["geometry"]
    checks = [(f"{WEIGHTS}'s header: geometry", header.get("geometry"), cfg.geometry.name),
              (f"{CONFIG}: geometry.name", stated.get("name"), cfg.geometry.name),
              (f"{CONFIG}: geometry.logit", stated.get("logit"), C.resolved_logit(cfg)),
              (f"{CONFIG}: geometry.blocks", stated.get("blocks"), geometry.get("blocks")),
              (f"{CONFIG}: final_ln", described.get("final_ln"), cfg.model.final_ln),
              (f"{CONFIG}: tokenizer", described.get("tokenizer"), tokenizer_facts(described["config"])),
              (f"{CONFIG}: preprocess.image_size", (described.get("preprocess") or {}).get("image_size"),
               archs.lookup(cfg.model.arch).image_size)]
    return [f"{where} says {said!r}, the run's config {meant!r}" for where, said, meant in checks if said != meant]


def read(folder: Path) -> tuple[dict, dict]:
    """``(euclip config as written, EuclipModel state dict)`` of an export folder (``read_described``, then
    the weights and the scalars); an ``ExportError`` where the export contradicts itself (``contradictions``)."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    described = read_described(folder)
    config_file, weights_file = folder / CONFIG, folder / WEIGHTS
    try:
        towers = load_file(str(weights_file))
        with safe_open(str(weights_file), "pt") as opened:
            header = opened.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise ExportError(f"{weights_file}: not a readable safetensors file ({str(err).splitlines()[0]})") from None
    disagree = contradictions(described, header)
    if disagree:
        raise ExportError(f"{folder}: the export contradicts itself ({'; '.join(disagree)}): nothing was imported; "
                          f"export the run again (euclip export RUN DIR)")
    state = {"clip." + key: value for key, value in towers.items()}
    for name, value in described["scalars"].items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ExportError(f"{config_file}: scalar '{name}' is {value!r}, not a finite number")
        state[name] = torch.tensor(float(value))
    return described, state


def fetch(source: str) -> Path:
    """The local folder of ``source``: a folder, or ``hf://OWNER/REPO[@REVISION]`` downloaded through
    huggingface_hub (its cache, token and offline mode apply)."""
    if not source.startswith(HUB_PREFIX):
        folder = Path(source)
        if not folder.is_dir():
            raise ExportError(f"{source}: no such folder (give an export's folder, or {HUB_PREFIX}OWNER/REPO)")
        return folder
    repo, _, revision = source[len(HUB_PREFIX):].partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ExportError(f"{source}: expected {HUB_PREFIX}OWNER/REPO or {HUB_PREFIX}OWNER/REPO@REVISION")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    configure_hub_client()
    try:
        return Path(snapshot_download(repo, revision=revision or None, allow_patterns=[CONFIG, WEIGHTS]))
    except (RepositoryNotFoundError, GatedRepoError):
        raise UsageError(f"{source}: no model repository {repo} on the Hub that this token may read "
                         f"(a private one needs HF_TOKEN or 'hf auth login')") from None
    except RevisionNotFoundError:
        raise UsageError(f"{source}: the repository {repo} has no revision '{revision}'") from None
    except LocalEntryNotFoundError:
        raise Failure(f"{source}: not in the local Hugging Face cache and the Hub cannot be reached; check "
                      f"the network or HF_HUB_OFFLINE") from None
    except HfHubHTTPError as err:
        raise Failure(f"{source}: the Hub refused it ({str(err).splitlines()[0]})") from None


def rebuild(described: dict, state: dict, source: str) -> tuple[EuclipModel, C.Config]:
    """The model an export describes, its weights loaded; an ``ExportError`` where they do not fit."""
    try:
        cfg = C.from_dict(described["config"])
    except C.ConfigError as err:
        raise ExportError(f"{source}: its config is not one this euclip reads ({err}); use the euclip "
                          f"version that wrote it") from None
    model = EuclipModel(cfg)
    problem = state_mismatch(model, state)
    if problem:
        raise ExportError(f"{source}: its weights do not fit the model its config builds ({problem})")
    expected = model.state_dict()
    model.load_state_dict({key: value.to(expected[key].dtype) for key, value in state.items()})
    return model.eval(), cfg


@dataclass
class Exported:
    """A loaded export: ``model.encode_image(preprocess(img)[None])`` and ``model.encode_text(tokenizer(texts))``
    give output-space embeddings; ``score(x, y)`` is the geometry's similarity ``(N, D), (M, D) -> (N, M)``."""

    model: EuclipModel
    config: C.Config
    preprocess: Callable
    tokenizer: Callable
    described: dict

    @property
    def geometry(self):
        return self.model.geometry

    def score(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.geometry.similarity(x, y, self.model.curvature())

    def prototypes(self, text_embeddings: torch.Tensor) -> torch.Tensor:
        """Zero-shot class prototypes ``(C, D)`` from ``(C, T, D)`` template embeddings, the geometry's rule."""
        return self.geometry.prototypes(text_embeddings)


def load(source: str) -> Exported:
    """An export from a folder or ``hf://OWNER/REPO[@REVISION]``, on the CPU, in evaluation mode."""
    described, state = read(fetch(source))
    model, cfg = rebuild(described, state, source)
    return Exported(model, cfg, transforms_for(model.clip)[1], tokenizer_for(cfg.model.arch), described)
