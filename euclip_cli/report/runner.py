"""``euclip report`` as one call: every run's and study's tables beside the paper's numbers, written to a
folder (Markdown, CSV, LaTeX, or one HTML page), with the figures; it returns what the terminal should
show (``Shown``), so the command only prints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from euclip_cli.errors import UsageError
from euclip_cli.report.tables import (compositional_table, equilibrium_table, hierarchy_table, fill_command,
                                      hycoclip_table, load_runs, meru_table, noise_table, paper_table, released_table,
                                      render, single_seed_note, study_tables, suite_table, traversal_table,
                                      without_runs)
from euclip_cli.rundir import RUNS_DIR, STUDIES_DIR

TABLES = ("embedded", "1", "4", "5", "8", "traversal", "released", "meru", "hycoclip", "equilibrium", "hierarchy",
          "compositional", "all")
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
    if name == "compositional":
        df = compositional_table(runs)
        return ("Compositional tasks: Winoground's scores and SugarCrepe's accuracy per split, in each run's "
                "geometry (%)" + single_seed_note(list(df.get("seeds", []))), df)
    if name == "meru":
        return ("MERU's Tables 1, 2, 3 and 7: published vs ours, by MERU's suites or DataComp's task of each dataset (%)",
                meru_table(runs))
    if name == "hycoclip":
        return ("HyCoCLIP's model zoo: its released CLIP, MERU and HyCoCLIP (trained on GRIT), published vs ours by "
                "MERU's suite, which HyCoCLIP's evaluation repeats (%)", hycoclip_table(runs))
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


def _table_name(name: str) -> str:
    """How a line names report table ``name``."""
    return f"Table {name}" if name.isdigit() else {"traversal": "Tables 6 and 7", "released": "released",
                                                   "meru": "MERU's", "hycoclip": "HyCoCLIP's"}.get(name, name)


def write_report(table: str = "all", fmt: str = "md", runs_dir: Path = RUNS_DIR, studies_dir: Path = STUDIES_DIR,
                 out: Path = Path("results") / "tables") -> list[Shown]:
    """Write ``table`` (or all) in ``fmt`` to ``out`` and the figures to ``out/../figures``; returns what
    to show: the runs' tables, then the studies'. A table without runs of ours keeps its published rows
    in the file and is one line on the terminal (one line for all of them, with ``all``); with no runs at
    all, a table already written is left as it was."""
    check_options(table, fmt, runs_dir, out)
    runs = load_runs(runs_dir)
    out.mkdir(parents=True, exist_ok=True)
    wanted = [t for t in TABLES if t != "all"] if table == "all" else [table]
    study_folders = sorted(p.parent for p in studies_dir.glob("*/study.csv"))
    studies = [(folder, section) for folder in study_folders if table == "all" for section in _study_sections(folder, fmt)]
    if fmt == "html":
        frames = [(name, *_table(name, runs, runs_dir, study_folders)) for name in wanted]
        figures = write_figures(runs, runs_dir, out.parent / "figures")
        return [Shown(_write_page(out / "report.html", frames, figures, [section for _, section in studies], runs_dir,
                                  study_folders))]
    shown: list[Shown] = []
    published_only, empty, unanalysed, kept = [], [], [], []
    for name in wanted:
        title, df = _table(name, runs, runs_dir, study_folders)
        if name in ANALYSIS_COMMANDS and df.empty:
            unanalysed.append(name)
            continue
        text = render(df, fmt)
        path = out / f"{name if not name.isdigit() else 'table' + name}.{fmt}"
        if not runs and path.exists():
            # No runs (a mistyped --runs-dir, or studies only): an empty table must not replace a filled one.
            kept.append(path)
            continue
        path.write_text((f"## {title}\n\n" if fmt == "md" else "") + text)
        if name != "embedded" and without_runs(name, df):
            if table != "all":
                shown.append(Shown(f"{title}: no run of ours yet ({fill_command(name)}); published rows in {path}"))
            (published_only if not df.empty else empty).append(name)
        else:
            shown.append(Shown(title, str(path), text))
    shown += [Shown(title, str(folder), text) for folder, (title, text, _) in studies]
    if kept:
        shown.append(Shown(f"no runs in {runs_dir}: {', '.join(p.name for p in kept)} in {out} left as they were"))
    elsewhere = [run.name for run in runs if run.other_worlds]
    if elsewhere:
        shown.append(Shown(f"each run's world scores are on its own embedded world (the one it trained on, else the "
                           f"first it was evaluated on); {', '.join(elsewhere)} also {'has' if len(elsewhere) == 1 else 'have'} "
                           f"scores on another, left out (euclip eval RUN --world DIR prints them)"))
    stale = [run.name for run in runs if run.earlier_only]
    if stale:
        shown.append(Shown(f"each run's scores are of its newest checkpoint scored; {', '.join(stale)} also "
                           f"{'has' if len(stale) == 1 else 'have'} tasks scored only at an earlier one, left out "
                           f"(euclip eval RUN --tasks KEYS scores them at the run's latest checkpoint)"))
    if (published_only or empty) and table == "all":
        parts = [f"{', '.join(map(_table_name, published_only))} keep their published rows in {out}"] if published_only else []
        parts += [f"{', '.join(map(_table_name, empty))} {'is' if len(empty) == 1 else 'are'} empty"] if empty else []
        shown.append(Shown(f"no run of yours yet in {len(published_only) + len(empty)} tables: {'; '.join(parts)} "
                           f"(euclip report --table NAME says what fills one)"))
    if unanalysed:
        shown.append(Shown("no run has the analysis " + " or ".join(
            f"the {name} table needs ({ANALYSIS_COMMANDS[name]})" for name in unanalysed)
            + (": that table is not written" if len(unanalysed) == 1 else ": those tables are not written")))
    write_figures(runs, runs_dir, out.parent / "figures")
    return shown + [Shown(f"tables written to {out}; figures to {out.parent / 'figures'}")]


def _write_page(path: Path, frames: list, figures: list, studies: list, runs_dir: Path,
                study_folders: list[Path]) -> str:
    """The self-contained HTML page: the runs' tables and figures, then the studies', then every
    published table whole in a closed reference section. Returns the line that says what it holds."""
    from euclip_cli.report.html import page
    from euclip_cli.report.tables import own_rows, published_reference, without_empty_columns
    from euclip_cli.rundir import all_runs

    sections = [(title, render(without_empty_columns(mine), "html"), []) for name, title, df in frames
                if not (mine := own_rows(name, df)).empty]
    figures = figures + [(f"{run.name}: {p.stem}", p) for run in all_runs(runs_dir)
                         for p in sorted(run.analysis_dir.glob("*.png"))]
    if figures:
        sections.append(("Figures of your runs", "", figures))
    sections += studies
    # Of a study's many runs only the equilibrium figures, which the equilibrium table summarises.
    equilibria = [(f"{folder.name}/{run.name}: equilibrium", run.analysis_dir / "equilibrium.png")
                  for folder in study_folders for run in all_runs(folder / "runs")
                  if (run.analysis_dir / "equilibrium.png").exists()]
    if equilibria:
        sections.append(("Figures of the studies' runs: the equilibrium", "", equilibria))
    reference = [(title, render(df, "html")) for title, df in published_reference()]
    path.write_text(page("euclip report", sections, reference))
    def count(n: int, what: str) -> str:
        return f"{n} {what}{'' if n == 1 else 's'}"

    return (f"report page: {path} ({count(sum(bool(table) for _, table, _ in sections), 'table')} of yours and your "
            f"studies', {count(sum(len(own) for *_, own in sections), 'figure')}, "
            f"{count(len(reference), 'published table')} for reference)")


def write_figures(runs, runs_dir: Path, folder: Path) -> list[tuple[str, Path]]:
    """Training curves and per-group zero-shot bars of every run; returns (caption, PNG) pairs."""
    from euclip_cli.protocol.tasks import SUITE_COLUMNS
    from euclip_cli.figures import group_bars, training_curves
    from euclip_cli.report.tables import SINGLE_SEED, training_metrics

    made = []
    metrics = training_metrics(runs_dir, [r.name for r in runs])
    drawn = training_curves(metrics, folder / "training_curves") if metrics else []
    if drawn:
        made.append(("Training curves: loss terms, logit scale, curvature", drawn[0]))
    for suite in SUITE_COLUMNS:
        scores = {r.name: r.scores[suite] for r in runs if r.scores[suite]["tasks_done"]}
        if scores:
            columns = {k: v for k, v in SUITE_COLUMNS[suite].items()}
            png = group_bars(scores, columns, folder / f"zero_shot_{suite}")[0]
            made.append((f"Zero-shot results per group ({suite}), one run per bar ({SINGLE_SEED})", png))
    return made
