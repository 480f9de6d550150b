"""One typed schema holding every default, recipe files, and strict ``key=value`` overrides.

The defaults are the paper's common setting: DataComp small scale, ViT-B/32, the CLIP
geometry, OpenCLIP's optimizer. A recipe (``recipes/NAME.toml``) states only what differs
from them, and may ``extends = "OTHER"`` another recipe. Every problem found while loading
a recipe or an override is collected, so a user sees all of them at once.

This module imports only the standard library: ``euclip --help`` and
``euclip recipes validate`` must not pay for torch.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from euclip_cli.errors import UsageError
from euclip_cli import geometry as geometry_facts
from euclip_cli import readers
from euclip_cli import worlddir as W

Precision = Literal["auto", "fp32", "bf16", "fp16"]
DataFilter = Literal["none", "clip-l14-30", "image-based-clip-l14-30"]


@dataclass
class ModelConfig:
    # An open_clip model name (``ViT-B-32``, ``ViT-B-16``) or one of euclip's in-code
    # configs for CPU-sized runs (``euclip_cli.towers.archs``).
    arch: str = "ViT-B-32"
    # False removes the vision tower's ``ln_post`` and the text tower's ``ln_final``.
    final_ln: bool = True
    # m class tokens per tower, Multi(D/m, m) (Sun and Li, section 3; ``euclip_cli.towers``): each
    # token's state projected to D/m and the m projections a point of the product sphere PS(D/m, m).
    # Needs geometry.name = "product-sphere" with geometry.blocks = m. 1 = open_clip's towers.
    class_tokens: int = 1
    # The most groups of equal context length a batch of captions runs in through the text tower
    # (exact trimming, ``euclip_cli.towers.text.text_features``); 0: every length its own group; unset: by
    # the device's kind, 0 on a CPU and 2 on a GPU, where each group launches the whole tower again.
    text_groups: Optional[int] = None
    # The width D of the projections (both towers' output); unset: the arch's own. With m class tokens
    # each token projects to D/m.
    embed_dim: Optional[int] = None
    # A run (a path, or a name under the runs folder) whose latest checkpoint's towers this run starts
    # from; the projections and the geometry's scalars start fresh, as in MERU's embedding-width study
    # (its section 4.4): the source's projections may have another width.
    init_from: Optional[str] = None
    # True: only the projections and the geometry's scalars learn; the towers stay as init_from left
    # them and run as at evaluation (no BatchNorm statistics move). Needs init_from.
    freeze_towers: bool = False


@dataclass
class GeometryConfig:
    # A registered geometry (``euclip_cli.geometry.facts``): clip, elliptic, euclidean, hyperbolic, product-sphere.
    name: str = "clip"
    # One of the geometry's logits; "default" picks its first (clip: cos, elliptic: arccos,
    # euclidean/hyperbolic: d, product-sphere: inner).
    logit: str = "default"
    # product-sphere only: the number m of sphere factors, PS(n/m, m).
    blocks: int = 8
    # Initial t of beta = exp(t); None = ln(1/0.07) for cos/arccos/d/inner/geodesic logits, 0 for d2.
    logit_scale_init: Optional[float] = None
    learn_logit_scale: bool = True
    # Upper bound on beta itself (the paper and OpenCLIP: 100).
    logit_scale_max: float = 100.0
    # Lower bound on t applied after every optimizer step. OpenCLIP and the EuCLIP authors'
    # code clamp t >= 0; None removes the lower bound.
    logit_scale_min_log: Optional[float] = 0.0
    # hyperbolic only: learnable curvature c, initial value and the interval it is kept in.
    curvature_init: float = 1.0
    curvature_min: float = 0.1
    curvature_max: float = 10.0
    learn_curvature: bool = True
    # Geometries with learned embedding scales (hyperbolic): an upper bound on alpha, applied after every
    # optimizer step. MERU's code clamps alpha <= 1 before every forward (its meru-* recipes: 1.0); the EuCLIP
    # authors' code does not clamp it (None).
    alpha_max: Optional[float] = None


@dataclass
class LossConfig:
    # lambda in  L = L_cont + lambda * mean(L_entail); 0 turns the entailment loss off.
    entail_weight: float = 0.0
    # K, the entailment cone's minimum radius.
    entail_min_radius: float = 0.1
    # Several processes: each computes its own pairs' share of the global batch's loss, (b x B) logits
    # instead of (B x B), through a gather that carries gradients (DataComp's --local-loss
    # --gather-with-grad); the same loss and gradients, less memory and compute per rank. One process: no effect.
    local_loss: bool = False
    # The pairwise term on the geometry's logits beta * sim: "infonce", the softmax over the batch both ways
    # (CLIP's and the paper's); "siglip", SigLIP's sigmoid loss (Zhai et al., 2023) on every (image, text)
    # pair, beta * sim + b with a learnable bias b, summed and divided by the batch (open_clip's SigLipLoss);
    # "hycoclip", HyCoCLIP's loss (Pal et al., 2025) on (image, box image, text, box text): four InfoNCE
    # terms and, with entail_weight, four cones (euclip_cli.loss.hycoclip_objective). It trains on data
    # with boxes: the embedded world's (data.dataset = "world") or GRIT's ("grit", euclip download grit).
    kind: Literal["infonce", "siglip", "hycoclip"] = "infonce"
    # SigLIP's start for b, its paper's -10 (its logit scale starts at t = ln 10: initial_logit_scale).
    siglip_bias_init: float = -10.0


@dataclass
class _DataFields:
    # Which dataset ``euclip download --recipe`` fetches and ``train`` reads: "world" (the embedded
    # default), "datacomp-small" / "datacomp-medium" (filtered by ``filter``), "redcaps" (MERU's data) or "grit"
    # (HyCoCLIP's: pairs with their boxes).
    dataset: Literal["world", "datacomp-small", "datacomp-medium", "redcaps", "grit"] = "datacomp-small"
    filter: DataFilter = "clip-l14-30"
    # Training shards folder; empty = derived from dataset and filter under data/.
    train_dir: str = ""
    batch_size: int = 4096
    workers: int = 4
    shuffle_buffer: int = 2000
    # Training stops (after a checkpoint) once more than this share of the samples read could not
    # be decoded: a run on mostly broken shards is not the run its recipe describes. 1 = no limit.
    max_skipped_fraction: float = 0.5
    # Where training batches come from: "euclip", euclip's loader (exact resume position, skip counts,
    # one buffer a batch); "openclip", open_clip_train's own webdataset pipeline (an A/B for the data
    # path: its streams restart at a resume; euclip_cli.data.openclip_pipeline); "repeat", the first
    # batch again and again (the step's pace with the loaders taken out: for timing, never training).
    pipeline: Literal["euclip", "openclip", "repeat"] = "euclip"
    # How workers hand their batches over: torch.multiprocessing's sharing strategy (loader.TrainBatches).
    sharing: Literal["file_descriptor", "file_system"] = "file_descriptor"
    # Batches cross to the device through staging buffers allocated once (page-locked on a GPU,
    # euclip_cli.data.feed); false moves them straight from shared memory, as OpenCLIP does (an A/B).
    staging: bool = True
    # How a loader worker turns a stored image into its training crop (euclip_cli.data.decode):
    # "pil", PIL's whole decode and open_clip's crop, OpenCLIP's path; "pil-draft", the crop drawn
    # first and the JPEG decoded at 1/2-1/8 scale where the crop stays at least the output's size.
    decoder: Literal["pil", "pil-draft"] = "pil"
    # Where images are decoded: "workers" (the loader's worker processes, by data.decoder), or "device"
    # (workers hand over JPEGs and their crops; the trainer decodes each batch on its device, nvJPEG on
    # a GPU, and crops there: euclip_cli.data.decode). JPEG shards only; euclip's loader only.
    decode: Literal["workers", "device"] = "workers"
    # RedCaps only: the probability that a caption is prefixed with its word-segmented subreddit,
    # "i took a picture : my dog" (MERU: 0.5, drawn afresh each time a sample is read); 0 leaves captions
    # as they are. Read from each sample's json (euclip download redcaps keeps it); euclip's loader only.
    subreddit_prefix: float = 0.0
    # The smallest share of an image's area a training crop keeps (the lower end of RandomResizedCrop's
    # scale): open_clip's 0.9; MERU's 0.5.
    crop_scale: float = 0.9
    # The seed of the data order (shuffle and per-batch augmentation); unset, train.seed. Set apart
    # from train.seed, it separates the initialisation's share of seed-to-seed spread from the order's.
    order_seed: Optional[int] = None
    # Embedded world only: ``data.world_<setting>`` for each of ``worlddir.WorldSettings``, added below
    # from there (their one owner: type, default, range and help).


# DataConfig: the fields above and the world's settings, as ``data.world_seed``, ``data.world_samples``, ...
DataConfig = dataclasses.make_dataclass(
    "DataConfig", [(W.CONFIG_PREFIX + f.name, typing.get_type_hints(W.WorldSettings)[f.name], f.default)
                   for f in W.SETTINGS], bases=(_DataFields,))
DataConfig.__module__ = __name__  # pickled by name (a run's config crosses process boundaries)


@dataclass
class OptimConfig:
    lr: float = 5e-4
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    weight_decay: float = 0.2
    # Which parameters weight_decay applies to. openclip: matrices only (no gains, biases, class tokens or
    # scalars), OpenCLIP's and the EuCLIP authors' rule and MERU's paper's. meru-code: every parameter but the
    # learned scalars (t, alpha, c), what MERU's set_weight_decay_per_param does with its config's
    # gain_bias_decay=0.0 (read as "use weight_decay" by its `or`).
    decay_rule: Literal["openclip", "meru-code"] = "openclip"
    warmup_steps: int = 500
    # DataComp's budget: samples seen (drawn with replacement), not epochs.
    samples: int = 12_800_000
    # Micro-batches per optimizer step; the global batch stays data.batch_size.
    accum_steps: int = 1
    grad_clip: Optional[float] = None
    # The learning rate of the learnable scalars (t of beta = exp(t), and log c of the curvature) as a
    # multiple of the schedule's (1: one rate for everything, as CLIP, OpenCLIP and MERU). Adam moves
    # a log-parameterised scalar by about the learning rate per step, so a run can move it by at most
    # the schedule's summed rate (optim.summed_lr): ~27 in Sun and Li's ablations (108k steps at
    # 5e-4) but ~0.03 in a tiny recipe (256 steps at 2.5e-4), too little to leave its start.
    scalar_lr_scale: float = 1.0


@dataclass
class TrainConfig:
    seed: int = 0
    # bf16/fp16: autocast around the encoders (the geometry and loss stay fp32). fp16 adds a
    # gradient scaler; it is meant for GPUs (on a CPU it runs, slowly). auto: bf16 where the device
    # has bf16 units, else fp16 on a GPU and fp32 on a CPU (euclip_cli.device.resolve_precision).
    precision: Precision = "auto"
    device: str = "auto"
    # Checkpoint intervals over the budget (DataComp: 8), and how many to keep.
    checkpoints: int = 8
    keep_checkpoints: int = 2
    log_every: int = 10
    # CPU only: the math attention kernel was measured faster than the fused one in bf16 and no slower
    # in fp32 (docs/speed.md). GPUs always use PyTorch's fused kernels (flash / memory-efficient).
    sdpa_math: bool = True
    # torch.compile both encoders in place (checkpoints keep their keys). Off by default: its gain was
    # within the measured spread after minutes of compiling, and on some CPUs the compiled bf16
    # backward gives non-finite gradients where eager mode does not (docs/speed.md).
    compile: bool = False
    # Activation checkpointing of both towers (towers.checkpointing): each block keeps only its input
    # and is computed again in the backward pass, the same loss and gradients for about a third more
    # compute. DataComp trains at batch 4,096 with it on few GPUs.
    grad_checkpointing: bool = False
    # Compute threads of the training process (torch.set_num_threads); 0: every core on a CPU, where
    # the step is the work; on a GPU, where the process only launches kernels and copies batches,
    # the cores the loader workers leave, at most 4 (euclip_cli.train.loop.host_threads).
    host_threads: int = 0
    # For the data-path bench only (``euclip bench feed``): compute each step on the first this many
    # samples of its batch, so that the step costs almost nothing and the loop runs at the speed its
    # data path allows, as on a very fast accelerator. 0: the whole batch, as every real run does.
    bench_step_samples: int = 0
    tensorboard: bool = True
    # Weights & Biases logging (rank 0), when the wandb package is installed.
    wandb: bool = False
    wandb_project: str = "euclip"


@dataclass
class EvalConfig:
    # A task group or a comma-separated list of task keys (``euclip eval --help``).
    tasks: str = "datacomp"
    root: str = "data/eval"
    batch_size: int = 64


@dataclass
class ReportConfig:
    # Paper rows this recipe reproduces, as "TABLE:LABEL" (labels from
    # euclip_cli/published/euclip-tables.csv); empty for recipes outside the paper.
    paper_rows: list[str] = field(default_factory=list)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    geometry: GeometryConfig = field(default_factory=GeometryConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    # Set by the loader: the recipe name this config came from ("" for defaults).
    recipe: str = ""


# Shipped inside the package, so a non-editable install finds them (``recipes/`` at the repository
# root links here).
RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


class ConfigError(UsageError):
    """All problems found in a recipe or override set; one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


# ---------------------------------------------------------------- schema walking

def _sections() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config) if dataclasses.is_dataclass(hints[f.name])}


def schema() -> dict[str, dict[str, Any]]:
    """``{section: {key: type}}`` for every configurable key (a copy the caller may change)."""
    return {name: dict(keys) for name, keys in _schema().items()}


@functools.cache
def _schema() -> dict[str, dict[str, Any]]:
    # typing.get_type_hints evaluates every annotation again at each call: reading a study's 100 configs
    # called it 35,000 times (20 s). The dataclasses do not change while euclip runs.
    return {name: typing.get_type_hints(cls) for name, cls in _sections().items()}


def describe_type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{describe_type(inner[0])} or none"
    if origin is list:
        return "a comma-separated list"
    return {bool: "true or false", int: "an integer within 64 bits", float: "a number", str: "a string"}.get(tp, str(tp))


INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def coerce(tp: Any, value: Any, *, from_text: bool) -> Any:
    """Convert ``value`` to ``tp`` or raise ValueError. Text comes from the command line."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        # "none" in a recipe too: TOML has no null, and an override says it the same way.
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return coerce(inner[0], value, from_text=from_text)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ValueError
        return value
    if origin is list:
        if from_text:
            return [v.strip() for v in str(value).split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError
        return list(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_text and str(value).lower() in ("true", "false", "1", "0", "yes", "no"):
            return str(value).lower() in ("true", "1", "yes")
        raise ValueError
    if tp is int:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int):
            found = value
        elif from_text:
            text = str(value).replace("_", "")
            try:
                found = int(text)
            except ValueError:
                as_float = float(text)  # accepts "1.28e7"; raises ValueError itself otherwise
                if not as_float.is_integer():
                    raise
                found = int(as_float)
        else:
            raise ValueError
        # Every integer key ends in torch, numpy or a C library as a 64-bit integer: a larger one overflows there.
        if not INT64_MIN <= found <= INT64_MAX:
            raise ValueError
        return found
    if tp is float:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, (int, float)):
            return float(value)
        if from_text:
            return float(value)
        raise ValueError
    if tp is str:
        if from_text or isinstance(value, str):
            return str(value)
        raise ValueError
    raise ValueError


def _apply(cfg: Config, section: str, key: str, value: Any, *, from_text: bool, where: str, problems: list[str]):
    table = schema()
    if section not in table:
        problems.append(f"{where}: unknown section '{section}' (sections: {', '.join(table)})")
        return
    if key not in table[section]:
        problems.append(f"{where}: unknown key '{section}.{key}' (keys in [{section}]: {', '.join(table[section])})")
        return
    tp = table[section][key]
    try:
        setattr(getattr(cfg, section), key, coerce(tp, value, from_text=from_text))
    except ValueError:
        problems.append(f"{where}: bad value {value!r} for '{section}.{key}': expected {describe_type(tp)}")


# ---------------------------------------------------------------- recipes

def recipe_path(name_or_path: str) -> Path:
    """The file a recipe name (a shipped recipe) or path names; a ConfigError where no file system could
    hold that path (``rundir.path_problem``), so that looking it up cannot fail in the operating system."""
    from euclip_cli.rundir import path_problem

    path = Path(name_or_path)
    for candidate in (path, RECIPES_DIR / f"{name_or_path}.toml"):
        problem = path_problem(candidate)
        if problem:
            raise ConfigError([f"recipe: {problem}"])
    # A run directory named after its recipe (results/runs/tiny-clip) must not shadow the recipe.
    if path.suffix == ".toml" or path.is_file():
        return path
    return RECIPES_DIR / f"{name_or_path}.toml"


# Study recipes (``euclip study``) share the folder; their names start with this.
STUDY_PREFIX = "study-"
# The embedded study's run recipe (its configurations share its arch and budget): what ``euclip
# bench train`` times as shipped (its euclip runs are it with the bench model and batch), and whose
# arch a study's plan reads that timing for.
STUDY_RUN_RECIPE = "tiny-clip"


def is_study_recipe(name_or_path: str) -> bool:
    return Path(name_or_path).stem.startswith(STUDY_PREFIX)


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def recipe_text(path: Path) -> str:
    """A recipe file's text: a regular file of UTF-8 (TOML's encoding by definition), bounded in size."""
    if not path.exists():
        raise ConfigError([f"recipe {str(path)!r} not found (run 'euclip recipes list' to see the recipes)"])
    try:
        return readers.read_text(path, "recipe", readers.RECIPE_LIMIT)
    except readers.UnreadableFile as err:
        raise ConfigError([str(err)]) from None


def recipe_table(path: Path) -> dict:
    """A recipe file (a run's or a study's) as TOML, or a ConfigError naming the file and what is wrong."""
    text = recipe_text(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([f"{path.name}: not valid TOML ({err}); fix the file"]) from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError([f"{path.name}: nested too deeply to read as TOML; a recipe's tables are two levels "
                           f"deep"]) from None


def recipe_header(name_or_path: str) -> str:
    """The leading comment block of a recipe file (purpose, command, expected result)."""
    lines = []
    for line in recipe_text(recipe_path(name_or_path)).splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return "\n".join(lines)


# Longer than any sensible chain of recipes, and short enough that reading one never nears Python's recursion limit.
MAX_EXTENDS = 32


def _read_recipe(name_or_path: str, problems: list[str], chain: tuple[str, ...]) -> list[tuple[str, dict]]:
    """Return [(where, table)] from the farthest ancestor to this recipe."""
    path = recipe_path(name_or_path)
    if not path.exists():
        problems.append(f"recipe '{name_or_path}' not found (run 'euclip recipes list' to see the recipes)")
        return []
    if path.resolve() in chain:
        problems.append(f"{path.name}: 'extends' forms a cycle")
        return []
    if len(chain) >= MAX_EXTENDS:
        problems.append(f"{path.name}: 'extends' chains more than {MAX_EXTENDS} recipes; flatten the chain")
        return []
    try:
        table = recipe_table(path)
    except ConfigError as err:
        problems.extend(err.problems)
        return []
    parents: list[tuple[str, dict]] = []
    base = table.pop("extends", None)
    if base is not None:
        if not isinstance(base, str):
            problems.append(f"{path.name}: 'extends' must be a recipe name")
        else:
            parents = _read_recipe(base, problems, chain + (path.resolve(),))
    return parents + [(path.name, table)]


def override_key(item: str) -> str:
    """The ``section.key`` an override sets (what precedes its ``=``)."""
    return item.split("=", 1)[0].strip()


def layered_overrides(*layers: list[str]) -> list[str]:
    """Overrides of several layers as one list, each key once: a later layer's value replaces an earlier
    one's (a study's configuration over the study's common overrides)."""
    merged: dict[str, str] = {}
    for layer in layers:
        for item in layer:
            merged.pop(override_key(item), None)
            merged[override_key(item)] = item
    return list(merged.values())


def load_config(recipe: Optional[str] = None, overrides: Optional[list[str]] = None,
                each_key_once: bool = False) -> Config:
    """Defaults, then the recipe chain, then ``section.key=value`` overrides; validated.

    ``each_key_once``: a key given twice is a problem (overrides a person typed, where taking the
    last silently would run a configuration they may not have meant); otherwise the last one wins.
    Raises ConfigError listing every problem found.
    """
    cfg = Config()
    problems: list[str] = []
    if recipe is not None and is_study_recipe(recipe):
        raise ConfigError([f"'{recipe}' is a study recipe, not a run recipe: run 'euclip study --recipe {recipe}'"])
    if recipe is not None:  # an empty name names no recipe file, not the defaults
        for where, table in _read_recipe(recipe, problems, ()):
            for section, values in table.items():
                if not isinstance(values, dict):
                    problems.append(f"{where}: top-level key '{section}' is not a [section] (sections: {', '.join(schema())})")
                    continue
                for key, value in values.items():
                    _apply(cfg, section, key, value, from_text=False, where=where, problems=problems)
        cfg.recipe = recipe_path(recipe).stem
    given: dict[str, str] = {}
    for item in overrides or []:
        if "=" not in item:
            problems.append(f"override '{item}': expected section.key=value, e.g. optim.lr=1e-3")
            continue
        dotted, value = item.split("=", 1)
        if "." not in dotted:
            problems.append(f"override '{item}': expected section.key=value, e.g. optim.lr=1e-3")
            continue
        dotted = dotted.strip()
        if each_key_once and dotted in given:
            problems.append(f"override '{item}': {dotted} is already given ('{given[dotted]}'); give each key once")
            continue
        given[dotted] = item
        section, key = dotted.split(".", 1)
        _apply(cfg, section, key, value.strip(), from_text=True, where=f"override '{item}'", problems=problems)
    problems.extend(validate(cfg))
    if problems:
        raise ConfigError(problems)
    return cfg


def validate(cfg: Config) -> list[str]:
    """Cross-field checks the types alone cannot express."""
    problems = []
    g = cfg.geometry
    if geometry_facts.lookup(g.name) is None:
        problems.append(f"bad value '{g.name}' for 'geometry.name': expected one of {', '.join(geometry_facts.names())}")
        facts = None
    else:
        facts = geometry_facts.describe(g.name)
    if facts and g.logit != "default" and g.logit not in facts.logits:
        problems.append(f"geometry.logit: '{g.logit}' is not a logit of geometry '{g.name}' (allowed: default, {', '.join(facts.logits)})")
    if facts and facts.uses_blocks and g.blocks < 1:
        problems.append("geometry.blocks: must be at least 1")
    if cfg.model.class_tokens < 1:
        problems.append("model.class_tokens: must be at least 1")
    elif cfg.model.class_tokens > 1 and (g.name != "product-sphere" or g.blocks != cfg.model.class_tokens):
        problems.append(f"model.class_tokens: {cfg.model.class_tokens} class tokens make a point of PS(n, "
                        f"{cfg.model.class_tokens}); set geometry.name=\"product-sphere\" and "
                        f"geometry.blocks={cfg.model.class_tokens}")
    if cfg.model.embed_dim is not None and (cfg.model.embed_dim < 1 or cfg.model.embed_dim % max(cfg.model.class_tokens, 1)):
        problems.append(f"model.embed_dim: {cfg.model.embed_dim} must be a positive multiple of model.class_tokens "
                        f"({cfg.model.class_tokens}), or none (the arch's own)")
    if cfg.model.freeze_towers and not cfg.model.init_from:
        problems.append("model.freeze_towers: frozen towers must come from a trained run; set model.init_from=RUN")
    if cfg.model.init_from is not None and not cfg.model.init_from.strip():
        problems.append("model.init_from: empty; name a run (a path or a name under the runs folder), or none")
    if not 0 < g.curvature_min <= g.curvature_init <= g.curvature_max:
        problems.append(f"geometry.curvature_init: {g.curvature_init} must lie in [geometry.curvature_min, "
                        f"geometry.curvature_max] = [{g.curvature_min}, {g.curvature_max}], all positive")
    if g.logit_scale_max <= 0:
        problems.append("geometry.logit_scale_max: must be positive")
    elif g.logit_scale_min_log is not None and g.logit_scale_min_log > math.log(g.logit_scale_max):
        problems.append(f"geometry.logit_scale_min_log: {g.logit_scale_min_log} must not exceed "
                        f"ln(geometry.logit_scale_max) = {math.log(g.logit_scale_max):.4g}")
    if g.alpha_max is not None and (g.alpha_max <= 0 or (facts and not facts.learned_scales)):
        problems.append(f"geometry.alpha_max: {g.alpha_max} bounds a learned embedding scale: set it positive, on a "
                        f"geometry that learns one (hyperbolic), or none")
    if cfg.loss.entail_weight < 0:
        problems.append("loss.entail_weight: must be >= 0")
    if facts and cfg.loss.entail_weight > 0 and not facts.has_entailment:
        with_cones = ", ".join(n for n in geometry_facts.names() if geometry_facts.describe(n).has_entailment)
        problems.append(f"loss.entail_weight: geometry '{g.name}' has no entailment loss (only {with_cones}); set it to 0")
    if cfg.loss.entail_min_radius < 0:
        problems.append("loss.entail_min_radius: must be >= 0")
    if trains_on_boxes(cfg):
        if cfg.data.dataset not in BOXED_DATASETS:
            problems.append(f"loss.kind: hycoclip trains on boxes, which only {' and '.join(BOXED_DATASETS)} have "
                            f"(data.dataset={cfg.data.dataset}); set data.dataset to one of them")
        if cfg.data.pipeline != "euclip":
            problems.append(f"loss.kind: hycoclip's boxes come through euclip's loader, not data.pipeline="
                            f"{cfg.data.pipeline}; set data.pipeline=\"euclip\"")
    if cfg.data.batch_size < 2:
        problems.append("data.batch_size: a contrastive batch needs at least 2 pairs")
    elif cfg.data.batch_size % max(cfg.optim.accum_steps, 1):
        problems.append(f"optim.accum_steps: {cfg.optim.accum_steps} does not divide data.batch_size {cfg.data.batch_size}")
    if cfg.model.text_groups is not None and cfg.model.text_groups < 0:
        problems.append(f"model.text_groups: {cfg.model.text_groups} is not allowed; it must be >= 0 (0: every "
                        f"length its own group) or none (by the device)")
    slice_ = cfg.train.bench_step_samples
    if slice_ and (slice_ < 2 or slice_ > cfg.data.batch_size or slice_ % max(cfg.optim.accum_steps, 1)):
        problems.append(f"train.bench_step_samples: {slice_} must be 0 (the whole batch) or a slice of at least 2 "
                        f"samples, at most data.batch_size and divisible by optim.accum_steps")
    if not (math.isfinite(cfg.optim.scalar_lr_scale) and cfg.optim.scalar_lr_scale > 0):
        problems.append("optim.scalar_lr_scale: must be a positive finite number")
    if cfg.optim.accum_steps < 1:
        problems.append("optim.accum_steps: must be >= 1")
    if cfg.optim.samples < cfg.data.batch_size:
        problems.append(f"optim.samples: the budget of {cfg.optim.samples:,} samples is smaller than one batch "
                        f"(data.batch_size={cfg.data.batch_size:,}): raise optim.samples or lower data.batch_size")
    if not 0 <= cfg.data.max_skipped_fraction <= 1:
        problems.append("data.max_skipped_fraction: must be in [0, 1] (1 turns the limit off)")
    if cfg.data.decode == "device" and cfg.data.pipeline == "openclip":
        problems.append("data.decode: only euclip's loader hands JPEGs to the device, not data.pipeline=openclip; "
                        "set data.decode=workers")
    if not 0 <= cfg.data.subreddit_prefix <= 1:
        problems.append("data.subreddit_prefix: a probability, in [0, 1]")
    elif cfg.data.subreddit_prefix and cfg.data.pipeline != "euclip":
        problems.append(f"data.subreddit_prefix: only euclip's loader prefixes captions, not data.pipeline="
                        f"{cfg.data.pipeline}")
    if not 0 < cfg.data.crop_scale <= 1:
        problems.append(f"data.crop_scale: {cfg.data.crop_scale} is not a share of the image's area in (0, 1]")
    problems += [f"{W.config_key(name)}: {value} must lie in {allowed}"
                 for name, value, allowed in W.problems(W.from_config(cfg.data))]
    if cfg.train.checkpoints < 1 or cfg.train.keep_checkpoints < 1:
        problems.append("train.checkpoints and train.keep_checkpoints: must be >= 1")
    # Values a library would reject later in its own words (or not at all): named here instead.
    for key, value, rule in (("optim.lr", cfg.optim.lr, "a positive finite number"),
                             ("optim.eps", cfg.optim.eps, "a positive finite number"),
                             ("optim.weight_decay", cfg.optim.weight_decay, ">= 0"),
                             ("optim.warmup_steps", cfg.optim.warmup_steps, ">= 0"),
                             ("data.workers", cfg.data.workers, ">= 0"),
                             ("train.host_threads", cfg.train.host_threads, ">= 0"),
                             ("data.shuffle_buffer", cfg.data.shuffle_buffer, ">= 0"),
                             ("train.log_every", cfg.train.log_every, ">= 1"),
                             ("eval.batch_size", cfg.eval.batch_size, ">= 1")):
        ok = (math.isfinite(value) and value > 0 if rule.startswith("a positive")
              else math.isfinite(value) and value >= float(rule.split()[-1]))
        if not ok:
            problems.append(f"{key}: {value!r} is not allowed; it must be {rule}")
    if not (0 <= cfg.optim.beta1 < 1 and 0 <= cfg.optim.beta2 < 1):
        problems.append("optim.beta1 and optim.beta2: must lie in [0, 1)")
    for row in cfg.report.paper_rows:
        table, _, label = row.partition(":")
        if not table.isdigit() or not label:
            problems.append(f"report.paper_rows: '{row}' is not TABLE:LABEL, e.g. '4:EuCLIP'")
    return problems


# ---------------------------------------------------------------- derived values

def resolved_logit(cfg: Config) -> str:
    return geometry_facts.describe(cfg.geometry.name).logit(cfg.geometry.logit)


def initial_logit_scale(cfg: Config) -> float:
    """t at initialization: ln(1/0.07) for distance-like logits, 0 for squared ones (the paper, section 4.4);
    with SigLIP's loss, its paper's ln 10 in every geometry (a choice of euclip's off the CLIP geometry,
    where nobody has published SigLIP)."""
    if cfg.geometry.logit_scale_init is not None:
        return cfg.geometry.logit_scale_init
    if cfg.loss.kind == "siglip":
        return math.log(10.0)
    squared = resolved_logit(cfg) in geometry_facts.describe(cfg.geometry.name).squared_logits
    return 0.0 if squared else math.log(1 / 0.07)


def train_dir(cfg: Config) -> Path:
    if cfg.data.train_dir:
        return Path(cfg.data.train_dir)
    if cfg.data.dataset == "world":
        return Path("data") / "world" / "train"
    if cfg.data.dataset in ("redcaps", "grit"):
        return Path("data") / cfg.data.dataset / "shards"
    return Path("data") / f"{cfg.data.dataset}-{cfg.data.filter}" / "shards"


def world_dir(cfg: Config) -> Path:
    """The embedded world a run evaluates on: the one it trained on (its eval tasks sit beside the
    training shards), else ``data/world``."""
    return train_dir(cfg).parent if cfg.data.dataset == "world" else Path("data") / "world"


# The data sets whose samples carry boxes in HyCoCLIP's layout: the embedded world's and GRIT's (download.grit).
BOXED_DATASETS = ("world", "grit")


def trains_on_boxes(cfg: Config) -> bool:
    """Whether a run's samples each bring one of their boxes (HyCoCLIP's loss): its loader's batches hold the B
    samples and then their B boxes, and its towers run on both."""
    return cfg.loss.kind == "hycoclip"


def order_seed(cfg: Config) -> int:
    """The data order's seed: ``data.order_seed`` when set, else ``train.seed``."""
    return cfg.train.seed if cfg.data.order_seed is None else cfg.data.order_seed


def total_steps(cfg: Config) -> int:
    return max(1, cfg.optim.samples // cfg.data.batch_size)


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


# Keys renamed since runs stored them: a stored run still loads. optim.logit_scale_lr_scale scaled
# the temperature's rate alone; scalar_lr_scale also scales the curvature's.
RENAMED_KEYS = {("optim", "logit_scale_lr_scale"): "scalar_lr_scale"}


def from_dict(data: dict, where: str = "stored config") -> Config:
    """Rebuild a Config stored in a run directory or checkpoint (strictly validated); ``where`` names it in
    each problem (the file it came from)."""
    cfg = Config()
    problems: list[str] = []
    for section, values in data.items():
        if section == "recipe":
            cfg.recipe = values
            continue
        for key, value in values.items():
            key = RENAMED_KEYS.get((section, key), key)
            _apply(cfg, section, key, value, from_text=False, where=where, problems=problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def run_config(run) -> Config:
    """A run's stored ``config.json`` (``run``: a ``RunDir``) as a Config, its problems naming the file."""
    return from_dict(run.config(), str(run.config_file))


def dumps(cfg: Config) -> str:
    return json.dumps(to_dict(cfg), indent=2, sort_keys=True)
