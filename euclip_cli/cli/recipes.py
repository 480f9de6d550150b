"""``euclip recipes list | show NAME | validate [NAME|PATH ...]``."""

from __future__ import annotations

from typing import Optional

import typer

from euclip_cli.cli.common import console, errors, fail

app = typer.Typer(help="List, show and validate recipes (recipes/*.toml; study-*.toml are study recipes).",
                  no_args_is_help=True)


@app.command("list")
def list_() -> None:
    """One line per shipped recipe: its name and purpose."""
    from rich.table import Table

    from euclip_cli.config import list_recipes, recipe_header

    table = Table("recipe", "purpose", box=None, show_header=True)
    for name in list_recipes():
        first = recipe_header(name).splitlines()[0] if recipe_header(name) else ""
        table.add_row(name, first.split(":", 1)[-1].strip())
    console.print(table)


@app.command()
def show(name: str = typer.Argument(..., help="Recipe name or path."),
         resolved: bool = typer.Option(False, "--resolved", help="Print every key, defaults included, as JSON.")) -> None:
    """Print a recipe file, or with --resolved the full configuration it produces.

    Example: euclip recipes show tiny-euclip --resolved
    """
    from euclip_cli.config import dumps, is_study_recipe, load_config, recipe_path, recipe_text
    from euclip_cli.study.spec import load_study

    with errors():
        if is_study_recipe(name):
            study = load_study(name)
            text = recipe_text(recipe_path(name))
            if resolved:
                text = "\n".join(f"{c}: euclip train --recipe {study.configs[c].recipe} {' '.join(study.overrides(c, 0))}"
                                 for c in study.configs)
            console.print(text, highlight=False, markup=False)
            return
        cfg = load_config(name)
        console.print(dumps(cfg) if resolved else recipe_text(recipe_path(name)), highlight=False, markup=False)


@app.command()
def validate(names: Optional[list[str]] = typer.Argument(None, help="Recipe names or paths; default: every shipped recipe.")) -> None:
    """Check recipes against the schema; report every problem, exit 2 if any.

    Example: euclip recipes validate            (all shipped recipes)
    """
    from euclip_cli.config import ConfigError, is_study_recipe, list_recipes, load_config
    from euclip_cli.study.spec import load_study

    problems = []
    targets = names or list_recipes()
    for name in targets:
        try:
            load_study(name) if is_study_recipe(name) else load_config(name)
            console.print(f"[green]ok[/]  {name}")
        except ConfigError as err:
            problems += err.problems
    if problems:
        fail(problems, 2)
    console.print(f"{len(targets)} recipe(s) valid")
