"""The ``euclip`` command line: ``download | train | eval | import | export | push | study | report | analyze | recipes | bench``.

Each command lives in its own module and imports torch, open_clip and friends inside
the command body, so ``euclip --help`` answers at once.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer
from typer.core import TyperGroup

# typer 0.29 (pinned) vendors click and does not re-export its exception base classes.
from typer._click.exceptions import ClickException, NoArgsIsHelpError

from euclip_cli.cli import analyze, bench, download, evaluate, export, importing, recipes, report, study, train


class OneLineErrors(TyperGroup):
    """Click's own errors (a value outside an option's range, a missing option, an unknown command)
    in euclip's form: one ``error:`` line naming the option and where to look, with Click's exit
    code (2 for usage), where Click would draw a box under the usage text."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        from rich.markup import escape

        from euclip_cli.cli.common import environment_fault, err_console, one_line

        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except NoArgsIsHelpError as err:  # the help is already printed, as Typer does
            sys.exit(err.exit_code)
        except ClickException as err:
            ctx = getattr(err, "ctx", None)
            where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            err_console.print(f"[bold red]error:[/] {escape(' '.join(err.format_message().split()))}{where}",
                              highlight=False, soft_wrap=True)
            sys.exit(err.exit_code)
        except typer.Abort:
            err_console.print("[bold red]error:[/] interrupted", highlight=False)
            sys.exit(1)
        except (OSError, RuntimeError) as err:
            # What a command's own error funnel (common.errors) would say of a fault of the machine,
            # for one raised before the command reached it (a library's import out of open files).
            fault = environment_fault(err)
            if fault is None:
                raise
            err_console.print(f"[bold red]error:[/] {escape(one_line(fault[0]))}", highlight=False, soft_wrap=True)
            sys.exit(fault[1])
        # A command's own return value is not an exit code; Exit(n) arrives here as the int n.
        sys.exit(code if isinstance(code, int) else 0)


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
app.add_typer(bench.app, name="bench")


def main() -> None:
    import warnings

    from euclip_cli.cli.common import show_warning

    warnings.showwarning = show_warning
    # clip-benchmark 1.6.2 builds its WebDatasets without ``shardshuffle``; the warning is about
    # its code, says nothing to a user, and the evaluation order it implies (none) is what we want.
    warnings.filterwarnings("ignore", message=r"WebDataset\(shardshuffle=\.\.\.\) is None")
    app()
