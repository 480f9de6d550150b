"""``euclip analyze distances | isotropy RUN``: embedding studies of a run on the embedded world."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from euclip_cli.analysis.protocol import protocol as pick_protocol
from euclip_cli.cli.common import console, errors, fail
from euclip_cli.errors import UsageError
from euclip_cli.geometry import describe
from euclip_cli.rundir import RUNS_DIR, RunDir, resolve

app = typer.Typer(help="Embedding analyses of a run (results in RUN/analysis/: JSON plus PNG/PDF figures).",
                  no_args_is_help=True)


def _collect(run: str, runs_dir: Path, world: Optional[Path], device: str, at_init: bool = False):
    from euclip_cli.analysis.embeddings import collect
    from euclip_cli.device import resolve_device

    run_dir = resolve(run, runs_dir).path
    with console.status(f"embedding the world's evaluation images and captions with {run_dir.name}"):
        return run_dir, collect(run_dir, resolve_device(device), world, at_init=at_init)


def _write(run_dir: Path, name: str, result: dict) -> Path:
    out = RunDir(run_dir).analysis_dir / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return out


PROTOCOL_HELP = ("paper: the published procedures ([ROOT] from training pairs and in the traversal pool, the "
                 "papers' distance axes and I1/I2 convention, per-modality whitening); euclip: euclip's "
                 "alternatives (docs/analyses.md tabulates both).")


@app.command()
def distances(run: str = typer.Argument(..., help="Run directory or name."),
              split: str = typer.Option("eval", help="eval: the world's retrieval pairs; train: the first "
                                                     "--samples pairs of the run's training shards."),
              samples: int = typer.Option(2000, min=2, help="Training pairs read with --split train."),
              protocol: str = typer.Option("paper", help=PROTOCOL_HELP),
              root_samples: int = typer.Option(5000, min=2, help="Training pairs averaged for [ROOT] and the "
                                                                 "embedding average (paper protocol)."),
              world: Optional[Path] = typer.Option(None, help="Embedded world folder (default: the one trained on)."),
              device: str = typer.Option("auto", help="cpu, cuda or auto."),
              at_init: bool = typer.Option(False, "--at-init", help="Measure the untrained model the run started "
                                                                    "from (its train.seed fixes it), a control for "
                                                                    "what training changed."),
              runs_dir: Path = typer.Option(RUNS_DIR, help="Where run directories live.")) -> None:
    """[ROOT], ||[ROOT]||, distance histograms per modality and the modality gap.

    Examples:
      euclip analyze distances tiny-meru
      euclip analyze distances tiny-meru --at-init
      euclip analyze distances tiny-clip --split train --samples 5000
      euclip analyze distances tiny-clip --protocol euclip
    """
    import torch

    from euclip_cli.analysis.embeddings import paper_root, training_pairs
    from euclip_cli.analysis.studies import distance_study
    from euclip_cli.device import resolve_device
    from euclip_cli.report.figures import distance_histogram

    if split not in ("eval", "train"):
        fail(f"--split '{split}' is not one of eval, train")
    with errors():
        chosen = pick_protocol(protocol)
        if split == "eval":
            run_dir, emb = _collect(run, runs_dir, world, device, at_init)
            geometry, curv, image, text = emb.geometry, emb.curv, emb.image, emb.text
        else:
            run_dir = resolve(run, runs_dir).path
            with console.status(f"embedding {samples} training pairs with {run_dir.name}"):
                geometry, curv, image, text, _ = training_pairs(run_dir, resolve_device(device), samples,
                                                                at_init=at_init)
        if chosen.root_from_training:
            with console.status(f"[ROOT]: embedding {root_samples} training pairs with {run_dir.name}"):
                root, reference = paper_root(run_dir, resolve_device(device), root_samples, at_init)
        else:
            reference = torch.cat([image, text])
            root = geometry.root(reference)
        result = distance_study(geometry, image, text, curv, chosen, root, reference)
        result["split"], result["at_init"] = split, at_init
        if chosen.root_from_training:
            result["root_pairs"] = len(reference) // 2  # fewer than asked when the shards hold fewer
    out = RunDir(run_dir).distances_file(split, at_init)
    state = "untrained, " if at_init else ""
    figures = distance_histogram(result, f"{run_dir.name} ({state}{result['geometry']}, {result['logit']}), {split} "
                                         f"pairs, {protocol} protocol", out.with_suffix(""))
    out = _write(run_dir, out.stem, result)
    console.print(f"protocol {protocol}: distances from [ROOT] are {result['scale']}", highlight=False)
    if "average_norm" in result:
        console.print(f"[ROOT] is the embedding average, norm {result['average_norm']:.4f} before "
                      f"{'normalising' if chosen.root_from_training else 'projecting'}", highlight=False)
    for ref, d in result["references"].items():
        name = "[ROOT]" if ref == "root" else "the embedding average"
        console.print(f"||{name}|| = {d['norm']:.4f}; mean distance from it: image {d['image']['mean']:.4f}, "
                      f"text {d['text']['mean']:.4f}; P(a caption is closer than an image) = "
                      f"{d['auc_text_closer']:.3f}", highlight=False)
    console.print(f"written: {out}, {', '.join(str(f) for f in figures)}")


@app.command()
def isotropy(run: str = typer.Argument(..., help="Run directory or name."),
             k: int = typer.Option(0, help="Dimensions kept by whitening-k and PCA-k (0: half the embedding size)."),
             protocol: str = typer.Option("paper", help=PROTOCOL_HELP),
             loss_batch: int = typer.Option(0, min=0, help="Pairs per batch of the CLIP-loss rows (0: 100, or "
                                                           "half the pairs when fewer)."),
             world: Optional[Path] = typer.Option(None, help="Embedded world folder (default: the one trained on)."),
             device: str = typer.Option("auto", help="cpu, cuda or auto."),
             runs_dir: Path = typer.Option(RUNS_DIR, help="Where run directories live.")) -> None:
    """I1/I2, singular spectra, centering/whitening/PCA/Procrustes/least squares, separability
    (logistic regression and linear SVC), CLIP loss and zero-shot after each transform.

    Example: euclip analyze isotropy tiny-clip --k 32
    """
    from rich.table import Table

    from euclip_cli.analysis.studies import isotropy_study
    from euclip_cli.report.figures import spectra_plot

    with errors():
        chosen = pick_protocol(protocol)
        run_dir, emb = _collect(run, runs_dir, world, device)
        dim = emb.image.shape[1]
        if not 0 <= k <= dim:
            raise UsageError(f"--k {k}: must lie in [1, {dim}] (the embedding size), or 0 for {dim // 2}")
        half = len(emb.image) // 2
        if loss_batch == 1 or loss_batch > half:
            raise UsageError(f"--loss-batch {loss_batch}: must lie in [2, {half}] so that each half of the "
                             f"{len(emb.image)} pairs fills a batch")
        loss_batch = loss_batch or min(100, half)
        result = isotropy_study(emb, k or dim // 2, chosen, loss_batch)
    figures = spectra_plot(result, f"{run_dir.name}: singular values", RunDir(run_dir).analysis_dir / "isotropy_spectra")
    out = _write(run_dir, "isotropy", result)
    table = Table(title=f"{run_dir.name}: isotropy on {result['pairs'] - result['fit_pairs']} held-out pairs "
                        f"(fitted on {result['fit_pairs']}; {protocol} protocol)")
    columns = {"I1_image": "I1 img", "I2_image": "I2 img", "I1_text": "I1 txt", "I2_text": "I2 txt",
               "pair_cosine": "pair cos", "separability": "sep. logistic", "separability_svc": "sep. SVC",
               "clip_loss_fit": "loss fit", "clip_loss_test": "loss test"}
    table.add_column("transform")
    for label in [*columns.values(), "shapes", "tasks mean"]:
        table.add_column(label, justify="right")
    for name, row in result["transforms"].items():
        table.add_row(name, *(f"{row[c]:.3f}" for c in columns), f"{row['zero_shot']['world/shapes']:.3f}",
                      f"{row['zero_shot_mean']:.3f}")
    console.print(table)
    own = result["zero_shot_own_geometry"]
    console.print(f"zero-shot in the run's own geometry: shapes {own['world/shapes']:.3f}, "
                  f"mean over {len(own)} tasks {sum(own.values()) / len(own):.3f}; CLIP loss at the run's scale "
                  f"{result['loss_scale']:.1f}, batches of {loss_batch}")
    console.print(f"written: {out}, {', '.join(str(f) for f in figures)}")


def _numbers(option: str, text: str, kind=float) -> list:
    try:
        values = [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise UsageError(f"{option}: '{text}' is not a comma-separated list of numbers") from None
    if not values:
        raise UsageError(f"{option}: give at least one value")
    return values


@app.command()
def equilibrium(run: str = typer.Argument(..., help="Run directory or name."),
                shuffle: str = typer.Option("0,5,10,20", help="Percentages of each batch's captions shuffled."),
                batch_sizes: str = typer.Option("128,512", help="Batch sizes (the paper compares several)."),
                temperatures: str = typer.Option("1,100,25", help="LOW,HIGH,POINTS: the log-spaced temperature grid."),
                batches: int = typer.Option(8, min=1, help="Random batches averaged per point."),
                samples: int = typer.Option(2048, min=2, help="Training pairs the batches are drawn from."),
                seed: int = typer.Option(0, help="Seed of the batches and the shuffles."),
                device: str = typer.Option("auto", help="cpu, cuda or auto."),
                runs_dir: Path = typer.Option(RUNS_DIR, help="Where run directories live.")) -> None:
    """The ratio of the alignment to the uniformity part of the contrastive loss against temperature,
    for training batches with P% of captions shuffled (Sun and Li, Figure 1); 1 is the equilibrium.

    Examples:
      euclip analyze equilibrium tiny-clip
      euclip analyze equilibrium tiny-multi --shuffle 0,10,40 --batch-sizes 64,128,256
    """
    from rich.table import Table

    from euclip_cli.analysis.embeddings import training_pairs
    from euclip_cli.analysis.equilibrium import equilibrium_study, temperature_grid
    from euclip_cli.device import resolve_device
    from euclip_cli.report.figures import equilibrium_plot

    with errors():
        percents = _numbers("--shuffle", shuffle)
        sizes = _numbers("--batch-sizes", batch_sizes, int)
        grid = _numbers("--temperatures", temperatures)
        if any(not 0 <= p <= 100 for p in percents):
            raise UsageError(f"--shuffle {shuffle}: percentages lie in [0, 100]")
        if any(b < 2 for b in sizes):
            raise UsageError(f"--batch-sizes {batch_sizes}: a contrastive batch needs at least 2 pairs")
        if len(grid) != 3 or not 0 < grid[0] < grid[1] or grid[2] < 2 or grid[2] != int(grid[2]):
            raise UsageError(f"--temperatures {temperatures}: expected LOW,HIGH,POINTS with 0 < LOW < HIGH "
                             f"and at least 2 points, e.g. 1,100,25")
        if max(sizes) > samples:
            raise UsageError(f"--batch-sizes {batch_sizes}: the largest batch exceeds --samples {samples}")
        run_dir = resolve(run, runs_dir).path
        with console.status(f"embedding {samples} training pairs with {run_dir.name}"):
            geometry, curv, image, text, learned = training_pairs(run_dir, resolve_device(device), samples)
        if len(image) < max(sizes):
            raise UsageError(f"{run_dir.name}'s training shards hold {len(image)} pairs, fewer than the largest "
                             f"batch {max(sizes)}: lower --batch-sizes")
        # The run's own temperature joins the grid, so the table reads the ratio exactly there.
        points = sorted({*temperature_grid(grid[0], grid[1], int(grid[2])), learned})
        result = equilibrium_study(geometry, image, text, curv, percents, sizes, points, batches, seed)
    result["learned_temperature"] = learned
    figures = equilibrium_plot(result, f"{run_dir.name} ({result['geometry']}, {result['logit']}): "
                                       f"equilibrium of the contrastive loss", RunDir(run_dir).analysis_dir / "equilibrium")
    out = _write(run_dir, "equilibrium", result)
    table = Table(title=f"{run_dir.name}: equilibrium over {batches} batches of its training pairs "
                        f"(learned temperature {learned:.2f})")
    for label in ("shuffled %", "batch", "equilibrium temperature", "ratio at the run's temperature"):
        table.add_column(label, justify="right")
    for curve in result["curves"]:
        at = next(p for p in curve["points"] if p["temperature"] == learned)
        eq = curve["equilibrium_temperature"]
        table.add_row(f"{curve['shuffle_percent']:g}", str(curve["batch_size"]),
                      "above the grid" if eq is None else f"{eq:.2f}", f"{at['ratio']:.3f}")
    console.print(table)
    console.print(f"written: {out}, {', '.join(str(f) for f in figures)}")


@app.command()
def traverse(run: str = typer.Argument(..., help="Run directory or name."),
             images: int = typer.Option(100, min=1, help="Retrieval images of the embedded world to traverse."),
             steps: int = typer.Option(50, min=2, help="Points from the image to [ROOT]."),
             entail: Optional[str] = typer.Option(None, help="Comma-separated entailment radii K; each adds a "
                                                             "filtered traversal (Euclidean and hyperbolic runs)."),
             protocol: str = typer.Option("paper", help=PROTOCOL_HELP),
             root_samples: int = typer.Option(5000, min=2, help="Training pairs averaged for CLIP's [ROOT] "
                                                                "(paper protocol, mean-rooted geometries)."),
             image_dir: Optional[Path] = typer.Option(None, help="Traverse these images instead of the world's "
                                                                  "(with --text-pool or --captions/--nouns/--adjectives)."),
             text_pool: Optional[Path] = typer.Option(None, help="MERU's text pool: one JSON file with 'captions' "
                                                                  "(verbatim), 'nouns' and 'adjectives'."),
             captions: Optional[Path] = typer.Option(None, help="Raw captions, one per line, used verbatim."),
             nouns: Optional[Path] = typer.Option(None, help="One noun per line, captioned 'a photo of a {}.' (MERU)."),
             adjectives: Optional[Path] = typer.Option(None, help="One adjective per line, 'this photo is {}.'"),
             world: Optional[Path] = typer.Option(None, help="Embedded world folder (default: the one trained on)."),
             device: str = typer.Option("auto", help="cpu, cuda or auto."),
             runs_dir: Path = typer.Option(RUNS_DIR, help="Where run directories live.")) -> None:
    """Image traversals to [ROOT]: over the embedded world's captions, scored against its hierarchy,
    or over your own images and MERU's text pool (the papers' Tables 6 and 7).

    Examples:
      euclip analyze traverse tiny-meru --entail 0.1,0.3
      euclip analyze traverse tiny-meru --image-dir pexels/ --text-pool pexels_text.json --entail 0.1
    """
    from rich.table import Table

    from euclip_cli.analysis.studies import traversal_study
    from euclip_cli.data import world as W
    from euclip_cli.device import resolve_device

    with errors():
        chosen = pick_protocol(protocol)
        ks: list[Optional[float]] = [None]
        for item in (entail or "").split(","):
            if item.strip():
                try:
                    ks.append(float(item))
                except ValueError:
                    raise UsageError(f"--entail: '{item}' is not a number (e.g. --entail 0.1,0.3)") from None
        from euclip_cli import config as C
        from euclip_cli.analysis.embeddings import collect

        run_dir = resolve(run, runs_dir).path
        cfg = C.from_dict(RunDir(run_dir).config())
        facts = describe(cfg.geometry.name)
        if len(ks) > 1 and not facts.has_entailment:
            raise UsageError(f"--entail: run {run_dir.name} has the {cfg.geometry.name} geometry, which has no "
                             f"entailment cones")
        if image_dir is None and any(p is not None for p in (text_pool, captions, nouns, adjectives)):
            raise UsageError("--text-pool, --captions, --nouns and --adjectives go with --image-dir")
        if image_dir is not None:
            from euclip_cli.analysis.traverse import text_pool as read_pool

            if not image_dir.is_dir():
                raise UsageError(f"--image-dir {image_dir} is not a folder")
            pool = read_pool(text_pool, captions, nouns, adjectives)  # checked before any embedding is computed
        root, root_pairs = None, None
        if chosen.root_from_training and facts.root == "mean":
            from euclip_cli.analysis.embeddings import paper_root

            with console.status(f"[ROOT]: embedding {root_samples} training pairs with {run_dir.name}"):
                root, reference = paper_root(run_dir, resolve_device(device), root_samples)
            root_pairs = len(reference) // 2
        if image_dir is not None:
            _folder_traversal(run_dir, image_dir, pool, steps, ks, chosen, root, root_pairs, device)
            return
        world = world or C.world_dir(cfg)
        specs = W.traversal_vocabulary()
        with console.status(f"embedding images, captions and {len(specs)} vocabulary captions"):
            emb = collect(run_dir, resolve_device(device), world, vocabulary=[W.caption_text(s) for s in specs])
        if root is None:
            import torch

            root = emb.geometry.root(torch.cat([emb.image, emb.text]))
        scenes = [W.scene_from_json(s) for s in json.loads((world / "eval" / "retrieval" / "scenes.json").read_text())]
        result = traversal_study(emb, specs, scenes, images, steps, ks, chosen, root)
        result["root_pairs"] = root_pairs
    out = _write(run_dir, "traverse", result)
    table = Table(title=f"{run_dir.name}: traversals of {result['images']} images, {steps} steps, "
                        f"{result['vocabulary']} captions ({protocol} protocol)")
    for column in ("filter", "captions/image", "none but [ROOT]", "true of the image", "generic order",
                   "ends generic"):
        table.add_column(column, justify="left" if column == "filter" else "right")
    for name, row in result["filters"].items():
        table.add_row(name, f"{row['captions_per_image']:.2f}", f"{row['no_caption']:.3f}", f"{row['precision']:.3f}",
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


def _folder_traversal(run_dir: Path, image_dir: Path, captions: list[str], steps: int, ks: list, chosen, root,
                      root_pairs, device: str) -> None:
    """Traversals of a folder of images over MERU's text pool (no ground truth to score)."""
    import torch

    from euclip_cli.analysis.embeddings import folder_embeddings
    from euclip_cli.analysis.studies import folder_traversal_study
    from euclip_cli.device import resolve_device

    with console.status(f"embedding the images in {image_dir} and {len(captions)} captions"):
        g, curv, names, images, texts = folder_embeddings(run_dir, resolve_device(device), image_dir, captions)
    if root is None:
        root = g.root(torch.cat([images, texts]))
    result = folder_traversal_study(g, curv, names, images, captions, texts, root, steps, ks, chosen)
    result.update(image_dir=str(image_dir), root_pairs=root_pairs)
    for name, row in result["filters"].items():
        console.print(f"[bold]{name}[/]: {row['captions_per_image']:.2f} captions per image, [ROOT] excluded "
                      f"({chosen.name} protocol)")
        for n, seq in row["traversals"].items():
            console.print(f"  {n}: " + " → ".join(seq), highlight=False)
    out = _write(run_dir, "traverse_custom", result)
    console.print(f"written: {out}")
