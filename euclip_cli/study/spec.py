"""Study recipes and the paper's claims, read and checked (standard library only).

A study recipe (``recipes/study-NAME.toml``) names configurations, each a run recipe plus
overrides, and the seeds, tasks, baseline and interval of the comparison::

    [study]
    seeds = 3                 # seeds 0..2; every configuration trains with each
    tasks = "world"           # what each run is evaluated on
    baseline = "clip"         # the configuration every other one is compared with, paired by seed
    interval = "t"            # t or bootstrap (over seeds), 95%
    overrides = []            # applied to every configuration, before its own

    [configs.clip]
    recipe = "tiny-clip"

    [configs.euclip-ln]
    recipe = "tiny-euclip"
    overrides = ["model.final_ln=true"]
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from euclip_cli import config as C
from euclip_cli.errors import UsageError
from euclip_cli.evaluate.tasks import select
from euclip_cli.published import sun_li_labels
from euclip_cli.rundir import plain_name
from euclip_cli.stats import INTERVALS, MIN_BOOTSTRAP_SEEDS

CLAIMS_FILE = Path(__file__).with_name("claims.toml")
# A run's measured properties, each 0 or measured at initialisation (``runner.run_values``).
MEASURES = ("text_nearer_root", "curvature_fall")


@dataclass(frozen=True)
class StudyConfig:
    name: str
    recipe: str
    overrides: tuple[str, ...]
    # A published row this configuration reproduces: a label of euclip_cli/published/sun-li-temperature.csv.
    paper: Optional[str] = None


@dataclass(frozen=True)
class Study:
    name: str
    path: Path
    configs: dict[str, StudyConfig]
    seeds: tuple[int, ...]
    tasks: str
    baseline: str
    interval: str = "t"

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
    # per scale the paper reports, or Sun and Li's {source = "sun-li", ...}.
    paper: tuple[dict, ...] = ()
    # "Matches or beats": non-inferiority, a deficit up to ``margin`` points counts as matching.
    margin: Optional[float] = None
    config: Optional[str] = None
    measure: Optional[str] = None
    # A measure's control: the same configuration without the cause the claim names (lambda = 0).
    control: Optional[str] = None

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


def load_study(name_or_path: str, seeds: Optional[int] = None, overrides: Sequence[str] = (),
               only: Optional[Sequence[str]] = None) -> Study:
    """Read and check a study recipe: every configuration must load as a run config; ``seeds``
    (a count) replaces the recipe's; ``overrides`` apply to every configuration after its own (a
    variant of the whole study, such as another budget); ``only`` keeps those configurations.
    Raises UsageError listing every problem."""
    path = C.recipe_path(name_or_path)
    if not path.exists():
        raise UsageError(f"study recipe '{name_or_path}' not found (run 'euclip recipes list' to see them)")
    try:
        table = tomllib.loads(C.recipe_text(path))
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not a valid TOML file ({err}); fix the file") from None
    problems: list[str] = []
    study = table.get("study", {})
    unknown = set(table) - {"study", "configs"} | set(study) - {"seeds", "tasks", "baseline", "interval", "overrides"}
    if unknown:
        problems.append(f"{path.name}: unknown key(s) {', '.join(sorted(unknown))} (a study has [study] with seeds, "
                        f"tasks, baseline, interval, overrides, and [configs.NAME] tables)")
    count = seeds if seeds is not None else study.get("seeds", 3)
    if not isinstance(count, int) or count < 1:
        problems.append(f"{path.name}: seeds must be a positive integer, not {count!r}")
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
        extra = set(spec) - {"recipe", "overrides", "paper"}
        if extra:
            problems.append(f"{path.name}: configs.{name} has unknown key(s) {', '.join(sorted(extra))}")
        own = _strings(spec.get("overrides", []), f"{path.name}: configs.{name}.overrides", problems)
        paper = spec.get("paper")
        if paper is not None and paper not in sun_li_labels():
            problems.append(f"{path.name}: configs.{name}.paper: '{paper}' is not a label of "
                            f"euclip_cli/published/sun-li-temperature.csv")
        configs[name] = StudyConfig(name, spec["recipe"], tuple(C.layered_overrides(common, own, overrides)), paper)
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
    result = Study(name, path, configs, tuple(range(count)), tasks, baseline, interval)
    for name, cfg in configs.items():
        try:
            C.load_config(cfg.recipe, result.overrides(name, 0))
        except C.ConfigError as err:
            problems += [f"{path.name}: configs.{name}: {p}" for p in err.problems]
    if problems:
        raise C.ConfigError(problems)
    return result


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
