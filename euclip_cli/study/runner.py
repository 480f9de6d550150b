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
from euclip_cli.rundir import RunDir, folder_lock, write_text_atomic
from euclip_cli.study.jobs import RunPlan, plan, run_here
from euclip_cli.study import launch
from euclip_cli.study.spec import Study, StudyOptions, load_claims
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
        written = write_study(study, summary, out)
        if publish_to is not None:
            command = (options or StudyOptions(study.path.stem)).command()
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
