"""``euclip analyze distances | isotropy RUN``: embedding studies of a run on the embedded world."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli.common import RUNS_DIR, console, errors, resolve_run

app = typer.Typer(help="Embedding analyses of a run (results in RUN/analysis/: JSON plus PNG/PDF figures).",
                  no_args_is_help=True)


def _collect(run: str, runs_dir: Path, world: Optional[Path], device: str):
    from euclip_cli.analysis.embeddings import collect
    from euclip_cli.train.loop import resolve_device

    run_dir = resolve_run(run, runs_dir)
    with console.status(f"embedding the world's evaluation images and captions with {run_dir.name}"):
        return run_dir, collect(run_dir, resolve_device(device), world)


def _write(run_dir: Path, name: str, result: dict) -> Path:
    out = run_dir / "analysis" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return out


@app.command()
def distances(run: str = typer.Argument(..., help="Run directory or name."),
              world: Optional[Path] = typer.Option(None, help="Embedded world folder (default: the one trained on)."),
              device: str = typer.Option("auto", help="cpu, cuda or auto."),
              runs_dir: Path = typer.Option(RUNS_DIR, help="Where run directories live.")) -> None:
    """[ROOT], ||[ROOT]||, distance histograms per modality and the modality gap.

    Example: euclip analyze distances tiny-meru
    """
    from euclip_cli.analysis.studies import distance_study
    from euclip_cli.report.figures import distance_histogram

    with errors():
        run_dir, emb = _collect(run, runs_dir, world, device)
        result = distance_study(emb)
    figures = distance_histogram(result, f"{run_dir.name} ({result['geometry']}, {result['logit']})",
                                 run_dir / "analysis" / "distances")
    out = _write(run_dir, "distances", result)
    for ref, d in result["references"].items():
        name = "[ROOT]" if ref == "root" else "the embedding average"
        console.print(f"||{name}|| = {d['norm']:.4f}; mean distance from it: image {d['image']['mean']:.4f}, "
                      f"text {d['text']['mean']:.4f}; P(a caption is closer than an image) = "
                      f"{d['auc_text_closer']:.3f}", highlight=False)
    console.print(f"written: {out}, {', '.join(str(f) for f in figures)}")


@app.command()
def isotropy(run: str = typer.Argument(..., help="Run directory or name."),
             k: int = typer.Option(0, help="Dimensions kept by whitening-k and PCA-k (0: half the embedding size)."),
             world: Optional[Path] = typer.Option(None, help="Embedded world folder (default: the one trained on)."),
             device: str = typer.Option("auto", help="cpu, cuda or auto."),
             runs_dir: Path = typer.Option(RUNS_DIR, help="Where run directories live.")) -> None:
    """I1/I2, singular spectra, whitening/PCA/Procrustes/least squares, separability, zero-shot after each.

    Example: euclip analyze isotropy tiny-clip --k 32
    """
    from rich.table import Table

    from euclip_cli.analysis.studies import isotropy_study
    from euclip_cli.report.figures import spectra_plot

    with errors():
        run_dir, emb = _collect(run, runs_dir, world, device)
        dim = emb.image.shape[1]
        if not 0 <= k <= dim:
            raise ValueError(f"--k {k}: must lie in [1, {dim}] (the embedding size), or 0 for {dim // 2}")
        result = isotropy_study(emb, k or dim // 2)
    figures = spectra_plot(result, f"{run_dir.name}: singular values", run_dir / "analysis" / "isotropy_spectra")
    out = _write(run_dir, "isotropy", result)
    table = Table(title=f"{run_dir.name}: isotropy on {result['pairs'] - result['fit_pairs']} held-out pairs "
                        f"(fitted on {result['fit_pairs']})")
    columns = {"I1_image": "I1 img", "I2_image": "I2 img", "I1_text": "I1 txt", "I2_text": "I2 txt",
               "pair_cosine": "pair cos", "separability": "separable", "zero_shot_shapes": "zero-shot"}
    table.add_column("transform")
    for label in columns.values():
        table.add_column(label, justify="right")
    for name, row in result["transforms"].items():
        table.add_row(name, *(f"{row[c]:.3f}" for c in columns))
    console.print(table)
    console.print(f"zero-shot shapes in the run's own geometry: {result['zero_shot_shapes_own_geometry']:.3f}")
    console.print(f"written: {out}, {', '.join(str(f) for f in figures)}")


@app.command()
def traverse(run: str = typer.Argument(..., help="Run directory or name."),
             images: int = typer.Option(100, min=1, help="Retrieval images of the embedded world to traverse."),
             steps: int = typer.Option(50, min=2, help="Points from the image to [ROOT]."),
             entail: Optional[str] = typer.Option(None, help="Comma-separated entailment radii K; each adds a "
                                                             "filtered traversal (Euclidean and hyperbolic runs)."),
             world: Optional[Path] = typer.Option(None, help="Embedded world folder (default: the one trained on)."),
             device: str = typer.Option("auto", help="cpu, cuda or auto."),
             runs_dir: Path = typer.Option(RUNS_DIR, help="Where run directories live.")) -> None:
    """Image traversals to [ROOT] over the embedded world's captions, scored against its hierarchy.

    Example: euclip analyze traverse tiny-meru --entail 0.1,0.3
    """
    from rich.table import Table

    from euclip_cli.analysis.studies import traversal_study
    from euclip_cli.data import world as W
    from euclip_cli.evaluate.runner import world_root
    from euclip_cli.train.loop import resolve_device

    with errors():
        ks: list[Optional[float]] = [None]
        for item in (entail or "").split(","):
            if item.strip():
                try:
                    ks.append(float(item))
                except ValueError:
                    raise ValueError(f"--entail: '{item}' is not a number (e.g. --entail 0.1,0.3)") from None
        from euclip_cli import config as C
        from euclip_cli.analysis.embeddings import collect

        run_dir = resolve_run(run, runs_dir)
        cfg = C.from_dict(json.loads((run_dir / "config.json").read_text()))
        if len(ks) > 1 and cfg.geometry.name not in ("euclidean", "hyperbolic"):
            raise ValueError(f"--entail: run {run_dir.name} has the {cfg.geometry.name} geometry, which has no "
                             f"entailment cones (only euclidean and hyperbolic)")
        world = world or world_root(cfg)
        specs = W.traversal_vocabulary()
        with console.status(f"embedding images, captions and {len(specs)} vocabulary captions"):
            emb = collect(run_dir, resolve_device(device), world, vocabulary=[W.caption_text(s) for s in specs])
        scenes = [W.scene_from_json(s) for s in json.loads((world / "eval" / "retrieval" / "scenes.json").read_text())]
        result = traversal_study(emb, specs, scenes, images, steps, ks)
    out = _write(run_dir, "traverse", result)
    table = Table(title=f"{run_dir.name}: traversals of {result['images']} images, {steps} steps, "
                        f"{result['vocabulary']} captions")
    for column in ("filter", "captions/image", "true of the image", "generic order", "ends generic"):
        table.add_column(column, justify="left" if column == "filter" else "right")
    for name, row in result["filters"].items():
        table.add_row(name, f"{row['captions_per_image']:.2f}", f"{row['precision']:.3f}",
                      f"{row['generic_order']:.3f}", f"{row['ends_generic']:.3f}")
    console.print(table)
    for name, row in result["filters"].items():
        for example in row["examples"][:3]:
            console.print(f"  [{name}] image {example['image']}: " + " → ".join(example["captions"]), highlight=False)
    for name, test in result.get("entailment_test", {}).items():
        console.print(f"entailment test {name}: precision {test['precision']:.3f}, recall {test['recall']:.3f} "
                      f"(cones contain {100 * test['predicted_share']:.1f}% of pairs; "
                      f"{100 * test['true_share']:.1f}% are true)", highlight=False)
    console.print(f"written: {out}")
