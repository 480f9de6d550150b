"""``euclip report``: tables of every run's results beside the paper's numbers, figures, one HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli.common import console, errors, fail
from euclip_cli.rundir import RUNS_DIR, STUDIES_DIR

TABLES = ("embedded", "1", "4", "5", "8", "traversal", "released", "equilibrium", "all")


def report(table: str = typer.Option("all", help="embedded, 1, 4, 5, 8 (the paper's tables), traversal "
                                                          "(Tables 6 and 7), released (imported runs beside "
                                                          "their published rows), equilibrium (runs' euclip "
                                                          "analyze equilibrium, studies' runs included) or all."),
           fmt: str = typer.Option("md", "--format", help="md, csv, tex, or html (one self-contained report.html "
                                                           "with every table and figure)."),
           runs_dir: Path = typer.Option(RUNS_DIR, help="Where run directories live."),
           studies_dir: Path = typer.Option(STUDIES_DIR, help="Where studies live (euclip study)."),
           out: Path = typer.Option(Path("results") / "tables", help="Where the tables are written."),
           readme: Optional[Path] = typer.Option(None, help="Instead: rewrite this README's results blocks from "
                                                             "the study tables they name (euclip study --publish).")
           ) -> None:
    """Write result tables to --out and print them; figures go to --out/../figures (PNG and PDF).

    Examples:
      euclip report
      euclip report --table 4 --format csv
      euclip report --format html
      euclip report --readme README.md
    """
    if readme is not None:
        from euclip_cli.report.readme import update_readme

        with errors():
            folders = update_readme(readme)
        console.print(f"{readme}: results rendered from {', '.join(folders)}", highlight=False)
        return
    if table not in TABLES:
        fail(f"--table {table!r} is not one of {', '.join(TABLES)}", 2)
    if fmt not in ("md", "csv", "tex", "html"):
        fail(f"--format {fmt!r} is not one of md, csv, tex, html", 2)
    if runs_dir.exists() and not runs_dir.is_dir():
        fail(f"--runs-dir {runs_dir} is not a folder: nothing was written (the tables in {out} are as they were)", 2)
    with errors():
        from euclip_cli.report.tables import (equilibrium_table, fill_command, load_runs, noise_table, paper_table,
                                              released_table, render, single_seed_note, study_tables, suite_table,
                                              traversal_table, without_runs)

        runs = load_runs(runs_dir)
        out.mkdir(parents=True, exist_ok=True)
        wanted = ["embedded", "1", "4", "5", "8", "traversal", "released", "equilibrium"] if table == "all" else [table]
        study_folders = sorted(p.parent for p in studies_dir.glob("*/study.csv"))
        # (heading, table, its figures): the HTML page's sections; the other formats print them.
        sections, frames = [], []
        # Studies first: seeds and intervals are what a comparison stands on.
        for folder in study_folders if table == "all" else []:
            results, claims = study_tables(folder)
            png = folder / "study.png"
            figure = [(f"Study {folder.name}: means and paired differences with 95% intervals", png)] if png.exists() else []
            curves = folder / "study_temperature.png"
            learned = ([(f"Study {folder.name}: the learned temperature over training (mean over seeds, "
                         f"lowest to highest seed shaded)", curves)] if curves.exists() else [])
            noise = noise_table(folder)
            shown = [(f"Study {folder.name}: zero-shot (%), mean ± sd over seeds", results, []),
                     (f"Study {folder.name}: the paper's claims", claims, figure)]
            if noise is not None:
                shown.append((f"Study {folder.name}: the noise floor (points)", noise, []))
            # The temperature's course closes the study's block: the comparison and its claims lead.
            shown[-1][2].extend(learned)
            for title, df, own in shown:
                sections.append((title, render(df, fmt), own))
                if fmt != "html":
                    console.print(f"[bold]{title}[/]  ({folder})")
                    console.print(sections[-1][1], highlight=False, markup=False, soft_wrap=True)
        for name in wanted:
            if name == "embedded":
                df = suite_table(runs, "world")
                title = "Embedded world: zero-shot results (%)" + single_seed_note(list(df.get("seeds", [])))
            elif name == "released":
                df, title = released_table(runs), "Released models imported: published ImageNet zero-shot vs ours (%)"
            elif name == "equilibrium":
                df, title = (equilibrium_table([runs_dir, *(f / "runs" for f in study_folders)]),
                             "Sun and Li's Figure 1 as numbers: the temperature where alignment and uniformity "
                             "balance (euclip analyze equilibrium)")
                if df.empty and fmt != "html":
                    console.print("no run has an equilibrium analysis (euclip analyze equilibrium RUN): "
                                  "that table is not written", highlight=False)
                    continue
            elif name == "traversal":
                df, title = (traversal_table(runs_dir), "Paper Tables 6 and 7: captions per image along image "
                                                         "traversals, [ROOT] excluded (euclip analyze traverse)")
            else:
                df, title = paper_table(runs, int(name)), f"Paper Table {name}: published vs ours (%)"
            if fmt == "html":
                frames.append((name, title, df))
                continue
            text = render(df, fmt)
            path = out / f"{name if not name.isdigit() else 'table' + name}.{fmt}"
            if not runs and path.exists():
                # No runs (a mistyped --runs-dir, or studies only): an empty table must not replace a filled one.
                console.print(f"no runs in {runs_dir}: {path} left as it was", highlight=False)
                continue
            path.write_text((f"## {title}\n\n" if fmt == "md" else "") + text)
            if name != "embedded" and without_runs(name, df):
                # The file keeps the published rows; the terminal shows tables that hold runs.
                console.print(f"{title}: no run of ours yet ({fill_command(name)}); published rows in {path}",
                              highlight=False, markup=False)
                continue
            console.print(f"[bold]{title}[/]  ({path})")
            console.print(text, highlight=False, markup=False, soft_wrap=True)
        figures = write_figures(runs, runs_dir, out.parent / "figures")
    if fmt == "html":
        from euclip_cli.report.html import page
        from euclip_cli.report.tables import fold_published
        from euclip_cli.rundir import all_runs

        sections += [(title, render(df, fmt), []) for title, df in fold_published(frames)]

        analysis = [(f"{run.name}: {p.stem}", p) for run in all_runs(runs_dir) for p in sorted(run.analysis_dir.glob("*.png"))]
        # Of a study's many runs only the equilibrium figures, which the equilibrium table summarises.
        analysis += [(f"{folder.name}/{run.name}: equilibrium", run.analysis_dir / "equilibrium.png")
                     for folder in study_folders for run in all_runs(folder / "runs")
                     if (run.analysis_dir / "equilibrium.png").exists()]
        path = out / "report.html"
        path.write_text(page("euclip report", sections, figures + analysis))
        console.print(f"report page: {path} ({len(sections)} tables, "
                      f"{sum(len(own) for *_, own in sections) + len(figures) + len(analysis)} figures)")
        return
    console.print(f"tables written to {out}; figures to {out.parent / 'figures'}")


def write_figures(runs, runs_dir: Path, folder: Path) -> list[tuple[str, Path]]:
    """Training curves and per-group zero-shot bars of every run; returns (caption, PNG) pairs."""
    from euclip_cli.evaluate.tasks import SUITE_COLUMNS
    from euclip_cli.report.figures import group_bars, training_curves
    from euclip_cli.report.tables import SINGLE_SEED, training_metrics

    made = []
    metrics = training_metrics(runs_dir, [r.name for r in runs])
    if metrics:
        png = training_curves(metrics, folder / "training_curves")[0]
        made.append(("Training curves: loss terms, logit scale, curvature", png))
    for suite in SUITE_COLUMNS:
        scores = {r.name: r.scores[suite] for r in runs if r.scores[suite]["tasks_done"]}
        if scores:
            columns = {k: v for k, v in SUITE_COLUMNS[suite].items()}
            png = group_bars(scores, columns, folder / f"zero_shot_{suite}")[0]
            made.append((f"Zero-shot results per group ({suite}), one run per bar ({SINGLE_SEED})", png))
    return made
