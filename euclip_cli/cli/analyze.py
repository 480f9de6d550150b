"""``euclip analyze distances | isotropy RUN``: embedding studies of a run on the embedded world."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from euclip_cli.analysis.protocol import protocol as pick_protocol
from euclip_cli.cli.common import (RUNS_DIR_OPTION, WORLD_OPTION, checked_path, console, errors, fail,
                                  writable_folder)
from euclip_cli.errors import UsageError

app = typer.Typer(help="Embedding analyses of a run (results in RUN/analysis/: JSON plus PNG/PDF figures).",
                  no_args_is_help=True)


def _status(text: str):
    return console.status(text)


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
              world: Optional[Path] = WORLD_OPTION,
              device: str = typer.Option("auto", help="cpu, cuda or auto."),
              at_init: bool = typer.Option(False, "--at-init", help="Measure the untrained model the run started "
                                                                    "from (its train.seed fixes it), a control for "
                                                                    "what training changed."),
              with_init: bool = typer.Option(False, "--with-init", help="Measure the trained model and then, as "
                                                                        "--at-init does, the untrained one: both "
                                                                        "results in one command."),
              runs_dir: Path = RUNS_DIR_OPTION) -> None:
    """[ROOT], ||[ROOT]||, distance histograms per modality and the modality gap.

    Examples:
      euclip analyze distances tiny-meru
      euclip analyze distances tiny-meru --at-init
      euclip analyze distances tiny-meru --with-init
      euclip analyze distances tiny-clip --split train --samples 5000
      euclip analyze distances tiny-clip --protocol euclip
    """
    from euclip_cli.analysis import runner
    from euclip_cli.figures import distance_histogram

    if at_init and with_init:
        fail("--at-init and --with-init: give one (--with-init measures the untrained model too)")
    for untrained in ((False, True) if with_init else (at_init,)):
        with errors():
            found = runner.distances(run, device, split, samples, protocol, root_samples, world, untrained,
                                      runs_dir, _status)
        result, out, state = found.result, found.path, "untrained, " if untrained else ""
        figures = distance_histogram(result, f"{found.run_dir.name} ({state}{result['geometry']}, {result['logit']}), "
                                             f"{split} pairs, {protocol} protocol", out.with_suffix(""))
        if with_init:
            console.print("untrained, as the run started:" if untrained else "trained:", highlight=False)
        console.print(f"protocol {protocol}: distances from [ROOT] are {result['scale']}", highlight=False)
        if "average_norm" in result:
            console.print(f"[ROOT] is the embedding average, norm {result['average_norm']:.4f} before "
                          f"{'normalising' if pick_protocol(protocol).root_from_training else 'projecting'}",
                          highlight=False)
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
             world: Optional[Path] = WORLD_OPTION,
             device: str = typer.Option("auto", help="cpu, cuda or auto."),
             runs_dir: Path = RUNS_DIR_OPTION) -> None:
    """I1/I2, singular spectra, centering/whitening/PCA/Procrustes/least squares, separability
    (logistic regression and linear SVC), CLIP loss and zero-shot after each transform.

    Example: euclip analyze isotropy tiny-clip --k 32
    """
    from rich.table import Table

    from euclip_cli.analysis import runner
    from euclip_cli.figures import spectra_plot

    with errors():
        found = runner.isotropy(run, device, k, protocol, loss_batch, world, runs_dir, _status)
    result, out, run_dir = found.result, found.path, found.run_dir
    figures = spectra_plot(result, f"{run_dir.name}: singular values", out.parent / "isotropy_spectra")
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
                  f"{result['loss_scale']:.1f}, batches of {result['loss_batch']}")
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
                runs_dir: Path = RUNS_DIR_OPTION) -> None:
    """The ratio of the alignment to the uniformity part of the contrastive loss against temperature,
    for training batches with P% of captions shuffled (Sun and Li, Figure 1); 1 is the equilibrium.

    Examples:
      euclip analyze equilibrium tiny-clip
      euclip analyze equilibrium tiny-multi --shuffle 0,10,40 --batch-sizes 64,128,256
    """
    from rich.table import Table

    from euclip_cli.analysis import runner
    from euclip_cli.figures import equilibrium_plot

    with errors():
        found = runner.equilibrium(run, _numbers("--shuffle", shuffle), _numbers("--batch-sizes", batch_sizes, int),
                                   _numbers("--temperatures", temperatures), batches, samples, seed, device, runs_dir,
                                   _status)
    result, out, run_dir = found.result, found.path, found.run_dir
    learned = result["learned_temperature"]
    figures = equilibrium_plot(result, f"{run_dir.name} ({result['geometry']}, {result['logit']}): "
                                       f"equilibrium of the contrastive loss", out.parent / "equilibrium")
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
             image_dir: Optional[Path] = typer.Option(None, callback=checked_path,
                                                      help="Traverse these images instead of the world's "
                                                           "(with --text-pool or --captions/--nouns/--adjectives)."),
             text_pool: Optional[Path] = typer.Option(None, callback=checked_path,
                                                      help="MERU's text pool: one JSON file with 'captions' "
                                                           "(verbatim), 'nouns' and 'adjectives'."),
             captions: Optional[Path] = typer.Option(None, callback=checked_path,
                                                     help="Raw captions, one per line, used verbatim."),
             nouns: Optional[Path] = typer.Option(None, callback=checked_path,
                                                  help="One noun per line, captioned 'a photo of a {}.' (MERU)."),
             adjectives: Optional[Path] = typer.Option(None, callback=checked_path,
                                                       help="One adjective per line, 'this photo is {}.'"),
             world: Optional[Path] = WORLD_OPTION,
             device: str = typer.Option("auto", help="cpu, cuda or auto."),
             runs_dir: Path = RUNS_DIR_OPTION) -> None:
    """Image traversals to [ROOT]: over the embedded world's captions, scored against its hierarchy,
    or over your own images and MERU's text pool (the papers' Tables 6 and 7).

    Examples:
      euclip analyze traverse tiny-meru --entail 0.1,0.3
      euclip analyze traverse tiny-meru --image-dir pexels/ --text-pool pexels_text.json --entail 0.1
    """
    from rich.table import Table

    from euclip_cli.analysis import runner

    with errors():
        ks: list[Optional[float]] = [None, *_numbers("--entail", entail)] if entail else [None]
        if image_dir is None and any(p is not None for p in (text_pool, captions, nouns, adjectives)):
            raise UsageError("--text-pool, --captions, --nouns and --adjectives go with --image-dir")
        if image_dir is not None:
            from euclip_cli.analysis.traverse import text_pool as read_pool

            pool = read_pool(text_pool, captions, nouns, adjectives)  # checked before any embedding is computed
            found = runner.traverse_folder(run, image_dir, pool, device, steps, tuple(ks), protocol,
                                           root_samples, runs_dir, _status)
            for name, row in found.result["filters"].items():
                console.print(f"[bold]{name}[/]: {row['captions_per_image']:.2f} captions per image, [ROOT] "
                              f"excluded ({protocol} protocol)")
                for n, seq in row["traversals"].items():
                    console.print(f"  {n}: " + " → ".join(seq), highlight=False)
            console.print(f"written: {found.path}")
            return
        found = runner.traverse(run, device, images, steps, tuple(ks), protocol, root_samples, world, runs_dir,
                                _status)
    result, out, run_dir = found.result, found.path, found.run_dir
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


# The WordNet both ImageNet hierarchy commands read, declared once.
WORDNET_OPTION = typer.Option(None, callback=checked_path, help="nltk_data folder holding WordNet (euclip download "
                                                               "wordnet; default: data/nltk_data).")


@app.command()
def hierarchy(run: str = typer.Argument(..., help="Run directory or name."),
              tree: str = typer.Option("world", help="world: the embedded world's class tree; wordnet: ImageNet's "
                                                     "classes in a tree of HyCoCLIP's shape (its own with --isa, "
                                                     "else WordNet pruned); wordnet-graph: WordNet's whole graph."),
              convention: str = typer.Option("hycoclip", help="hycoclip: a class's ancestor set excludes the "
                                                              "class (HyCoCLIP's code); inclusive: it holds it."),
              isa: Optional[Path] = typer.Option(None, callback=checked_path,
                                                 help="--tree wordnet: HyCoCLIP's imagenet_isa.txt (a 'PARENT "
                                                      "CHILD' line per edge) to score in, instead of WordNet pruned."),
              world: Optional[Path] = WORLD_OPTION,
              eval_root: Optional[Path] = typer.Option(None, callback=checked_path,
                                                       help="--tree wordnet: the ImageNet evaluation sets "
                                                            "(default: the run's eval.root)."),
              wordnet: Optional[Path] = WORDNET_OPTION,
              device: str = typer.Option("auto", help="cpu, cuda or auto."),
              runs_dir: Path = RUNS_DIR_OPTION) -> None:
    """How the run keeps a class hierarchy: HyCoCLIP's tree-induced error, LCA error, Jaccard similarity
    and hierarchical precision and recall of its zero-shot predictions, in its own geometry, and the tree
    distance of its mistakes beside uniform mistakes on the same images. On the world's tree (the default)
    also entailment as a score (ROC AUC, average precision) of family captions over images and shape
    captions; with --tree wordnet, on ImageNet's classes, each task in a tree over its own classes.

    Examples:
      euclip analyze hierarchy tiny-meru
      euclip analyze hierarchy medium-meru --tree wordnet
      euclip analyze hierarchy medium-meru --tree wordnet --isa hycoclip/assets/imagenet_synset/imagenet_isa.txt
    """
    from rich.table import Table

    from euclip_cli.analysis import runner
    from euclip_cli.evaluate.hierarchy import check_tree
    from euclip_cli.hierarchy import CONVENTIONS

    if convention not in CONVENTIONS:
        fail(f"unknown --convention '{convention}': choose one of {', '.join(CONVENTIONS)}", 2)
    with errors():
        check_tree(tree, isa)
        if tree != "world":
            from euclip_cli.evaluate.hierarchy import wordnet_hierarchy

            result, path, run_dir = wordnet_hierarchy(run, device, eval_root, wordnet, runs_dir, _status, tree, isa,
                                                      convention)
        else:
            found = runner.hierarchy(run, device, world, runs_dir, _status, convention)
            result, path, run_dir = found.result, found.path, found.run_dir
    where = {"world": "the world's class tree", "wordnet": "a tree of ImageNet's classes",
             "wordnet-graph": "WordNet's graph of ImageNet's classes"}[tree]
    table = Table(title=f"{run_dir.name} ({result['geometry']}, {result['logit']}): its mistakes in {where} "
                        f"({convention}'s ancestor sets)")
    columns = ("accuracy", "tie", "lca_error", "jaccard", "h_precision", "h_recall")
    table.add_column("task", no_wrap=True)
    for column in (*columns, "mistake tie", "random mistake"):
        table.add_column(column.replace("_", " "), justify="right")
    for key, row in result["tasks"].items():
        severity = [f"{row[c]:.3f}" if row[c] is not None else "–" for c in ("mistake_tie", "random_mistake_tie")]
        table.add_row(key, *(f"{row[c]:.3f}" for c in columns), *severity)
        table.add_row("  guessing", *(f"{result['chance'][key][c]:.3f}" for c in columns), "", "", style="dim")
    console.print(table)
    if tree != "world":
        console.print(f"written: {path}")
        return
    scored = Table(title="family captions against the Shapes images and the shape captions: is the pair related?")
    for column in ("pairs", "score", "ROC AUC", "average precision", "related / all"):
        scored.add_column(column, justify="left" if column in ("pairs", "score") else "right")
    for pairs in ("text-image", "text-text"):
        for score, row in result["entailment"][pairs].items():
            scored.add_row(pairs, score, f"{row['roc_auc']:.3f}", f"{row['average_precision']:.3f}",
                           f"{row['positives']} / {row['pairs']}")
    console.print(scored)
    order = result["order"]
    ordered = Table(title=f"the {order['pairs']} (generic, specific) pairs of the world's captions at every level "
                          f"against the same pairs reversed: is the order told?")
    for column in ("score", "ROC AUC"):
        ordered.add_column(column, justify="left" if column == "score" else "right")
    for score in ("root_order", "cone"):
        if score in order:
            ordered.add_row(score.replace("_", " "), f"{order[score]['roc_auc']:.3f}")
    console.print(ordered)
    console.print(f"written: {path}")


@app.command("imagenet-tree")
def imagenet_tree(out: Path = typer.Option(Path("results") / "imagenet-tree", callback=writable_folder,
                                           help="Folder to write imagenet-tree.txt ('PARENT CHILD' wnids per line) "
                                                "and, with --against, comparison.json to."),
                  against: Optional[Path] = typer.Option(None, callback=checked_path,
                                                         help="HyCoCLIP's imagenet_isa.txt: measure how far the "
                                                              "pruned tree is from it."),
                  wordnet: Optional[Path] = WORDNET_OPTION) -> None:
    """The tree of ImageNet's 1,000 classes that 'analyze hierarchy --tree wordnet' scores in when no --isa
    is given: WordNet's hypernyms pruned to the shape of HyCoCLIP's tree. With --against, how far it is
    from HyCoCLIP's own.

    Example:
      euclip analyze imagenet-tree --against hycoclip/assets/imagenet_synset/imagenet_isa.txt
    """
    from rich.table import Table

    from euclip_cli.evaluate.hierarchy import COMPARISON_FILE, TREE_FILE
    from euclip_cli.evaluate.hierarchy import imagenet_tree as build

    with errors():
        result = build(out, wordnet, against)
    console.print(f"{result['classes']} classes, {result['nodes']} nodes, root {result['root']} "
                  f"(WordNet's graph above them: {result['graph_nodes']} nodes, "
                  f"{result['graph_nodes_with_two_parents']} with two parents)")
    written = [out / TREE_FILE]
    if against is not None:
        c = result["comparison"]
        table = Table(title=f"the pruned tree against {against}")
        table.add_column("measure")
        table.add_column("value", justify="right")
        rows = [("nodes (pruned / theirs / both)", f"{c['nodes']} / {c['nodes_against']} / {c['shared_nodes']}"),
                ("nodes in both with the same parent", str(c["same_parent"])),
                ("classes with the same ancestors (below the root)", f"{c['same_ancestors_below_root']} / {c['leaves']}"),
                ("class pairs at an equal TIE", f"{c['equal_tie']:.3f}"),
                ("TIE correlation over class pairs", f"{c['tie_correlation']:.3f}"),
                ("  the same, WordNet's whole graph", f"{result['graph_comparison']['tie_correlation']:.3f}"),
                ("mean TIE (pruned / theirs)", f"{c['mean_tie']:.2f} / {c['mean_tie_against']:.2f}")]
        for row in rows:
            table.add_row(*row)
        console.print(table)
        written.append(out / COMPARISON_FILE)
    console.print(f"written: {', '.join(map(str, written))}")
