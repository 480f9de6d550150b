"""``euclip import FORMAT SOURCE --name RUN``: a released checkpoint as an ordinary run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli.common import NEW_RUNS_DIR_OPTION, console, errors


def import_command(fmt: str = typer.Argument(..., metavar="FORMAT", help="openclip, euclip-authors, meru, hycoclip or euclip-export."),
                   source: str = typer.Argument(..., help="openclip: ARCH:TAG; euclip-authors, meru, hycoclip: a "
                                                          "checkpoint file or hf://OWNER/REPO/PATH (hycoclip: under "
                                                          "its released name); euclip-export: an export "
                                                          "folder or hf://OWNER/REPO[@REVISION]."),
                   name: str = typer.Option(..., help="The run directory to create under --runs-dir."),
                   geometry: Optional[str] = typer.Option(None, help="euclip-authors without params.txt: the "
                                                                     "geometry (clip, elliptic, euclidean, hyperbolic)."),
                   logit: Optional[str] = typer.Option(None, help="With --geometry: its logit (e.g. d or d2)."),
                   arch: Optional[str] = typer.Option(None, help="euclip-authors without params.txt: the model, "
                                                                 "e.g. ViT-B-16 or ViT-B-16-no-final-ln; meru, hycoclip: "
                                                                 "meru-vit-s|b|l (default: from the ViT's width)."),
                   runs_dir: Path = NEW_RUNS_DIR_OPTION) -> None:
    """Turn a released checkpoint into a run that eval, analyze and report take unchanged.

    Examples:
      euclip import euclip-authors logs/euclip/checkpoints/epoch_32.pt --name authors-euclip
      euclip import euclip-authors hf://OWNER/REPO/epoch_32.pt --name authors-meru --geometry hyperbolic --logit d --arch ViT-B-16
      euclip import meru meru_vit_b.pth --name meru-vit-b
      euclip import hycoclip hf://avik-pal/hycoclip/hycoclip_vit_s.pth --name hycoclip-vit-s
      euclip import openclip ViT-B-32:datacomp_m_s128m_b4k --name datacomp-m-clip
      euclip import euclip-export hf://OWNER/REPO --name their-euclip
    """
    with errors():
        from euclip_cli.released import import_run

        with console.status(f"importing {source} ({fmt})"):
            run = import_run(fmt, source, name, runs_dir, geometry, logit, arch)
        config = run.config()
    g = config["geometry"]
    console.print(f"imported {source} as {run.path}: {config['model']['arch']}"
                  f"{'' if config['model']['final_ln'] else ' without final LN'}, {g['name']} ({g['logit']}); "
                  f"next: euclip eval {run.path}", highlight=False)
