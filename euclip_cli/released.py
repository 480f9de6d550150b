"""Released checkpoints as euclip runs (``euclip import FORMAT SOURCE --name RUN``).

A format turns a released checkpoint into the state of an ``EuclipModel`` plus the config that
rebuilds it; ``import_run`` writes both as the step-0 checkpoint of an ordinary run directory
(``meta.json`` names the format, the source and its sha256), so evaluation, the analyses and
the reports treat it like a trained run.

Formats (``FORMATS``):
- ``openclip``: an open_clip pretrained model, ``ARCH:TAG`` (TAG a pretrained name or a file);
  the clip geometry.
- ``euclip-authors``: a checkpoint of the EuCLIP authors' open_clip fork (EIFY/open_clip, branch
  ``euclip``): open_clip's CLIP keys plus, for hyperbolic models, ``alpha_img``, ``alpha_txt``
  and ``curvature``, all log-space. Geometry, logit and model come from the run's ``params.txt``
  (beside the checkpoint or one folder up, as OpenCLIP writes it) or from the command line.

- ``euclip-export``: a folder ``euclip export`` wrote, or ``hf://OWNER/REPO[@REVISION]`` holding one
  (``euclip_cli.exported``): its config and weights as they were exported.
- ``meru``: MERU's released checkpoints (facebookresearch/meru, ``{"model": state_dict}``), MERU
  or its CLIP baseline, into euclip's MERU towers (``towers.archs.meru_arch``: timm's ViT as MERU builds
  it, open_clip's text transformer under MERU's weights); MERU's clamps (logit scale, alphas,
  curvature) applied at import as its forward applies them.
- ``hycoclip``: HyCoCLIP's released checkpoints (PalAvik/hycoclip; huggingface avik-pal/hycoclip), its CLIP,
  MERU and HyCoCLIP models trained on GRIT, in MERU's layout and imported as ``meru`` is; the released file's
  name says which model it is. HyCoCLIP's zero-shot suite is MERU's (the same 20 sets and prompts), so the run
  evaluates on ``meru``.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from euclip_cli import config as C
from euclip_cli.data.fetch import configure_hub_client, sha256_of
from euclip_cli.errors import Failure, UsageError
from euclip_cli.rundir import RunDir, checkpoint_meta, plain_name, write_text_atomic

HUB_PREFIX = "hf://"
# The fork's ``--geometry`` values: euclip's (geometry, logit).
AUTHORS_GEOMETRIES = {
    "clip": ("clip", "cos"),
    "elliptic": ("elliptic", "arccos"),
    "euclidean": ("euclidean", "d"),
    "euclidean-squared": ("euclidean", "d2"),
    "hyperbolic": ("hyperbolic", "d"),
    "hyperbolic-squared": ("hyperbolic", "d2"),
}
# The fork's model configs without both final LayerNorms.
NO_FINAL_LN = "-no-final-ln"
# The fork's hyperbolic scalars (log-space) and the EuclipModel parameters that hold them.
AUTHORS_SCALARS = {"alpha_img": "log_alpha_img", "alpha_txt": "log_alpha_txt", "curvature": "log_curv"}
# The fork clamps c = exp(curvature) to [0.1, 10] inside its forward (model.py L311-340).
AUTHORS_CURVATURE_RANGE = (0.1, 10.0)


class CheckpointError(UsageError):
    """The checkpoint does not fit the model it claims to be (keys, shapes, geometry)."""


class UnreadableCheckpoint(Failure):
    """The file cannot be read as a checkpoint (truncated, not a torch file)."""


@dataclass
class Converted:
    overrides: list[str]  # config keys that rebuild the model (arch, final_ln, geometry, logit)
    state: Optional[dict]  # the EuclipModel state dict; None when ``clip`` carries the weights
    meta: dict  # provenance for meta.json
    clip: object = None  # already-built open_clip towers (the openclip format)
    # The suite the run evaluates on by default: the one its authors report (MERU's own for its models).
    tasks: str = "datacomp"
    # The whole config, where the source carries one (an euclip export): used instead of ``overrides``.
    config: Optional[dict] = None


def fetch_source(source: str, sibling: Optional[str] = None) -> Optional[Path]:
    """A local file, or ``hf://OWNER/REPO/PATH`` fetched through huggingface_hub (its cache and its
    offline mode apply). With ``sibling``, the file of that name in the source's folder, or None."""
    if not source.startswith(HUB_PREFIX):
        path = Path(source)
        if sibling is not None:
            return path.parent / sibling
        if not path.is_file():
            raise UsageError(f"{source}: no such file (give a checkpoint file, or {HUB_PREFIX}OWNER/REPO/PATH)")
        return path
    parts = source[len(HUB_PREFIX):].split("/")
    if len(parts) < 3 or not all(parts):
        raise UsageError(f"{source}: expected {HUB_PREFIX}OWNER/REPO/PATH/TO/FILE")
    repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
    if sibling is not None:
        # The Hub takes no ".." in a file name: resolve it here; above the repository's root is nothing.
        filename = posixpath.normpath("/".join([*parts[2:-1], sibling]))
        if filename.startswith(".."):
            return None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    from huggingface_hub import constants

    configure_hub_client()
    try:
        return Path(hf_hub_download(repo, filename))
    except (EntryNotFoundError, LocalEntryNotFoundError) as err:
        if sibling is not None:
            return None
        # Offline, a file missing from the cache may still be on the Hub: say which of the two is known.
        if isinstance(err, EntryNotFoundError) and not constants.HF_HUB_OFFLINE:
            raise UsageError(f"{source}: the repository {repo} has no file {filename}") from None
        raise Failure(f"{source}: not in the local Hugging Face cache and the Hub cannot be reached "
                      f"{'(HF_HUB_OFFLINE is set)' if constants.HF_HUB_OFFLINE else ''}; check the network, or "
                      f"download the file and give its path") from None
    except HfHubHTTPError as err:
        raise Failure(f"{source}: the Hub refused it ({str(err).splitlines()[0]})") from None


def read_params(path: Optional[Path]) -> dict[str, str]:
    """OpenCLIP's ``params.txt`` (``key: value`` per line) as a dict; {} when there is none."""
    if path is None or not path.is_file():
        return {}
    params = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            params[key.strip()] = value.strip()
    return params


def _load(path: Path) -> dict:
    import pickle
    import zipfile

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    # KeyError: arbitrary bytes read as a legacy pickle look up memo entries that do not exist.
    except (RuntimeError, EOFError, OSError, KeyError, pickle.UnpicklingError, zipfile.BadZipFile,
            ValueError) as err:
        raise UnreadableCheckpoint(f"{path}: not a readable torch checkpoint ({str(err).splitlines()[0][:160]})"
                                   ) from None


def convert_openclip(source: str, geometry: Optional[str], logit: Optional[str], arch: Optional[str]) -> Converted:
    import open_clip

    from euclip_cli.startup import hf_text_towers

    if geometry not in (None, "clip") or logit not in (None, "cos", "default") or arch is not None:
        raise UsageError("the openclip format is open_clip's own CLIP (clip geometry, cosine logit) and names "
                         "its model in SOURCE (ARCH:TAG): --geometry, --logit and --arch do not apply")
    model_arch, _, tag = source.partition(":")
    if not model_arch or not tag:
        raise UsageError(f"'{source}': expected ARCH:TAG, e.g. ViT-B-32:datacomp_m_s128m_b4k")
    hf_text_towers()  # a released model may have a Hugging Face text tower; its config is read only as it loads
    try:
        clip = open_clip.create_model(model_arch, pretrained=tag)
    except RuntimeError as err:  # open_clip's message for an unknown model or tag
        raise UsageError(f"'{source}': {str(err).splitlines()[0]}") from None
    except OSError as err:  # the Hugging Face hub unreachable, or the file missing
        raise Failure(f"'{source}': could not load the weights ({str(err).splitlines()[0]}); check the "
                      f"network connection or the path") from None
    meta = {"source": "open_clip pretrained", "arch": model_arch, "pretrained": tag}
    if Path(tag).is_file():
        meta["sha256"] = sha256_of(Path(tag))
    return Converted([f"model.arch={model_arch}", "geometry.name=clip"], None, meta, clip)


def convert_authors(source: str, geometry: Optional[str], logit: Optional[str], arch: Optional[str]) -> Converted:
    """The EuCLIP authors' fork: same CLIP keys as open_clip, log-space hyperbolic scalars."""
    import torch

    path = fetch_source(source)
    params = {}
    for name in ("params.txt", "../params.txt"):
        found = fetch_source(source, name)
        params = read_params(found)
        if params:
            break
    fork_geometry = params.get("geometry")
    if geometry is None:
        if fork_geometry is None:
            raise UsageError(f"{source}: no params.txt beside it or one folder up names its geometry: give "
                             f"--geometry and --logit (the fork's --geometry values: {', '.join(AUTHORS_GEOMETRIES)})")
        if fork_geometry not in AUTHORS_GEOMETRIES:
            raise CheckpointError(f"{source}: params.txt names the geometry '{fork_geometry}', which is not one of "
                                  f"{', '.join(AUTHORS_GEOMETRIES)}")
        geometry, logit = AUTHORS_GEOMETRIES[fork_geometry]
    elif logit is None:
        raise UsageError("--geometry needs --logit too (e.g. --geometry euclidean --logit d2)")
    model_name = arch or params.get("model")
    if model_name is None:
        raise UsageError(f"{source}: no params.txt names its model: give --arch (e.g. ViT-B-16 or "
                         f"ViT-B-16-no-final-ln)")
    final_ln = not model_name.endswith(NO_FINAL_LN)
    base_arch = model_name[: -len(NO_FINAL_LN)] if not final_ln else model_name

    checkpoint = _load(path)
    weights = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"{source}: holds no state dict of tensors (expected OpenCLIP's "
                              f"{{'state_dict': ...}} or a bare state dict)")
    # DistributedDataParallel saves its wrapped module's keys with a "module." prefix.
    weights = {re.sub(r"^module\.", "", k): v for k, v in weights.items()}
    state = {}
    for key, value in weights.items():
        if key in AUTHORS_SCALARS:
            if key == "curvature":
                # Their forward clamps exp(curvature); euclip clamps the parameter, so the clamp is applied here.
                low, high = AUTHORS_CURVATURE_RANGE
                value = value.clamp(math.log(low), math.log(high))
            state[AUTHORS_SCALARS[key]] = value
        else:
            state["clip." + key] = value
    overrides = [f"model.arch={base_arch}", f"model.final_ln={str(final_ln).lower()}", f"geometry.name={geometry}",
                 f"geometry.logit={logit}"]
    meta = {"source": source, "sha256": sha256_of(path), "fork_geometry": fork_geometry,
            "fork_model": model_name, "params_txt": bool(params)}
    return Converted(overrides, state, meta)


# MERU's ViT widths: euclip's MERU archs (``towers.archs``).
MERU_WIDTHS = {384: "meru-vit-s", 768: "meru-vit-b", 1024: "meru-vit-l"}
# MERU's pixel normalisation, a buffer in its checkpoints; euclip's MERU towers apply the same in
# their transform, so a checkpoint with other values cannot be imported as they are.
MERU_PIXEL = {"pixel_mean": (0.485, 0.456, 0.406), "pixel_std": (0.229, 0.224, 0.225)}


def _meru_key(key: str, value):
    """One MERU state-dict entry as ``(euclip key, tensor)``, or None for what euclip rebuilds itself."""
    import torch

    if key.startswith("visual."):
        return "clip.visual.trunk." + key[len("visual."):], value
    if key == "visual_proj.weight":
        return "clip.visual.head.proj.weight", value
    if key == "textual_proj.weight":
        return "clip.text_projection", value.T.contiguous()  # nn.Linear's (out, in) as open_clip's x @ P
    if key == "textual.attn_mask":
        return None  # the causal mask, a buffer open_clip builds itself
    if key.startswith("textual."):
        rest = key[len("textual."):]
        rest = {"token_embed.weight": "token_embedding.weight", "posit_embed": "positional_embedding"}.get(rest, rest)
        return "clip." + ("transformer." + rest if rest.startswith("resblocks.") else rest), value
    if key == "logit_scale":
        # MERU clamps the parameter at ln 100 before each forward; applied here as it would be.
        return "clip.logit_scale", value.clamp(max=math.log(100))
    if key in ("visual_alpha", "textual_alpha"):
        # MERU clamps alpha <= 1 (log alpha <= 0) before each forward.
        return ("log_alpha_img" if key == "visual_alpha" else "log_alpha_txt"), value.clamp(max=0.0)
    if key == "curv":
        # MERU clamps log c to [ln(c0/10), ln(10 c0)] with its released c0 = 1.
        return "log_curv", value.clamp(math.log(0.1), math.log(10.0))
    if key in MERU_PIXEL:
        if not torch.allclose(value.flatten().double(), torch.tensor(MERU_PIXEL[key], dtype=torch.float64)):
            raise CheckpointError(f"'{key}' is {value.flatten().tolist()}, not ImageNet's {list(MERU_PIXEL[key])}: "
                                  f"euclip's MERU towers normalise with ImageNet's statistics only")
        return None
    return "clip." + key, value  # unknown: reported as unexpected by the key check


def _convert_meru_layout(source: str, geometry: Optional[str], logit: Optional[str],
                         arch: Optional[str]) -> tuple[bool, Converted]:
    """A checkpoint in MERU's layout (``{"model": state_dict, ...}``) as ``(hyperbolic, converted)``; the
    caller names the model in ``converted.meta``."""
    import torch

    path = fetch_source(source)
    checkpoint = _load(path)
    weights = checkpoint.get("model", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"{source}: holds no state dict of tensors (expected MERU's {{'model': ...}})")
    hyperbolic = "curv" in weights
    found = ("hyperbolic", "d") if hyperbolic else ("clip", "cos")
    if geometry is not None and (geometry, logit) != found:
        raise UsageError(f"{source}: a {'hyperbolic' if hyperbolic else 'CLIP'} checkpoint is {found[0]} "
                         f"({found[1]}); --geometry {geometry} --logit {logit} does not apply")
    if arch is None:
        width = weights["visual.cls_token"].shape[-1] if "visual.cls_token" in weights else None
        if width not in MERU_WIDTHS:
            raise CheckpointError(f"{source}: no MERU ViT of width {width} (known: "
                                  f"{', '.join(f'{w} ({a})' for w, a in MERU_WIDTHS.items())}); give --arch")
        arch = MERU_WIDTHS[width]
    state = dict(filter(None, (_meru_key(k, v) for k, v in weights.items())))
    overrides = [f"model.arch={arch}", f"geometry.name={found[0]}", f"geometry.logit={found[1]}"]
    return hyperbolic, Converted(overrides, state, {"source": source, "sha256": sha256_of(path)}, tasks="meru")


def convert_meru(source: str, geometry: Optional[str], logit: Optional[str], arch: Optional[str]) -> Converted:
    """MERU's released checkpoints (``{"model": state_dict, ...}``): MERU (hyperbolic) or its CLIP baseline."""
    hyperbolic, converted = _convert_meru_layout(source, geometry, logit, arch)
    converted.meta["model"] = "MERU" if hyperbolic else "CLIP baseline"
    return converted


# HyCoCLIP's release (huggingface avik-pal/hycoclip) holds its CLIP and MERU baselines beside HyCoCLIP, all in
# MERU's layout: HyCoCLIP's model is MERU's with another loss, so only the released file's name
# (clip_vit_s.pth, meru_vit_b.pth, hycoclip_vit_s.pth...) tells a MERU checkpoint from a HyCoCLIP one.
HYCOCLIP_RELEASED = {"clip": ("CLIP", False), "meru": ("MERU", True), "hycoclip": ("HyCoCLIP", True)}


def convert_hycoclip(source: str, geometry: Optional[str], logit: Optional[str], arch: Optional[str]) -> Converted:
    """HyCoCLIP's released checkpoints: its CLIP, MERU or HyCoCLIP model, named by the released file's name and
    checked against the weights (a hyperbolic one holds a curvature)."""
    named = re.match(r"(clip|meru|hycoclip)[_.-]", posixpath.basename(source).lower())
    if named is None:
        raise UsageError(f"{source}: HyCoCLIP's release names its models by file (clip_vit_s.pth, meru_vit_s.pth, "
                         f"hycoclip_vit_s.pth and the _vit_b ones), and MERU's and HyCoCLIP's weights have the same "
                         f"keys: import the file under its released name")
    model, named_hyperbolic = HYCOCLIP_RELEASED[named.group(1)]
    hyperbolic, converted = _convert_meru_layout(source, geometry, logit, arch)
    if hyperbolic != named_hyperbolic:
        raise CheckpointError(f"{source}: named as HyCoCLIP's {model} model, but its weights "
                              f"{'hold' if hyperbolic else 'lack'} a curvature: a "
                              f"{'hyperbolic' if hyperbolic else 'CLIP'} checkpoint; check the file")
    converted.meta["model"] = model
    return converted


def convert_export(source: str, geometry: Optional[str], logit: Optional[str], arch: Optional[str]) -> Converted:
    """An euclip export (a folder or ``hf://OWNER/REPO[@REVISION]``): the config and weights it holds."""
    from euclip_cli import exported

    if geometry is not None or logit is not None or arch is not None:
        raise UsageError("an euclip export names its own geometry, logit and model: --geometry, --logit and "
                         "--arch do not apply")
    folder = exported.fetch(source)
    described, state = exported.read(folder)
    meta = {"source": source, "sha256": sha256_of(folder / exported.WEIGHTS),
            "exported_from": described.get("provenance", {})}
    return Converted([], state, meta, tasks=described["config"].get("eval", {}).get("tasks", "datacomp"),
                     config=described["config"])


FORMATS: dict[str, Callable[[str, Optional[str], Optional[str], Optional[str]], Converted]] = {
    "openclip": convert_openclip,
    "euclip-authors": convert_authors,
    "meru": convert_meru,
    "hycoclip": convert_hycoclip,
    "euclip-export": convert_export,
}


def openclip_run_name(spec: str) -> str:
    """``euclip eval --openclip ARCH:TAG``'s run name: ``openclip-ARCH-TAG`` (a file's stem for a path)."""
    arch, _, tag = spec.partition(":")
    return "openclip-" + "-".join(filter(None, [arch, Path(tag).stem if "/" in tag else tag]))


def _fit(model, state: dict, source: str, fmt: str) -> None:
    """Load ``state`` into ``model`` or name the first problem: missing, unexpected or misshapen keys, with
    advice this format's import takes (an export names its own model: no option changes it)."""
    from euclip_cli.model import state_mismatch

    problem = state_mismatch(model, state)
    if problem:
        advice = ("its euclip_config.json does not describe its weights: export the run again" if fmt == "euclip-export"
                  else "check --geometry and --arch against the checkpoint")
        raise CheckpointError(f"{source}: {problem}; {advice}")
    expected = model.state_dict()
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})


def import_run(fmt: str, source: str, name: str, runs_dir: Path, geometry: Optional[str] = None,
               logit: Optional[str] = None, arch: Optional[str] = None) -> RunDir:
    """Convert ``source`` with format ``fmt`` and write it as run ``name``; an existing run of that
    name is kept when it holds the same import, refused otherwise."""
    from euclip_cli.model import EuclipModel

    if fmt not in FORMATS:
        raise UsageError(f"format '{fmt}' is not one of {', '.join(FORMATS)}")
    run = RunDir(runs_dir / plain_name(name, "--name"))
    converted = FORMATS[fmt](source, geometry, logit, arch)
    cfg = (C.from_dict(converted.config) if converted.config is not None
           else C.load_config(None, [*converted.overrides, f"eval.tasks={converted.tasks}"]))
    model = EuclipModel(cfg, clip=converted.clip)
    if converted.state is not None:
        _fit(model, converted.state, source, fmt)
    config = C.to_dict(cfg)
    meta = {"imported": {"format": fmt, **converted.meta}}
    if run.latest_checkpoint() is not None and run.meta().get("imported") == meta["imported"]:
        return run  # the same import again: nothing to do
    if not run.claim(config, meta):
        if run.latest_checkpoint() is not None:
            raise UsageError(f"run {run.path} already holds a checkpoint; import into a new --name")
        write_text_atomic(run.meta_file, json.dumps(meta, indent=2))  # an import cut short before its checkpoint
    run.save_checkpoint({"model": model.state_dict(), "step": 0, "config": config,
                         "meta": checkpoint_meta(config, model.geometry.logit, model.embed_dim)}, 0, keep=1)
    return run
