"""HyCoCLIP's hierarchical classification on ImageNet: a run's zero-shot predictions on the ImageNet
tasks, scored in WordNet's hierarchy over their classes (``euclip analyze hierarchy RUN --tree wordnet``).

The predictions are the evaluation's own (``runner.classification_inputs``: the same images through the
run's feature cache, the same prototypes, the same top-1 rule), so after ``euclip eval`` nothing is
embedded again and the accuracy here is the evaluation's acc1.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, ContextManager, Optional, Union

from euclip_cli import config as C
from euclip_cli.data.wordnet import IMAGENET_TASKS, PACKAGE, WORDNET_DIR, hypernym_graph, imagenet_wnids
from euclip_cli.device import resolve_device
from euclip_cli.encode import feature_cache, load_model
from euclip_cli.errors import UsageError
from euclip_cli.evaluate.runner import classification_inputs, has_data
from euclip_cli.evaluate.tasks import select
from euclip_cli.evaluate.zeroshot import top_classes
from euclip_cli.hierarchy import Tree, chance, hierarchical_metrics
from euclip_cli.rundir import RUNS_DIR, RunDir, resolve


def _quiet(text: str) -> ContextManager:
    return contextlib.nullcontext()


def wordnet_hierarchy(run: Union[str, Path], device: str = "auto", eval_root: Optional[Path] = None,
                      wordnet: Optional[Path] = None, runs_dir: Path = RUNS_DIR,
                      status: Callable[[str], ContextManager] = _quiet) -> tuple[dict, Path, Path]:
    """``(result, path, run folder)``: the hierarchical metrics (``euclip_cli.hierarchy``) of the run's predictions on
    every ImageNet task whose evaluation set is in ``eval_root`` (default: the run's ``eval.root``), each
    class at its synset in the WordNet under ``wordnet`` (``euclip download wordnet``), beside uniform
    guessing on the same images; written to ``RUN/analysis/hierarchy_wordnet.json``."""
    run_files = RunDir(resolve(run, runs_dir).path)
    device = resolve_device(device)
    wordnet = wordnet or WORDNET_DIR
    model, cfg, ckpt, step = load_model(run_files, device)
    eval_root = eval_root or Path(cfg.eval.root)
    world = C.world_dir(cfg)
    present = [t for t in select(",".join(IMAGENET_TASKS)) if has_data(t, t.data_dir(eval_root, world))]
    if not present:
        raise UsageError(f"no ImageNet evaluation set in {eval_root}: run 'euclip download evalsets --tasks "
                         f"imagenet1k --root {eval_root}' (or name the folder holding them with --eval-root)")
    wnids = {t.key: imagenet_wnids(t.key) for t in present}
    every = sorted({w for ids in wnids.values() for w in ids})
    with status(f"reading WordNet's hypernyms above {len(every)} ImageNet classes"):
        parents, names = hypernym_graph(every, wordnet)
    tree = Tree(parents)
    cache, curv = feature_cache(run_files, ckpt, model), model.curvature()
    tasks, guessing = {}, {}
    for task in present:
        folder = task.data_dir(eval_root, world)
        with status(f"classifying {task.key} with {run_files.path.name}"):
            image_emb, prototypes, targets = classification_inputs(model, cfg, task, folder, device,
                                                                   cfg.eval.batch_size, cache)
        classes = wnids[task.key]
        if prototypes.shape[0] != len(classes):
            raise UsageError(f"{task.key}: the evaluation set in {folder} has {prototypes.shape[0]} class names, "
                             f"ImageNet's has {len(classes)}")
        predicted = top_classes(model.geometry, image_emb, prototypes, curv, k=1)[:, 0]
        true = [classes[i] for i in targets.tolist()]
        tasks[task.key] = hierarchical_metrics([classes[i] for i in predicted.tolist()], true, tree)
        guessing[task.key] = chance(true, classes, tree)
    result = {"geometry": model.geometry.name, "logit": model.geometry.logit, "step": step,
              "tree": {"source": f"WordNet 3.0 (nltk's '{PACKAGE}' package in {wordnet}): hypernyms and instance "
                                 f"hypernyms above ImageNet's classes", "root": tree.root, "nodes": len(names),
                       "names": names, "parents": tree.parents},
              "tasks": tasks, "chance": guessing}
    path = run_files.wordnet_hierarchy_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result, path, run_files.path
