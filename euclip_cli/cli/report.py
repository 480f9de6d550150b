"""``euclip report``: tables of every run's results, beside the paper's numbers."""

from __future__ import annotations

from pathlib import Path

import typer

from euclip_cli.cli.common import RUNS_DIR, console, errors, fail

TABLES = ("embedded", "1", "4", "5", "8", "all")


def report(table: str = typer.Option("all", help="embedded, 1, 4, 5, 8 (the paper's tables) or all."),
           fmt: str = typer.Option("md", "--format", help="md or csv."),
           runs_dir: Path = typer.Option(RUNS_DIR, help="Where run directories live."),
           out: Path = typer.Option(Path("results") / "tables", help="Where the tables are written.")) -> None:
    """Write result tables to --out and print them.

    Examples:
      euclip report
      euclip report --table 4 --format csv
    """
    if table not in TABLES:
        fail(f"--table {table!r} is not one of {', '.join(TABLES)}", 2)
    if fmt not in ("md", "csv"):
        fail(f"--format {fmt!r} is not one of md, csv", 2)
    with errors():
        from euclip_cli.report.tables import load_runs, paper_table, render, suite_table

        runs = load_runs(runs_dir)
        out.mkdir(parents=True, exist_ok=True)
        wanted = ["embedded", "1", "4", "5", "8"] if table == "all" else [table]
        for name in wanted:
            if name == "embedded":
                df, title = suite_table(runs, "world"), "Embedded world: zero-shot results (%)"
            else:
                df, title = paper_table(runs, int(name)), f"Paper Table {name}: published vs ours (%)"
            path = out / f"{'embedded' if name == 'embedded' else 'table' + name}.{fmt}"
            text = render(df, fmt)
            path.write_text((f"## {title}\n\n" if fmt == "md" else "") + text)
            console.print(f"[bold]{title}[/]  ({path})")
            console.print(text, highlight=False, markup=False, soft_wrap=True)
    console.print(f"tables written to {out}")
