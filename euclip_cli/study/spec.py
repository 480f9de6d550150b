"""Study recipes and the paper's claims, read and checked (standard library only).

A study recipe (``recipes/study-NAME.toml``) names configurations, each a run recipe plus
overrides, and the seeds, tasks, baseline and interval of the comparison::

    [study]
    seeds = 3                 # seeds 0..2; every configuration trains with each
    tasks = "world"           # what each run is evaluated on
    baseline = "clip"         # the configuration every other one is compared with, paired by seed
    interval = "t"            # t or bootstrap (over seeds), 95%
    overrides = []            # applied to every configuration, before its own
    primary = ["euclip-beats-clip"]   # claims (ids in claims.toml) declared primary before it runs

    [configs.clip]
    recipe = "tiny-clip"

    [configs.euclip-ln]
    recipe = "tiny-euclip"
    overrides = ["model.final_ln=true"]

Where a study runs on a cluster (``euclip study --launcher slurm|ray``), what each run's job asks
for is ``[study.resources]`` (every configuration), ``[configs.NAME.resources]`` (one) and
``--resource KEY=VALUE`` (every configuration, last); the keys are ``Resources``' fields.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from euclip_cli import config as C
from euclip_cli.errors import UsageError
from euclip_cli.protocol.tasks import select
from euclip_cli.published import sun_li_labels
from euclip_cli.rundir import plain_name, read_json, write_text_atomic
from euclip_cli.stats import INTERVALS, MIN_BOOTSTRAP_SEEDS

CLAIMS_FILE = Path(__file__).with_name("claims.toml")
# A run's measured properties, each 0 or measured at initialisation (``runner.run_values``).
MEASURES = ("text_nearer_root", "curvature_fall")


@dataclass(frozen=True)
class Resources:
    """What one run's job asks a cluster for (one node; ``euclip study --launcher slurm|ray``)."""

    # GPUs of the node; more than one trains through torchrun, one process per GPU.
    gpus: int = 0
    cpus: int = 8
    mem_gb: float = 32.0
    # The job's time limit. A run that needs longer is checkpointed and requeued when it ends.
    hours: float = 4.0
    partition: str = ""
    # Seconds before the time limit at which SLURM warns the job (submitit's SIGUSR2): the trainer
    # finishes its step and checkpoints in that time (a ViT-B step and a checkpoint: well under 120 s).
    warning_s: int = 120
    # Requeues after a time limit (SLURM) or a lost worker (Ray) before the run counts as failed.
    retries: int = 3
    # Any other sbatch option, by name (account, qos, constraint, ...), as submitit passes it.
    slurm: dict = field(default_factory=dict)

    @property
    def devices(self) -> int:
        """Processes the run trains with: one per GPU, or one on a CPU node."""
        return max(1, self.gpus)


RESOURCE_KEYS = tuple(f.name for f in fields(Resources))


def resources_from(table: Any, where: str, base: Resources, problems: list[str]) -> Resources:
    """``base`` with the keys of a ``[...resources]`` table (TOML values) applied; a problem per bad key."""
    if not isinstance(table, dict):
        problems.append(f"{where}: must be a table of {', '.join(RESOURCE_KEYS)}")
        return base
    changes = {}
    for key, value in table.items():
        problem = _resource_problem(key, value)
        if problem:
            problems.append(f"{where} {key}: {problem}" if where.startswith("--") else f"{where}.{key}: {problem}")
        else:
            changes[key] = float(value) if key in ("mem_gb", "hours") else value
    return replace(base, **changes)


def _resource_problem(key: str, value: Any) -> Optional[str]:
    if key not in RESOURCE_KEYS:
        return f"not a resource (one of {', '.join(RESOURCE_KEYS)})"
    if key == "slurm":
        ok = isinstance(value, dict) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                             for v in value.values())
        return None if ok else "must be a table of sbatch options (e.g. {account = \"abc\", qos = \"high\"})"
    if key == "partition":
        return None if isinstance(value, str) else f"must be a string, not {value!r}"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key in ("mem_gb", "hours"):
        return None if number and value > 0 else f"must be a positive number, not {value!r}"
    least = 1 if key == "cpus" else 0
    return None if isinstance(value, int) and not isinstance(value, bool) and value >= least \
        else f"must be an integer >= {least}, not {value!r}"


def resource_pairs(pairs: Sequence[str], problems: list[str]) -> dict:
    """``--resource KEY=VALUE`` (strict, as run overrides are) as a resources table; each value is
    read as TOML (``gpus=8``, ``hours=2.5``), or as a string where it is a bare word (``partition=gpu``)."""
    table = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"--resource '{pair}': must be KEY=VALUE with KEY one of {', '.join(RESOURCE_KEYS)}")
            continue
        if key in table:
            problems.append(f"--resource '{key}' is given more than once; give each key once")
        try:
            table[key] = tomllib.loads(f"v = {text}")["v"]
        except (tomllib.TOMLDecodeError, RecursionError):  # not a TOML value: taken as the text itself
            table[key] = text
    return table


@dataclass(frozen=True)
class StudyConfig:
    name: str
    recipe: str
    overrides: tuple[str, ...]
    # A published row this configuration reproduces: a label of euclip_cli/published/sun-li-temperature.csv.
    paper: Optional[str] = None
    resources: Resources = Resources()


@dataclass(frozen=True)
class Study:
    name: str
    path: Path
    configs: dict[str, StudyConfig]
    seeds: tuple[int, ...]
    tasks: str
    baseline: str
    interval: str = "t"
    # The claims the study was run to decide (ids in claims.toml), declared before it runs: they form
    # the primary family, whose verdicts are adjusted among themselves; the others are secondary.
    primary: tuple[str, ...] = ()

    def run_name(self, config: str, seed: int) -> str:
        return f"{config}-seed{seed}"

    def overrides(self, config: str, seed: int) -> list[str]:
        """What ``euclip train --recipe RECIPE`` gets for this (configuration, seed)."""
        return C.layered_overrides(self.configs[config].overrides, [f"train.seed={seed}", f"eval.tasks={self.tasks}"])


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str
    kind: str  # compare | measure
    metric: Optional[str] = None
    higher: Optional[str] = None
    lower: Optional[str] = None
    # The published results the claim is read against: EuCLIP rows {table, model, higher, lower}, one
    # per scale the paper reports, or another source's ({source = "sun-li" | "hycoclip" | "laion-grid", ...}).
    paper: tuple[dict, ...] = ()
    # "Matches or beats": non-inferiority, a deficit up to ``margin`` points counts as matching.
    margin: Optional[float] = None
    config: Optional[str] = None
    measure: Optional[str] = None
    # A measure's control: the same configuration without the cause the claim names (lambda = 0).
    control: Optional[str] = None
    # euclip's own measure, with no published counterpart: it can hold, not be reproduced.
    own: bool = False

    @property
    def configs(self) -> tuple[str, ...]:
        if self.kind == "compare":
            return self.higher, self.lower
        return (self.config,) if self.control is None else (self.config, self.control)


def _strings(value, where: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: must be a list of 'section.key=value' strings")
        return ()
    return tuple(value)


# More seeds than any study trains (each is a run per configuration), and few enough that a plan's sums stay exact.
MAX_SEEDS = 10_000


# The options a study was last started with, kept in its folder, so that ``--status`` and a rerun need
# only ``--out``: recomputed from other options, finished runs would read as failed, or be submitted again.
OPTIONS_FILE = "study.json"


@dataclass(frozen=True)
class StudyOptions:
    """What ``euclip study`` was given to name its runs: the recipe and what varies it."""

    recipe: str
    seeds: Optional[int] = None
    overrides: tuple[str, ...] = ()
    configs: Optional[str] = None
    resources: tuple[str, ...] = ()
    world: Optional[str] = None  # an absolute path

    def command(self) -> str:
        """The ``euclip study`` command that names these runs (what a published study says made it)."""
        return " ".join(["euclip study --recipe", shlex.quote(self.recipe),
                         *([f"--seeds {self.seeds}"] if self.seeds else []),
                         *([f"--configs {shlex.quote(self.configs)}"] if self.configs else []),
                         *map(shlex.quote, self.overrides)])

    @classmethod
    def from_command(cls, text: str) -> "StudyOptions":
        """The options a study's ``command()`` names (a published study's provenance holds it), so that
        its runs' configurations can be loaded again without the folder it ran in."""
        words = shlex.split(text)
        if words[:3] != ["euclip", "study", "--recipe"] or len(words) < 4:
            raise UsageError(f"'{text}' is not an 'euclip study --recipe NAME ...' command")
        recipe, rest, seeds, configs, overrides = words[3], words[4:], None, None, []
        while rest:
            word = rest.pop(0)
            if word == "--seeds" and rest and rest[0].isdigit():
                seeds = int(rest.pop(0))
            elif word == "--configs" and rest:
                configs = rest.pop(0)
            elif "=" in word and not word.startswith("-"):
                overrides.append(word)
            else:
                raise UsageError(f"'{text}': '{word}' is not an option that names a study's runs")
        return cls(recipe, seeds, tuple(overrides), configs)

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / OPTIONS_FILE, json.dumps({f.name: getattr(self, f.name) for f in fields(self)},
                                                            indent=2) + "\n")

    @classmethod
    def read(cls, folder: Path) -> Optional["StudyOptions"]:
        """The options recorded in ``folder``, None where there are none; a damaged record is an error
        naming it."""
        path = folder / OPTIONS_FILE
        if not path.exists():
            return None
        stored = read_json(path)
        kinds = {"recipe": (str,), "seeds": (int, type(None)), "overrides": (list,), "configs": (str, type(None)),
                 "resources": (list,), "world": (str, type(None))}
        if (not isinstance(stored, dict) or "recipe" not in stored or set(stored) - set(kinds)
                or any(not isinstance(v, kinds[k]) or isinstance(v, bool) for k, v in stored.items())
                or any(not isinstance(item, str) for k in ("overrides", "resources") for item in stored.get(k, []))):
            raise UsageError(f"{path} is not a study's record of its options: repair it, or give --recipe and "
                             f"the study's options again")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})


def load_study(name_or_path: str, seeds: Optional[int] = None, overrides: Sequence[str] = (),
               only: Optional[Sequence[str]] = None, resources: Sequence[str] = ()) -> Study:
    """Read and check a study recipe: every configuration must load as a run config; ``seeds``
    (a count) replaces the recipe's; ``overrides`` apply to every configuration after its own (a
    variant of the whole study, such as another budget); ``only`` keeps those configurations;
    ``resources`` (``KEY=VALUE``) apply to every configuration's jobs after the recipe's.
    Raises UsageError listing every problem."""
    path = C.recipe_path(name_or_path)
    if not path.exists():
        raise UsageError(f"study recipe '{name_or_path}' not found (run 'euclip recipes list' to see them)")
    table = C.recipe_table(path)
    problems: list[str] = []
    study = table.get("study", {})
    unknown = set(table) - {"study", "configs"} | set(study) - {"seeds", "tasks", "baseline", "interval", "overrides",
                                                                "resources", "primary"}
    if unknown:
        problems.append(f"{path.name}: unknown key(s) {', '.join(sorted(unknown))} (a study has [study] with seeds, "
                        f"tasks, baseline, interval, overrides, resources, primary, and [configs.NAME] tables)")
    shared = resources_from(study.get("resources", {}), f"{path.name}: study.resources", Resources(), problems)
    given = resource_pairs(resources, problems)
    resources_from(given, "--resource", Resources(), problems)  # the command line's problems, once
    count = seeds if seeds is not None else study.get("seeds", 3)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SEEDS:
        problems.append(f"{path.name}: seeds must be an integer in [1, {MAX_SEEDS:,}], not {count!r}")
        count = 1
    common = _strings(study.get("overrides", []), f"{path.name}: study.overrides", problems)
    typed = [C.override_key(o) for o in overrides]
    problems += [f"override '{key}' is given more than once; give each key once" for key in sorted(set(typed))
                 if typed.count(key) > 1]
    configs = {}
    for name, spec in table.get("configs", {}).items():
        try:  # each configuration's runs are folders named after it
            plain_name(name, f"{path.name}: configs")
        except UsageError as err:
            problems.append(str(err))
            continue
        if not isinstance(spec, dict) or not isinstance(spec.get("recipe"), str):
            problems.append(f"{path.name}: configs.{name} needs recipe = \"NAME\"")
            continue
        extra = set(spec) - {"recipe", "overrides", "paper", "resources"}
        if extra:
            problems.append(f"{path.name}: configs.{name} has unknown key(s) {', '.join(sorted(extra))}")
        own = _strings(spec.get("overrides", []), f"{path.name}: configs.{name}.overrides", problems)
        paper = spec.get("paper")
        if paper is not None and paper not in sun_li_labels():
            problems.append(f"{path.name}: configs.{name}.paper: '{paper}' is not a label of "
                            f"euclip_cli/published/sun-li-temperature.csv")
        needs = resources_from(spec.get("resources", {}), f"{path.name}: configs.{name}.resources", shared, problems)
        needs = resources_from(given, "--resource", needs, [])
        configs[name] = StudyConfig(name, spec["recipe"], tuple(C.layered_overrides(common, own, overrides)), paper,
                                    needs)
    known_claims = {c.id: c for c in load_claims()}
    primary = _primary_claims(study.get("primary", []), configs, known_claims, f"{path.name}: study.primary", problems)
    if only is not None:
        unknown_configs = [n for n in only if n not in configs]
        if unknown_configs:
            problems.append(f"--configs: {', '.join(unknown_configs)} not in {path.name} ({', '.join(configs)})")
        configs = {n: c for n, c in configs.items() if n in only}
    if len(configs) < 2:
        problems.append(f"{path.name}: a study compares at least two [configs.NAME]")
    baseline = study.get("baseline", next(iter(configs), ""))
    if configs and baseline not in configs:
        problems.append(f"{path.name}: baseline '{baseline}' is not one of the configs ({', '.join(configs)})")
    interval = study.get("interval", "t")
    if interval not in INTERVALS:
        problems.append(f"{path.name}: interval '{interval}' is not one of {', '.join(INTERVALS)}")
    elif interval == "bootstrap" and count < MIN_BOOTSTRAP_SEEDS:
        problems.append(f"{path.name}: interval 'bootstrap' needs at least {MIN_BOOTSTRAP_SEEDS} seeds, not {count} "
                        f"(its quantiles come from too few distinct resamples): use interval = \"t\" or more seeds")
    tasks = study.get("tasks", "world")
    try:
        select(tasks)
    except UsageError as err:
        problems.append(f"{path.name}: tasks: {err}")
    name = path.stem.removeprefix(C.STUDY_PREFIX)  # the study's folder under results/studies
    try:
        plain_name(name, f"{path.name}: the study's name (its file name after '{C.STUDY_PREFIX}')")
    except UsageError as err:
        problems.append(str(err))
    # A study cut to some configurations (--configs) decides the primary claims it still has.
    primary = tuple(c for c in primary if all(n in configs for n in known_claims[c].configs))
    result = Study(name, path, configs, tuple(range(count)), tasks, baseline, interval, primary)
    for name, cfg in configs.items():
        try:
            C.load_config(cfg.recipe, result.overrides(name, 0))
        except C.ConfigError as err:
            problems += [f"{path.name}: configs.{name}: {p}" for p in err.problems]
    if problems:
        raise C.ConfigError(problems)
    return result


def _primary_claims(value: Any, configs: dict[str, StudyConfig], known: dict[str, Claim], where: str,
                    problems: list[str]) -> tuple[str, ...]:
    """The declared primary claims, each a claim of claims.toml that the study's configurations test."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: must be a list of claim ids (those of euclip_cli/study/claims.toml)")
        return ()
    for claim_id in value:
        if claim_id not in known:
            problems.append(f"{where}: '{claim_id}' is not a claim of euclip_cli/study/claims.toml")
        elif missing := [n for n in known[claim_id].configs if n not in configs]:
            problems.append(f"{where}: claim '{claim_id}' compares {', '.join(known[claim_id].configs)}, but the "
                            f"study has no configuration {', '.join(missing)}")
    if len(set(value)) < len(value):
        problems.append(f"{where}: a claim is named more than once; name each once")
    return tuple(dict.fromkeys(v for v in value if v in known))


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    claims = []
    for entry in tomllib.loads(path.read_text())["claim"]:
        paper = entry.pop("paper", [])
        claim = Claim(**entry, paper=tuple(paper) if isinstance(paper, list) else (paper,))
        malformed = claim.kind not in ("compare", "measure") or (
            claim.kind == "measure" and (claim.measure not in MEASURES or claim.control is None))
        if malformed:
            raise ValueError(f"{path}: claim {claim.id} is malformed")  # shipped data: a bug, not a usage error
        claims.append(claim)
    return claims
