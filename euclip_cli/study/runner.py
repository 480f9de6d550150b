"""``euclip study`` as one call: a study's runs made here or on a cluster, summarised, and its tables and
figures written (and published for committing): what the command does, callable from a notebook.

The rooms: ``jobs`` (what each run runs, and running them here), ``launch`` (each run as a cluster job,
and what a plan costs), ``summaries`` (the numbers), ``tables`` (their markdown and CSV files),
``verdicts`` (the claims), and this module, which runs and publishes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from euclip_cli import config as C
from euclip_cli.errors import UsageError
from euclip_cli.protocol.tasks import SUITE_COLUMNS
from euclip_cli.figures import hierarchy_figure, study_figure, temperature_figure
from euclip_cli.hierarchy import world_guessing
from euclip_cli.rundir import RunDir, files_together, folder_lock, held_stops, write_text_atomic
from euclip_cli.study.jobs import RunPlan, plan, run_here
from euclip_cli.study import launch
from euclip_cli.study.spec import Study, StudyOptions, load_claims, load_study
from euclip_cli.study.summaries import summarize
from euclip_cli.study.tables import PUBLISHED, write_tables


@dataclass(frozen=True)
class StudyResult:
    """A summarised study: its numbers (``summaries.summarize``) and the files written."""

    summary: dict
    written: list[Path]


def run_study(study: Study, out: Path, jobs: int = 1, world: Optional[Path] = None,
              say: Callable[[str], None] = print, launcher: str = "local", wait: bool = True,
              poll_s: float = 60.0, options: Optional[StudyOptions] = None,
              stalled_after_s: float = launch.STALLED_AFTER_S, publish_to: Optional[Path] = None) -> Optional[StudyResult]:
    """Train and evaluate every unfinished run, ``jobs`` at a time here, or each as a job through a
    cluster launcher (``launch``), then summarise the study and write its tables and figures to
    ``out`` (and, with ``publish_to``, copy the tables there with their provenance); None while a
    cluster's runs are unfinished and the call does not ``wait`` for them. ``options``: what the
    command was given, recorded in the folder (``spec.OPTIONS_FILE``) for ``--status`` and a rerun
    that name only it. ``stalled_after_s``: a running job whose run writes nothing for that long is
    requeued (SLURM)."""
    claims = load_claims()
    plans = plan(study, out, claims, world)
    if launcher == "slurm":
        launch.check_slurm([study.configs[p.config].resources for p in plans])
    # The study folder first, held for this process: an unusable --out, or a second study on the same
    # folder (whose trainers would race this one's), fails here, before minutes of world generation.
    with folder_lock(out, lambda pid: UsageError(f"{out} is in use by another euclip study (pid {pid}): wait for "
                                                 f"it to finish, or pass --out NEW for a separate study")):
        check_configurations(plans, out)
        if options is not None:
            options.write(out)  # held by this process: a rerun or --status reads what it was started with
        if launcher == "local":
            run_here(study, out, plans, jobs, say)
        elif not launch.run_on_cluster(study, out, plans, launcher, wait, poll_s, say, stalled_after_s):
            return None
        summary = summarize(study, plans, claims, world)
        # A stop while the tables and figures are written leaves none of them, or the last study's whole.
        with files_together(out) as staging:
            staged = write_study(study, summary, staging)
        written = [out / path.relative_to(staging) for path in staged]
        if publish_to is not None:
            command = (options or StudyOptions(study.path.stem)).command()
            with held_stops():  # a published folder's tables and provenance change together
                written += publish(plans, out, publish_to, command)
    return StudyResult(summary, written)


def write_study(study: Study, summary: dict, out: Path) -> list[Path]:
    """A summarised study's files in ``out``: the tables (``tables.write_tables``), the scores' figure,
    the temperature over training and, where the runs placed their mistakes in the world's tree, the
    hierarchy figure."""
    written = write_tables(study, summary, out)
    written += study_figure(summary["rows"], list(study.configs), study.baseline, {**SUITE_COLUMNS["world"]},
                            out / "study")
    if summary["temperature"]["panels"]:
        written += temperature_figure(summary["temperature"], out / "study_temperature")
    if any(r["metric"] == "shapes_tie" for r in summary["rows"]):
        written += hierarchy_figure(summary["rows"], list(study.configs), world_guessing()["tie"],
                                    out / "study_hierarchy")
    return written


def check_configurations(plans: list[RunPlan], out: Path) -> None:
    """Refuse a study folder holding runs trained with another configuration than the study's recipes
    now give (a recipe edited since): they would be counted as finished, or fail one by one."""
    def changed_keys(plan: RunPlan) -> Optional[list[str]]:  # older runs read as the trainer reads them
        run = RunDir(plan.run_dir)
        return run.difference(plan.resolved, lambda stored: C.to_dict(C.from_dict(stored, str(run.config_file))))

    changed = [(p.name, keys) for p in plans if (keys := changed_keys(p))]
    if changed:
        shown = "; ".join(f"{name} differs in {', '.join(keys[:3])}" for name, keys in changed[:3])
        raise UsageError(f"{out} holds {len(changed)} run(s) trained with another configuration than the study's "
                         f"recipes now give ({shown}): a recipe changed since; pass --out NEW for a new study, "
                         f"or move {out} away (nothing was run)")


PROVENANCE = "provenance.json"


def publish(plans: list[RunPlan], folder: Path, dest: Path, command: str) -> list[Path]:
    """Copy a finished study's tables to ``dest`` (a folder under version control) with what made
    them: the command, the euclip commits and precisions its runs recorded, and the CPU."""
    from euclip_cli.device import cpu_name

    metas = [RunDir(p.run_dir).meta() for p in plans if RunDir(p.run_dir).meta_file.exists()]
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in PUBLISHED:
        write_text_atomic(dest / name, (folder / name).read_text())
        written.append(dest / name)
    revisions = sorted({m["git_revision"][:7] + ("+changes" if m.get("git_dirty") else "") for m in metas})
    provenance = {"command": command, "runs": len(metas), "euclip_commits": revisions,
                  "precisions": sorted({m["precision"] for m in metas}),
                  "cpus": sorted({m["cpu"] for m in metas if "cpu" in m}) or [cpu_name()],
                  "torch": sorted({m["packages"]["torch"] for m in metas}),
                  # A published number names the commit that made it: a run trained from uncommitted
                  # changes cannot be traced to one.
                  "runs_from_uncommitted_changes": sum(1 for m in metas if m.get("git_dirty")),
                  "last_run_started": max((m["started"] for m in metas), default=None)}
    write_text_atomic(dest / PROVENANCE, json.dumps(provenance, indent=2) + "\n")
    return written + [dest / PROVENANCE]


# What republishing recomputes: the tables read from seeds.csv. The rest (seeds.csv itself, the noise
# floor and the evaluation-size curve, measured from the runs' per-image outcomes) stays as published.
RECOMPUTED = ("study.csv", "claims.csv", "regime.json", "study.md")


def republish(folder: Path) -> list[Path]:
    """Recompute a published study's tables (``RECOMPUTED``) from its committed per-seed values with this
    euclip's statistics and claims, training nothing: the study is the one its provenance's command
    names. The provenance gains the commit of the code that recomputed them."""
    import csv
    import io

    from euclip_cli.readers import read_text
    from euclip_cli.device import git_state
    from euclip_cli.study.summaries import tabulate
    from euclip_cli.study.tables import to_csv, to_markdown

    for needed in ("seeds.csv", PROVENANCE, "noise.csv", "eval_size.csv"):
        if not (folder / needed).is_file():
            raise UsageError(f"{folder / needed} is missing: --republish reads a folder 'euclip study --publish' "
                             f"wrote (with its seeds.csv)")

    def rows_of(name: str) -> list[dict]:
        return list(csv.DictReader(io.StringIO(read_text(folder / name, "a published table"))))

    def number(text: str):
        return None if text == "" else float(text)

    provenance = json.loads(read_text(folder / PROVENANCE, "a study's provenance"))
    given = StudyOptions.from_command(provenance["command"])
    study = load_study(given.recipe, given.seeds, list(given.overrides),
                       given.configs.split(",") if given.configs else None)
    per_seed = rows_of("seeds.csv")
    by_config: dict[str, dict[int, dict[str, float]]] = {}
    for r in per_seed:
        by_config.setdefault(r["config"], {}).setdefault(int(r["seed"]), {})[r["metric"]] = float(r["value"])
    eval_size = [{**r, "images": int(r["images"]), "configs": int(r["configs"]),
                  **{k: number(r[k]) for k in ("paired_sd_median", "paired_sampling_se_median")}}
                 for r in rows_of("eval_size.csv")]
    noise = [{k: v if k == "metric" else number(v) for k, v in r.items()} for r in rows_of("noise.csv")]
    rows, reading, claims = tabulate(study, load_claims(), by_config, eval_size)
    summary = {"rows": rows, "claims": claims, "seeds": sorted({int(r["seed"]) for r in per_seed}),
               "per_seed": per_seed, "regime": reading, "noise": noise, "eval_size": eval_size}
    texts = {"study.csv": to_csv(rows), "claims.csv": to_csv(claims), "regime.json": json.dumps(reading, indent=2),
             "study.md": to_markdown(study, summary)}
    written = []
    for name in RECOMPUTED:
        write_text_atomic(folder / name, texts[name])
        written.append(folder / name)
    commit, dirty = git_state(code_only=True)
    provenance["tables_recomputed_at"] = commit[:7] + ("+changes" if dirty else "")
    write_text_atomic(folder / PROVENANCE, json.dumps(provenance, indent=2) + "\n")
    return written + [folder / PROVENANCE]
