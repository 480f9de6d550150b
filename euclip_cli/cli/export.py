"""``euclip export RUN DIR [--push OWNER/REPO]``: a run's model as safetensors, configs and a model card."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli.common import RUNS_DIR_OPTION, console, errors, writable_folder


def export_command(run: str = typer.Argument(..., help="A run directory or a name under --runs-dir."),
                   out: Path = typer.Argument(..., callback=writable_folder,
                                              help="The export folder to create (new, or empty)."),
                   push: Optional[str] = typer.Option(None, "--push", metavar="OWNER/REPO",
                                                      help="Then upload the folder to this new Hugging Face model "
                                                           "repository (a write token in HF_TOKEN or 'hf auth login')."),
                   public: bool = typer.Option(False, "--public", help="With --push: a public repository "
                                                                       "(default: private)."),
                   license_id: str = typer.Option("unknown", "--license",
                                                  help="The model card's licence (a Hub licence id, e.g. mit, "
                                                       "apache-2.0, cc-by-4.0)."),
                   runs_dir: Path = RUNS_DIR_OPTION) -> None:
    """Export a run's newest checkpoint: weights (safetensors), its geometry and config, a model card.

    Load it with euclip_cli.exported.load(DIR or hf://OWNER/REPO), as a run with 'euclip import euclip-export DIR --name NAME', or (CLIP geometry with final LayerNorms) with open_clip.create_model_and_transforms("local-dir:DIR").

    Examples:
      euclip export tiny-euclip exports/tiny-euclip
      euclip export results/runs/medium-euclip exports/medium-euclip --push me/medium-euclip --license mit
    """
    with errors():
        from euclip_cli.publish import export_run, hub_token, push as push_folder
        from euclip_cli.rundir import resolve

        found = resolve(run, runs_dir)
        if push:
            hub_token(push)  # a bad name or no token is said before the export is written
        with console.status(f"exporting {found.path}"):
            export_run(found, out, license_id)
        console.print(f"exported {found.path} to {out}", highlight=False)
        if push:
            with console.status(f"pushing {out} to {push}"):
                url = push_folder(out, push, private=not public)
            console.print(f"pushed to {url} ({'public' if public else 'private'}); load it with "
                          f"euclip_cli.exported.load('hf://{push}')", highlight=False)


def push_command(source: str = typer.Argument(..., help="An export folder (euclip export), or a run directory or "
                                                        "name, exported on the way."),
                 repo: str = typer.Argument(..., metavar="OWNER/REPO", help="A new Hugging Face model repository."),
                 public: bool = typer.Option(False, "--public", help="A public repository (default: private)."),
                 license_id: str = typer.Option("unknown", "--license",
                                                help="A run's model card licence (an export folder keeps its own)."),
                 runs_dir: Path = RUNS_DIR_OPTION) -> None:
    """Upload an export (or a run, exported on the way) to a new Hugging Face model repository, in one commit.

    A write token comes from HF_TOKEN or 'hf auth login'; it is sent to the Hub alone. A failed upload deletes the repository it created.

    Examples:
      euclip push exports/tiny-euclip me/tiny-euclip
      euclip push tiny-euclip me/tiny-euclip --public --license mit
    """
    with errors():
        import tempfile

        from euclip_cli import exported
        from euclip_cli.publish import export_run, hub_token, push
        from euclip_cli.rundir import resolve

        folder = Path(source)
        found = None if (folder / exported.CONFIG).is_file() else resolve(source, runs_dir)
        hub_token(repo)  # a bad name or no token is said before a run is exported
        with tempfile.TemporaryDirectory(prefix="euclip-push-") as scratch:
            if found is not None:
                with console.status(f"exporting {found.path}"):
                    folder = export_run(found, Path(scratch) / found.name, license_id)
            with console.status(f"pushing {source} to {repo}"):
                url = push(folder, repo, private=not public)
        console.print(f"pushed {source} to {url} ({'public' if public else 'private'}); load it with "
                      f"euclip_cli.exported.load('hf://{repo}')", highlight=False)
