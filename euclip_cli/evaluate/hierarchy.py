"""HyCoCLIP's hierarchical classification on ImageNet: a run's zero-shot predictions on the ImageNet
tasks, scored in a hierarchy over their classes (``euclip analyze hierarchy RUN --tree wordnet``).

The predictions are the evaluation's own (``runner.classification_inputs``: the same images through the
run's feature cache, the same prototypes, the same top-1 rule), so after ``euclip eval`` nothing is
embedded again and the accuracy here is the evaluation's acc1.

Each task is scored in a tree over its own classes (ImageNet-A's 200 in the tree above those 200), one of
``IMAGENET_TREES``: HyCoCLIP's tree read from a copy the user supplies (``--isa``: HyCoCLIP's
``assets/imagenet_synset/imagenet_isa.txt``, CC BY-NC, so not shipped), or without one WordNet pruned to
the same shape (``hierarchy.prune``), or WordNet's whole hypernym graph.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, ContextManager, Optional, Union

from euclip_cli import config as C
from euclip_cli.data.wordnet import (IMAGENET_TASKS, PACKAGE, PHYSICAL_ENTITY, WORDNET_DIR, hypernym_graph,
                                     imagenet_wnids, read_isa)
from euclip_cli.device import resolve_device
from euclip_cli.encode import feature_cache, files_identity, load_model
from euclip_cli.errors import UsageError
from euclip_cli.evaluate.runner import classification_inputs, has_data
from euclip_cli.protocol.tasks import select
from euclip_cli.evaluate.zeroshot import top_classes
from euclip_cli.hierarchy import DEFAULT_CONVENTION, Tree, chance, hierarchical_metrics, prune, restrict
from euclip_cli.rundir import RUNS_DIR, RunDir, resolve

# The hierarchies ImageNet's tasks are scored in: name -> what it is.
IMAGENET_TREES = {
    "wordnet": "a tree: HyCoCLIP's (--isa FILE) or, without it, WordNet's hypernyms pruned to its shape",
    "wordnet-graph": "WordNet's whole hypernym graph (a class may have two parents)",
}


def _quiet(text: str) -> ContextManager:
    return contextlib.nullcontext()


def check_tree(tree: str, isa: Optional[Path]) -> None:
    """Whether ``tree`` (``world`` or one of ``IMAGENET_TREES``) and ``isa`` go together; a ``UsageError`` if not."""
    if tree != "world" and tree not in IMAGENET_TREES:
        raise UsageError(f"unknown --tree '{tree}': choose one of world, {', '.join(IMAGENET_TREES)}")
    if isa is not None and tree != "wordnet":
        raise UsageError(f"--isa is the tree itself: it goes with --tree wordnet, not --tree {tree}")


def require_classes(parent: dict[str, str], isa: Path, classes: list[str], whose: str) -> None:
    """A ``UsageError`` naming ``isa`` where its tree ``parent`` lacks any of ``classes`` (``whose`` they are)."""
    missing = [c for c in classes if c not in parent]
    if missing:
        raise UsageError(f"{isa} lacks {len(missing)} of {whose} {len(classes)} classes (e.g. "
                         f"{', '.join(missing[:3])}): is it HyCoCLIP's imagenet_isa.txt?")


def task_tree(classes: list[str], tree: str, wordnet: Path, given: Optional[dict[str, str]],
              isa: Optional[Path]) -> tuple[Tree, dict[str, str], str]:
    """``(tree, synset names, source)``: the hierarchy ``tree`` (``IMAGENET_TREES``) over one task's
    ``classes`` (``given``: the tree read from ``isa``, if one was), the names of WordNet's synsets in it,
    and a sentence saying where it came from."""
    graph, names = hypernym_graph(classes, wordnet)
    wordnet_said = f"WordNet 3.0 (nltk's '{PACKAGE}' package in {wordnet})"
    if tree == "wordnet-graph":
        return Tree(graph), names, f"{wordnet_said}: hypernyms and instance hypernyms above the task's classes"
    if given is None:
        return (Tree.from_parent(prune(graph, classes, prefer=PHYSICAL_ENTITY)), names,
                f"{wordnet_said}, pruned to a tree: each synset under its parent toward physical_entity with the "
                f"longest path to the root, one-child synsets spliced out (euclip_cli.hierarchy.prune)")
    require_classes(given, isa, classes, "the task's")
    return Tree.from_parent(restrict(given, classes)), names, f"{isa} (HyCoCLIP's tree), restricted to the task's classes"


def wordnet_hierarchy(run: Union[str, Path], device: str = "auto", eval_root: Optional[Path] = None,
                      wordnet: Optional[Path] = None, runs_dir: Path = RUNS_DIR,
                      status: Callable[[str], ContextManager] = _quiet, tree: str = "wordnet",
                      isa: Optional[Path] = None, convention: str = DEFAULT_CONVENTION) -> tuple[dict, Path, Path]:
    """``(result, path, run folder)``: the hierarchical metrics (``euclip_cli.hierarchy``) of the run's predictions on
    every ImageNet task whose evaluation set is in ``eval_root`` (default: the run's ``eval.root``), each
    task in the hierarchy ``tree`` over its own classes (``task_tree``; WordNet from ``wordnet``,
    ``euclip download wordnet``), beside uniform guessing on the same images; written to
    ``RUN/analysis/hierarchy_wordnet.json``."""
    check_tree(tree, isa)
    if tree == "world":
        raise UsageError("--tree world is the embedded world's tree: 'euclip analyze hierarchy RUN' scores in it")
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
    given = None if isa is None else read_isa(isa)  # read once, for every task
    cache, curv = feature_cache(run_files, ckpt, model), model.curvature()
    tasks, guessing, trees, names = {}, {}, {}, {}
    for task in present:
        classes = imagenet_wnids(task.key)
        with status(f"building the {tree} hierarchy over {task.key}'s {len(classes)} classes"):
            hierarchy, named, source = task_tree(classes, tree, wordnet, given, isa)
        folder = task.data_dir(eval_root, world)
        with status(f"classifying {task.key} with {run_files.path.name}"):
            files = cache.with_files(files_identity(folder))
            image_emb, prototypes, targets = classification_inputs(model, cfg, task, folder, device,
                                                                   cfg.eval.batch_size, files)
        if prototypes.shape[0] != len(classes):
            raise UsageError(f"{task.key}: the evaluation set in {folder} has {prototypes.shape[0]} class names, "
                             f"ImageNet's has {len(classes)}")
        predicted = top_classes(model.geometry, image_emb, prototypes, curv, k=1)[:, 0]
        true = [classes[i] for i in targets.tolist()]
        tasks[task.key] = hierarchical_metrics([classes[i] for i in predicted.tolist()], true, hierarchy, classes,
                                               convention)
        guessing[task.key] = chance(true, classes, hierarchy, convention)
        trees[task.key] = {"source": source, "root": hierarchy.root, "nodes": len(hierarchy.nodes),
                           "parents": hierarchy.parents}
        names.update({node: named[node] for node in hierarchy.nodes if node in named})
    result = {"geometry": model.geometry.name, "logit": model.geometry.logit, "step": step, "tree": tree,
              "isa": None if isa is None else str(isa), "convention": convention, "trees": trees, "names": names,
              "tasks": tasks, "chance": guessing}
    path = run_files.wordnet_hierarchy_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result, path, run_files.path


# What ``imagenet_tree`` writes into its folder.
TREE_FILE, COMPARISON_FILE = "imagenet-tree.txt", "comparison.json"


def imagenet_tree(out: Path, wordnet: Optional[Path] = None, against: Optional[Path] = None) -> dict:
    """The tree ``--tree wordnet`` scores ImageNet-1k in without ``--isa`` (WordNet pruned), written to
    ``out/imagenet-tree.txt`` in ``read_isa``'s form; with ``against`` (HyCoCLIP's ``imagenet_isa.txt``), how
    far the two trees are apart (``hierarchy.compare_trees``), written to ``out/comparison.json``. Neither
    file is overwritten with other contents."""
    from euclip_cli.data.wordnet import write_isa
    from euclip_cli.hierarchy import compare_trees

    wordnet = wordnet or WORDNET_DIR
    classes = imagenet_wnids("imagenet1k")
    graph, _ = hypernym_graph(classes, wordnet)
    parent = prune(graph, classes, prefer=PHYSICAL_ENTITY)
    tree, whole = Tree.from_parent(parent), Tree(graph)
    result = {"wordnet": str(wordnet), "tree": str(out / TREE_FILE), "classes": len(classes), "nodes": len(tree.nodes),
              "root": tree.root, "graph_nodes": len(whole.nodes),
              "graph_nodes_with_two_parents": sum(len(p) > 1 for p in graph.values())}
    if against is not None:
        theirs = read_isa(against)
        require_classes(theirs, against, classes, "ImageNet-1k's")
        theirs = Tree.from_parent(theirs)
        result["against"] = str(against)
        result["comparison"] = compare_trees(tree, theirs, classes)
        result["graph_comparison"] = {"tie_correlation": compare_trees(whole, theirs, classes)["tie_correlation"]}
    out.mkdir(parents=True, exist_ok=True)
    staged = [(out / (TREE_FILE + ".new"), out / TREE_FILE)]
    write_isa(parent, staged[0][0])
    if against is not None:
        staged.append((out / (COMPARISON_FILE + ".new"), out / COMPARISON_FILE))
        staged[1][0].write_text(json.dumps(result, indent=2) + "\n")
    clash = [final for new, final in staged if final.exists() and final.read_bytes() != new.read_bytes()]
    if clash:
        for new, _ in staged:
            new.unlink()
        raise UsageError(f"{clash[0]} exists and holds something else: move it away or name another --out")
    for new, final in staged:
        new.replace(final)
    return result

