"""The analyses of one run as a notebook calls them (``euclip analyze`` wraps each): every function
checks its arguments, then finds the run (a path, or a name under ``runs_dir``), embeds what it
needs on ``device`` (``cpu``, ``cuda``, ``auto``), computes, writes ``RUN/analysis/NAME.json`` and
returns an ``Analysis``.
Figures are the report's (``euclip_cli.figures``); the commands draw them from the result.

``status(text)`` is a context manager the caller may pass to show what is being embedded (the
commands show a spinner); by default nothing is shown.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Optional, Union

import torch

from euclip_cli import config as C
from euclip_cli.analysis.protocol import protocol as pick_protocol
from euclip_cli.device import resolve_device
from euclip_cli.errors import UsageError
from euclip_cli.geometry import describe
from euclip_cli.hierarchy import DEFAULT_CONVENTION
from euclip_cli.rundir import RUNS_DIR, RunDir, read_json, resolve
from euclip_cli.worlddir import WorldDir

Status = Callable[[str], ContextManager]
Run = Union[str, Path]


@dataclass(frozen=True)
class Analysis:
    """What an analysis of a run found (``result``, as written to ``path``)."""

    result: dict
    path: Path
    run_dir: Path


def _quiet(text: str) -> ContextManager:
    return contextlib.nullcontext()


def write_result(run_dir: Path, name: str, result: dict) -> Path:
    """``result`` as ``RUN/analysis/NAME.json``."""
    out = RunDir(run_dir).analysis_dir / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return out


def _world_embeddings(run_dir: Path, device: torch.device, world: Optional[Path], at_init: bool, status: Status):
    from euclip_cli.analysis.embeddings import collect

    with status(f"embedding the world's evaluation images and captions with {run_dir.name}"):
        return collect(run_dir, device, world, at_init=at_init)


def _paper_root(run_dir: Path, device: torch.device, samples: int, at_init: bool, status: Status):
    from euclip_cli.analysis.embeddings import paper_root

    with status(f"[ROOT]: embedding {samples} training pairs with {run_dir.name}"):
        return paper_root(run_dir, device, samples, at_init)


def distances(run: Run, device: str = "auto", split: str = "eval", samples: int = 2000, protocol: str = "paper",
              root_samples: int = 5000, world: Optional[Path] = None, at_init: bool = False,
              runs_dir: Path = RUNS_DIR, status: Status = _quiet) -> Analysis:
    """[ROOT], its norm, distance histograms per modality and the modality gap, on the world's retrieval
    pairs (``split="eval"``) or the first ``samples`` training pairs; ``at_init``: of the untrained model."""
    from euclip_cli.analysis.embeddings import training_pairs
    from euclip_cli.analysis.studies import distance_study

    if split not in ("eval", "train"):
        raise UsageError(f"--split '{split}' is not one of eval, train")
    chosen = pick_protocol(protocol)
    run_dir, device = resolve(run, runs_dir).path, resolve_device(device)
    if split == "eval":
        emb = _world_embeddings(run_dir, device, world, at_init, status)
        geometry, curv, image, text = emb.geometry, emb.curv, emb.image, emb.text
    else:
        with status(f"embedding {samples} training pairs with {run_dir.name}"):
            geometry, curv, image, text, _ = training_pairs(run_dir, device, samples, at_init=at_init)
    if chosen.root_from_training:
        root, reference = _paper_root(run_dir, device, root_samples, at_init, status)
    else:
        reference = torch.cat([image, text])
        root = geometry.root(reference)
    result = distance_study(geometry, image, text, curv, chosen, root, reference)
    result.update(split=split, at_init=at_init)
    if chosen.root_from_training:
        result["root_pairs"] = len(reference) // 2  # fewer than asked when the shards hold fewer
    return Analysis(result, write_result(run_dir, RunDir(run_dir).distances_file(split, at_init).stem, result), run_dir)


def isotropy(run: Run, device: str = "auto", k: int = 0, protocol: str = "paper", loss_batch: int = 0,
             world: Optional[Path] = None, runs_dir: Path = RUNS_DIR, status: Status = _quiet) -> Analysis:
    """I1/I2, spectra, the transforms and what each does to separability, the CLIP loss and zero-shot.
    ``k``: dimensions kept by whitening-k and PCA-k (0: half the embedding size); ``loss_batch``: pairs
    per batch of the CLIP-loss rows (0: 100, or half the pairs when fewer)."""
    from euclip_cli.analysis.studies import isotropy_study

    chosen = pick_protocol(protocol)
    run_dir, device = resolve(run, runs_dir).path, resolve_device(device)
    emb = _world_embeddings(run_dir, device, world, False, status)
    dim = emb.image.shape[1]
    if not 0 <= k <= dim:
        raise UsageError(f"--k {k}: must lie in [1, {dim}] (the embedding size), or 0 for {dim // 2}")
    half = len(emb.image) // 2
    if loss_batch == 1 or loss_batch > half:
        raise UsageError(f"--loss-batch {loss_batch}: must lie in [2, {half}] so that each half of the "
                         f"{len(emb.image)} pairs fills a batch")
    loss_batch = loss_batch or min(100, half)
    result = isotropy_study(emb, k or dim // 2, chosen, loss_batch)
    result["loss_batch"] = loss_batch
    return Analysis(result, write_result(run_dir, "isotropy", result), run_dir)


def equilibrium(run: Run, percents: tuple[float, ...] = (0, 5, 10, 20), sizes: tuple[int, ...] = (128, 512),
                grid: tuple[float, ...] = (1, 100, 25), batches: int = 8, samples: int = 2048, seed: int = 0,
                device: str = "auto", runs_dir: Path = RUNS_DIR, status: Status = _quiet) -> Analysis:
    """The alignment-to-uniformity ratio of the loss against temperature for training batches of
    ``sizes`` with ``percents`` of their captions shuffled (Sun and Li, Figure 1). ``grid``: LOW, HIGH,
    POINTS of the log-spaced temperatures, to which the run's learned temperature is added."""
    from euclip_cli.analysis.embeddings import training_pairs
    from euclip_cli.analysis.equilibrium import equilibrium_study, temperature_grid

    if any(not 0 <= p <= 100 for p in percents):
        raise UsageError(f"--shuffle {','.join(f'{p:g}' for p in percents)}: percentages lie in [0, 100]")
    if any(b < 2 for b in sizes):
        raise UsageError(f"--batch-sizes {','.join(map(str, sizes))}: a contrastive batch needs at least 2 pairs")
    if len(grid) != 3 or not 0 < grid[0] < grid[1] or grid[2] < 2 or grid[2] != int(grid[2]):
        raise UsageError(f"--temperatures {','.join(f'{g:g}' for g in grid)}: expected LOW,HIGH,POINTS with "
                         f"0 < LOW < HIGH and at least 2 points, e.g. 1,100,25")
    if max(sizes) > samples:
        raise UsageError(f"--batch-sizes {','.join(map(str, sizes))}: the largest batch exceeds --samples {samples}")
    run_dir, device = resolve(run, runs_dir).path, resolve_device(device)
    with status(f"embedding {samples} training pairs with {run_dir.name}"):
        geometry, curv, image, text, learned = training_pairs(run_dir, device, samples)
    if len(image) < max(sizes):
        raise UsageError(f"{run_dir.name}'s training shards hold {len(image)} pairs, fewer than the largest "
                         f"batch {max(sizes)}: lower --batch-sizes")
    # The run's own temperature joins the grid, so the table reads the ratio exactly there.
    points = sorted({*temperature_grid(grid[0], grid[1], int(grid[2])), learned})
    result = equilibrium_study(geometry, image, text, curv, list(percents), list(sizes), points, batches, seed)
    result["learned_temperature"] = learned
    return Analysis(result, write_result(run_dir, "equilibrium", result), run_dir)


def _traversal_start(run_dir: Path, device: torch.device, ks: tuple[Optional[float], ...], chosen,
                     root_samples: int, status: Status) -> tuple[C.Config, Optional[torch.Tensor], Optional[int]]:
    """``(the run's config, [ROOT], the pairs it was averaged over)`` for a traversal: entailment radii
    need a geometry with cones; [ROOT] comes from training pairs where the protocol says so and the
    geometry's root is a mean, else ``(None, None)`` (the pool's embeddings give it)."""
    cfg = C.run_config(RunDir(run_dir))
    facts = describe(cfg.geometry.name)
    if any(k is not None for k in ks) and not facts.has_entailment:
        raise UsageError(f"--entail: run {run_dir.name} has the {cfg.geometry.name} geometry, which has no "
                         f"entailment cones")
    if not (chosen.root_from_training and facts.root == "mean"):
        return cfg, None, None
    root, reference = _paper_root(run_dir, device, root_samples, False, status)
    return cfg, root, len(reference) // 2


def traverse(run: Run, device: str = "auto", images: int = 100, steps: int = 50,
             ks: tuple[Optional[float], ...] = (None,), protocol: str = "paper", root_samples: int = 5000,
             world: Optional[Path] = None, runs_dir: Path = RUNS_DIR, status: Status = _quiet) -> Analysis:
    """Traversals from ``images`` of the world's retrieval images to [ROOT] over the world's captions,
    scored against its hierarchy (the papers' Tables 6 and 7); ``ks``: None for the plain traversal,
    a radius for each filtered one."""
    from euclip_cli.analysis.embeddings import collect
    from euclip_cli.analysis.studies import traversal_study
    from euclip_cli.data import world as W

    chosen = pick_protocol(protocol)
    run_dir, device = resolve(run, runs_dir).path, resolve_device(device)
    cfg, root, root_pairs = _traversal_start(run_dir, device, ks, chosen, root_samples, status)
    world = world or C.world_dir(cfg)
    specs = W.traversal_vocabulary()
    with status(f"embedding images, captions and {len(specs)} vocabulary captions"):
        emb = collect(run_dir, device, world, vocabulary=[W.caption_text(s) for s in specs])
    if root is None:
        root = emb.geometry.root(torch.cat([emb.image, emb.text]))
    scenes = [W.scene_from_json(s) for s in read_json(WorldDir(world).task("retrieval") / "scenes.json")]
    result = traversal_study(emb, specs, scenes, images, steps, list(ks), chosen, root)
    result["root_pairs"] = root_pairs
    return Analysis(result, write_result(run_dir, "traverse", result), run_dir)


def traverse_folder(run: Run, image_dir: Path, captions: list[str], device: str = "auto", steps: int = 50,
                    ks: tuple[Optional[float], ...] = (None,), protocol: str = "paper", root_samples: int = 5000,
                    runs_dir: Path = RUNS_DIR, status: Status = _quiet) -> Analysis:
    """Traversals of a folder of images over a text pool (MERU's; no ground truth to score)."""
    from euclip_cli.analysis.embeddings import folder_embeddings
    from euclip_cli.analysis.studies import folder_traversal_study

    chosen = pick_protocol(protocol)
    if not image_dir.is_dir():
        raise UsageError(f"--image-dir {image_dir} is not a folder")
    run_dir, device = resolve(run, runs_dir).path, resolve_device(device)
    _, root, root_pairs = _traversal_start(run_dir, device, ks, chosen, root_samples, status)
    with status(f"embedding the images in {image_dir} and {len(captions)} captions"):
        g, curv, names, images, texts = folder_embeddings(run_dir, device, image_dir, captions)
    if root is None:
        root = g.root(torch.cat([images, texts]))
    result = folder_traversal_study(g, curv, names, images, captions, texts, root, steps, list(ks), chosen)
    result.update(image_dir=str(image_dir), root_pairs=root_pairs)
    return Analysis(result, write_result(run_dir, "traverse_custom", result), run_dir)


def hierarchy(run: Run, device: str = "auto", world: Optional[Path] = None, runs_dir: Path = RUNS_DIR,
              status: Status = _quiet, convention: str = DEFAULT_CONVENTION) -> Analysis:
    """How the run keeps the world's class tree (the world generator's own): HyCoCLIP's hierarchical
    metrics (``euclip_cli.hierarchy``) of its zero-shot predictions, each image given the class its own
    geometry scores highest, on every world task whose classes are the tree's shapes; and entailment as a
    score (``studies.entailment_study``): family captions against the Shapes images and the shape
    captions, a pair related where the shape belongs to the family, and the world's generic-to-specific
    caption pool against the retrieval images, a pair related where the caption is true of the image."""
    from euclip_cli.analysis.embeddings import collect
    from euclip_cli.analysis.studies import entailment_study, order_study
    from euclip_cli.data.world import FAMILIES, FAMILY_OF, SHAPES, caption_order_pairs, caption_text
    from euclip_cli.hierarchy import (WORLD_ROOT, chance, hierarchical_metrics, world_hierarchy_tasks,
                                      world_tree)

    run_dir, device = resolve(run, runs_dir).path, resolve_device(device)
    cfg = C.run_config(RunDir(run_dir))
    generic = [caption_text({"level": "family", "mentions": [{"family": f}]}) for f in FAMILIES]
    named = [caption_text({"level": "shape", "mentions": [{"shape": s}]}) for s in SHAPES]
    specs, pairs = caption_order_pairs()
    ordered = [caption_text(spec) for spec in specs]
    # The generic-to-specific caption pool and the retrieval images each caption is true of (world_files).
    found = WorldDir(world or C.world_dir(cfg)).hierarchy_file
    if not found.exists():
        raise UsageError(f"no {found.name} under {found.parent}: run 'euclip download world'")
    pool = read_json(found)["captions"]
    with status(f"embedding the world's shape tasks and its captions at every level with {run_dir.name}"):
        emb = collect(run_dir, device, world, vocabulary=generic + named + ordered + [c["text"] for c in pool])
    tree = world_tree()
    tasks, guessing = {}, {}
    for key in world_hierarchy_tasks():
        task = emb.classes[key]
        predicted = emb.geometry.similarity(task.images, task.prototypes, emb.curv).argmax(dim=1)
        true = [SHAPES[i] for i in task.labels.tolist()]
        tasks[key] = hierarchical_metrics([SHAPES[i] for i in predicted.tolist()], true, tree, SHAPES, convention)
        guessing[key] = chance(true, SHAPES, tree, convention)
    families, shapes = emb.vocabulary[:len(generic)], emb.vocabulary[len(generic):len(generic) + len(named)]
    captions = emb.vocabulary[len(generic) + len(named):len(generic) + len(named) + len(ordered)]
    pooled = emb.vocabulary[len(generic) + len(named) + len(ordered):]
    true_of = torch.zeros(len(pool), len(emb.image), dtype=torch.bool)
    for i, caption in enumerate(pool):
        true_of[i, caption["entails"]] = True
    shown = emb.classes[HIERARCHY_IMAGES]
    of_image = torch.tensor([[FAMILY_OF[SHAPES[i]] == f for i in shown.labels.tolist()] for f in FAMILIES])
    of_shape = torch.tensor([[FAMILY_OF[s] == f for s in SHAPES] for f in FAMILIES])
    radius = cfg.loss.entail_min_radius
    entailment = {"text-image": entailment_study(emb.geometry, emb.curv, families, shown.images, of_image, radius),
                  "text-text": entailment_study(emb.geometry, emb.curv, families, shapes, of_shape, radius),
                  "caption-image": entailment_study(emb.geometry, emb.curv, pooled, emb.image, true_of, radius)}
    # [ROOT] as the euclip protocol has it: the origin, or the mean of the images and captions analysed.
    root = emb.geometry.root(torch.cat([shown.images, captions]))
    order = order_study(emb.geometry, emb.curv, captions, pairs, root, radius)
    levels = Counter((specs[a]["level"], specs[b]["level"]) for a, b in pairs)
    result = {"geometry": emb.geometry.name, "logit": emb.geometry.logit, "convention": convention,
              "tree": {"source": "the embedded world's generator (data.world.TAXONOMY)", "root": WORLD_ROOT,
                       "parents": tree.parents},
              "tasks": tasks, "chance": guessing,
              "entailment": {"families": generic, "images": HIERARCHY_IMAGES, "shapes": named,
                             "pool": {"captions": len(pool), "images": "world/retrieval"}, **entailment},
              "order": {"captions": len(ordered), "pairs": len(pairs),
                        "levels": {f"{a} > {b}": n for (a, b), n in sorted(levels.items())}, **order}}
    return Analysis(result, write_result(run_dir, RunDir(run_dir).hierarchy_file.stem, result), run_dir)


# The images whose entailment by their family's caption is scored: the main Shapes task's.
HIERARCHY_IMAGES = "world/shapes"
