"""``euclip report``: tables of every run's results beside the paper's numbers, figures, one HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from euclip_cli.cli.common import RUNS_DIR_OPTION, checked_path, console, errors, writable_folder
from euclip_cli.rundir import STUDIES_DIR


def report(table: str = typer.Option("all", help="embedded, 1, 4, 5, 8 (the paper's tables), traversal "
                                                          "(Tables 6 and 7), released (imported runs beside "
                                                          "their published rows), meru (MERU's Tables 1, 2, 3 "
                                                          "and 7 beside MERU-comparable runs), equilibrium (runs' euclip "
                                                          "analyze equilibrium, studies' runs included), hierarchy "
                                                          "(runs' euclip analyze hierarchy --tree wordnet), "
                                                          "compositional (SugarCrepe and Winoground) or all."),
           fmt: str = typer.Option("md", "--format", help="md, csv, tex, or html (one self-contained report.html "
                                                           "with every table and figure)."),
           runs_dir: Path = RUNS_DIR_OPTION,
           studies_dir: Path = typer.Option(STUDIES_DIR, callback=checked_path,
                                            help="Where studies live (euclip study)."),
           out: Path = typer.Option(Path("results") / "tables", callback=writable_folder,
                                    help="Where the tables are written."),
           readme: Optional[Path] = typer.Option(None, callback=checked_path,
                                                 help="Instead: rewrite this README's results and curve "
                                                      "blocks from the study tables they name (euclip study "
                                                      "--publish).")
           ) -> None:
    """Write result tables to --out and print them; figures go to --out/../figures (PNG and PDF).

    Examples:
      euclip report
      euclip report --table 4 --format csv
      euclip report --table meru
      euclip report --format html
      euclip report --readme README.md
    """
    if readme is not None:
        from euclip_cli.report.readme import update_readme

        with errors():
            folders = update_readme(readme)
        console.print(f"{readme}: results rendered from {', '.join(folders)}", highlight=False)
        return
    from euclip_cli.report.runner import write_report

    with errors():
        shown = write_report(table, fmt, runs_dir, studies_dir, out)
    for item in shown:
        if item.text is None:
            console.print(item.title, highlight=False, markup=False)
        else:
            console.print(f"[bold]{escape(item.title)}[/]  ({escape(item.where)})")
            console.print(item.text, highlight=False, markup=False, soft_wrap=True)
