"""``euclip report`` as one call: every run's and study's tables beside the paper's numbers, written to a
folder (Markdown, CSV, LaTeX, or one HTML page), with the figures; it returns what the terminal should
show (``Shown``), so the command only prints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from euclip_cli.errors import UsageError
from euclip_cli.report.tables import (equilibrium_table, hierarchy_table, fill_command, load_runs, meru_table, noise_table,
                                      paper_table, released_table, render, single_seed_note, study_tables, suite_table,
                                      traversal_table, without_runs)
from euclip_cli.rundir import RUNS_DIR, STUDIES_DIR

TABLES = ("embedded", "1", "4", "5", "8", "traversal", "released", "meru", "equilibrium", "hierarchy", "all")
FORMATS = ("md", "csv", "tex", "html")


@dataclass(frozen=True)
class Shown:
    """One thing the report tells the terminal: a table (its title, where it was written, its text) or,
    with ``text`` None, one line (``title``)."""

    title: str
    where: str = ""
    text: "str | None" = None


# The analysis that fills each table made of runs' analyses alone.
ANALYSIS_COMMANDS = {"equilibrium": "euclip analyze equilibrium RUN", "hierarchy": "euclip analyze hierarchy RUN --tree wordnet"}


def check_options(table: str, fmt: str, runs_dir: Path, out: Path) -> None:
    if table not in TABLES:
        raise UsageError(f"--table {table!r} is not one of {', '.join(TABLES)}")
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    if runs_dir.exists() and not runs_dir.is_dir():
        raise UsageError(f"--runs-dir {runs_dir} is not a folder: nothing was written (the tables in {out} are as "
                         f"they were)")


def _study_sections(folder: Path, fmt: str) -> list[tuple[str, str, list]]:
    """A study's (title, rendered table, its figures): results, claims (with the study's figure), the noise
    floor where measured; the learned temperature's course and the hierarchy's figure close the block."""
    results, claims = study_tables(folder)
    png = folder / "study.png"
    figure = [(f"Study {folder.name}: means and paired differences with 95% intervals", png)] if png.exists() else []
    closing = [(title, path) for title, path in (
        (f"Study {folder.name}: the learned temperature over training (mean over seeds, lowest to highest seed "
         f"shaded)", folder / "study_temperature.png"),
        (f"Study {folder.name}: Shapes mistakes in the class tree and entailment as a score (means, 95% intervals "
         f"over seeds)", folder / "study_hierarchy.png")) if path.exists()]
    noise = noise_table(folder)
    shown = [(f"Study {folder.name}: zero-shot (%), mean ± sd over seeds", results, []),
             (f"Study {folder.name}: the paper's claims", claims, figure)]
    if noise is not None:
        shown.append((f"Study {folder.name}: the noise floor (points)", noise, []))
    shown[-1][2].extend(closing)
    return [(title, render(df, fmt), own) for title, df, own in shown]


def _table(name: str, runs, runs_dir: Path, study_folders: list[Path]):
    """``(title, frame)`` of one table of ``TABLES``."""
    if name == "embedded":
        df = suite_table(runs, "world")
        return "Embedded world: zero-shot results (%)" + single_seed_note(list(df.get("seeds", []))), df
    if name == "released":
        return "Released models imported: published ImageNet zero-shot vs ours (%)", released_table(runs)
    if name == "meru":
        return ("MERU's Tables 1, 2, 3 and 7: published vs ours, by MERU's suites or DataComp's task of each dataset (%)",
                meru_table(runs))
    if name == "equilibrium":
        return ("Sun and Li's Figure 1 as numbers: the temperature where alignment and uniformity balance "
                "(euclip analyze equilibrium)", equilibrium_table([runs_dir, *(f / "runs" for f in study_folders)]))
    if name == "hierarchy":
        return ("HyCoCLIP's hierarchical classification on ImageNet (euclip analyze hierarchy --tree wordnet); "
                "HyCoCLIP's published numbers are not in this project's sources",
                hierarchy_table([runs_dir, *(f / "runs" for f in study_folders)]))
    if name == "traversal":
        return ("Paper Tables 6 and 7: captions per image along image traversals, [ROOT] excluded "
                "(euclip analyze traverse)", traversal_table(runs_dir))
    return f"Paper Table {name}: published vs ours (%)", paper_table(runs, int(name))


def write_report(table: str = "all", fmt: str = "md", runs_dir: Path = RUNS_DIR, studies_dir: Path = STUDIES_DIR,
                 out: Path = Path("results") / "tables") -> list[Shown]:
    """Write ``table`` (or all) in ``fmt`` to ``out`` and the figures to ``out/../figures``; returns what
    to show. A table without runs of ours keeps its published rows in the file and is one line on the
    terminal; with no runs at all, a table already written is left as it was."""
    check_options(table, fmt, runs_dir, out)
    runs = load_runs(runs_dir)
    out.mkdir(parents=True, exist_ok=True)
    wanted = [t for t in TABLES if t != "all"] if table == "all" else [table]
    study_folders = sorted(p.parent for p in studies_dir.glob("*/study.csv"))
    shown: list[Shown] = []
    sections: list[tuple[str, str, list]] = []  # the HTML page's (title, table, figures)
    frames = []
    # Studies first: seeds and intervals are what a comparison stands on.
    for folder in study_folders if table == "all" else []:
        for title, text, own in _study_sections(folder, fmt):
            sections.append((title, text, own))
            shown.append(Shown(title, str(folder), text))
    for name in wanted:
        title, df = _table(name, runs, runs_dir, study_folders)
        if fmt == "html":
            frames.append((name, title, df))
            continue
        if name in ("equilibrium", "hierarchy") and df.empty:
            shown.append(Shown(f"no run has the analysis the {name} table needs ({ANALYSIS_COMMANDS[name]}): that table "
                               f"is not written"))
            continue
        text = render(df, fmt)
        path = out / f"{name if not name.isdigit() else 'table' + name}.{fmt}"
        if not runs and path.exists():
            # No runs (a mistyped --runs-dir, or studies only): an empty table must not replace a filled one.
            shown.append(Shown(f"no runs in {runs_dir}: {path} left as it was"))
            continue
        path.write_text((f"## {title}\n\n" if fmt == "md" else "") + text)
        if name != "embedded" and without_runs(name, df):
            shown.append(Shown(f"{title}: no run of ours yet ({fill_command(name)}); published rows in {path}"))
        else:
            shown.append(Shown(title, str(path), text))
    figures = write_figures(runs, runs_dir, out.parent / "figures")
    if fmt != "html":
        return shown + [Shown(f"tables written to {out}; figures to {out.parent / 'figures'}")]
    return [Shown(_write_page(out / "report.html", sections, frames, figures, runs_dir, study_folders))]


def _write_page(path: Path, sections: list, frames: list, figures: list, runs_dir: Path,
                study_folders: list[Path]) -> str:
    """The self-contained HTML page; returns the line that says what it holds."""
    from euclip_cli.report.html import page
    from euclip_cli.report.tables import fold_published
    from euclip_cli.rundir import all_runs

    sections = sections + [(title, render(df, "html"), []) for title, df in fold_published(frames)]
    analysis = [(f"{run.name}: {p.stem}", p) for run in all_runs(runs_dir) for p in sorted(run.analysis_dir.glob("*.png"))]
    # Of a study's many runs only the equilibrium figures, which the equilibrium table summarises.
    analysis += [(f"{folder.name}/{run.name}: equilibrium", run.analysis_dir / "equilibrium.png")
                 for folder in study_folders for run in all_runs(folder / "runs")
                 if (run.analysis_dir / "equilibrium.png").exists()]
    path.write_text(page("euclip report", sections, figures + analysis))
    return (f"report page: {path} ({len(sections)} tables, "
            f"{sum(len(own) for *_, own in sections) + len(figures) + len(analysis)} figures)")


def write_figures(runs, runs_dir: Path, folder: Path) -> list[tuple[str, Path]]:
    """Training curves and per-group zero-shot bars of every run; returns (caption, PNG) pairs."""
    from euclip_cli.protocol.tasks import SUITE_COLUMNS
    from euclip_cli.figures import group_bars, training_curves
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
