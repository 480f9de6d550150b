"""``euclip study --recipe NAME [--seeds N] [--jobs J]``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli.common import checked_path, console, errors, writable_folder


def study(recipe: str = typer.Option(..., "--recipe", "-r", help="A study recipe (recipes/study-*.toml)."),
          overrides: Optional[list[str]] = typer.Argument(None, help="section.key=value overrides for every "
                                                                      "configuration, after its own (e.g. "
                                                                      "optim.samples=131072 for 4x the budget).",
                                                           show_default=False),
          configs: Optional[str] = typer.Option(None, help="Comma-separated configurations to keep (default: all)."),
          seeds: Optional[int] = typer.Option(None, min=1, help="Seeds 0..N-1 instead of the recipe's count."),
          jobs: int = typer.Option(1, min=1, help="Runs trained at once (each gets cores / jobs threads)."),
          out: Optional[Path] = typer.Option(None, callback=writable_folder,
                                             help="Study folder (default: results/studies/NAME)."),
          world: Optional[Path] = typer.Option(None, callback=checked_path,
                                               help="Embedded world to evaluate on (default: the one trained on)."),
          publish: Optional[Path] = typer.Option(None, callback=writable_folder,
                                                 help="Also copy the tables (study.md, study.csv, claims.csv, "
                                                      "noise.csv, regime.json) with their provenance to this "
                                                      "folder, for committing: euclip report --readme "
                                                      "renders the README's results from it.")
          ) -> None:
    """Train and evaluate every (configuration, seed) of a study, then compare them with intervals.

    Re-running the same command skips finished runs and resumes interrupted ones. Writes
    study.md, study.csv, claims.csv, study.png/pdf and the temperature over training
    (study_temperature.png/pdf) to the study folder.

    Examples:
      euclip study --recipe study-geometries
      euclip study --recipe study-geometries --seeds 5 --jobs 2
      euclip study --recipe study-geometries --publish docs/results/geometries
      euclip study --recipe study-geometries --configs clip,euclip optim.samples=131072 --out results/studies/x4
    """
    from euclip_cli.evaluate.tasks import SUITE_COLUMNS
    from euclip_cli.report.figures import study_figure, temperature_figure
    from euclip_cli.rundir import STUDIES_DIR
    from euclip_cli.study.runner import plan, publish as publish_tables, run_study
    from euclip_cli.study.spec import load_claims, load_study
    from euclip_cli.study.tables import to_markdown, write_tables

    with errors():
        spec = load_study(recipe, seeds, overrides or [], configs.split(",") if configs else None)
        folder = out or STUDIES_DIR / spec.name
        summary = run_study(spec, folder, jobs, world, say=lambda line: console.print(line, highlight=False))
        written = write_tables(spec, summary, folder)
        written += study_figure(summary["rows"], list(spec.configs), spec.baseline,
                                {**SUITE_COLUMNS["world"]}, folder / "study")
        if summary["temperature"]["panels"]:
            written += temperature_figure(summary["temperature"], folder / "study_temperature")
        if publish is not None:
            command = " ".join(["euclip study --recipe", recipe, *([f"--seeds {seeds}"] if seeds else []),
                                *([f"--configs {configs}"] if configs else []), *(overrides or [])])
            written += publish_tables(plan(spec, folder, load_claims(), world), folder, publish, command)
    console.print(to_markdown(spec, summary), highlight=False, markup=False)
    console.print("written: " + ", ".join(str(p) for p in written))
