"""The ``euclip`` command line: ``download | train | eval | import | export | push | study | report | analyze | recipes | bench``.

Each command lives in its own module and imports torch, open_clip and friends inside
the command body, so ``euclip --help`` answers at once.
"""

from __future__ import annotations

from typing import Optional

import typer

from euclip_bench.cli import app as bench_app
from euclip_cli.cli import analyze, download, evaluate, export, importing, recipes, report, study, train
from euclip_cli.cli.common import OneLineErrors, run_app

app = typer.Typer(
    cls=OneLineErrors,
    name="euclip",
    help="Embedding geometries of contrastive language-image pre-training: download, train, eval, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from euclip_cli import __version__

        typer.echo(f"euclip {__version__}")
        raise typer.Exit()


@app.callback()
def root(version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")) -> None:
    """Reproduce and extend the EuCLIP study (CLIP, elliptic, Euclidean, hyperbolic, product-sphere CLIP)."""


app.add_typer(recipes.app, name="recipes")
app.add_typer(download.app, name="download")
app.command(name="train")(train.train)
app.command(name="eval")(evaluate.eval_command)
app.command(name="import")(importing.import_command)
app.command(name="export")(export.export_command)
app.command(name="push")(export.push_command)
app.command(name="report")(report.report)
app.command(name="study")(study.study)
app.add_typer(analyze.app, name="analyze")
# The benchmarks live beside the product (euclip_bench, also ``euclip-bench``); this is their alias.
app.add_typer(bench_app, name="bench")


def main() -> None:
    """The command line, run by the entry point (``entry.euclip``) once SIGINT and SIGTERM can stop it."""
    run_app(app)
