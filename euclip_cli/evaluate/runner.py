"""Evaluate a run's latest checkpoint on a list of tasks; one eval.jsonl line per finished task.

A line is appended (and flushed) as soon as its task finishes, so an interrupted evaluation
loses at most the task in progress, and a re-run skips every task already scored for the
same checkpoint and protocol version. A task that fails (missing data, an unreadable shard, a
bug) is recorded as failed with its reason and the others still run; after every task
``eval_results.jsonl`` is rewritten in DataComp's own format.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from clip_benchmark.datasets.builder import build_dataset, image_captions_collate_fn

from euclip_cli import config as C
from euclip_cli.worlddir import WorldDir
from euclip_cli.encode import (FeatureCache, embed_image_trunks, embed_images, embed_texts, feature_cache,
                               files_identity, load_model)
from euclip_cli.errors import EuclipError, UsageError
from euclip_cli.protocol.aggregate import suite_line
from euclip_cli.protocol.hits import pack_hits
from euclip_cli.protocol.tasks import DIGIT_SETS, NAMES_FROM, SUITE_COLUMNS, Task, select
from euclip_cli.evaluate.zeroshot import (FAIRFACE_OBJECTIVES, classification_metrics, fairface_metrics,
                                          retrieval_metrics, top_classes, wilds_metrics, winogavil_metrics)
from euclip_cli.model import EuclipModel
from euclip_cli.rundir import RunDir
from euclip_cli.towers import tokenizer_for, transforms_for

# Bump when a change alters any metric's value; lines of another protocol are not reused.
PROTOCOL = "euclip-eval-1"
IMAGE_KEYS = "webp;png;jpg;jpeg"


class EvalError(UsageError):
    """The evaluation cannot proceed; the message says what to run or fix."""


def _shards(data_dir: Path) -> list[str]:
    n = int((data_dir / "test" / "nshards.txt").read_text().strip())
    return [str(data_dir / "test" / f"{i}.tar") for i in range(n)]


def read_metadata(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(labels (N,), metadata (N, F))`` from the shards' ``cls`` and ``npy`` entries, in shard order."""
    import webdataset as wds

    labels, rows = [], []
    for label, row in wds.WebDataset(_shards(data_dir), shardshuffle=False).decode().to_tuple("cls", "npy"):
        labels.append(int(label))
        rows.append(torch.as_tensor(row).reshape(-1).long())
    return torch.tensor(labels), torch.stack(rows)


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def has_data(task: Task, data_dir: Path) -> bool:
    """Whether ``data_dir`` holds the task's evaluation set (as ``euclip download`` writes it; a probe's
    train split too)."""
    from euclip_cli.evaluate.selection_sets import SUGARCREPE_IMAGES, WINOGROUND_EXAMPLES

    markers = {"winogavil": ["instances.jsonl"], "probe": ["train/nshards.txt", "test/nshards.txt"]}
    if task.suite == "compositional":  # SugarCrepe: the split's pairs beside COCO's images (clip-benchmark's layout)
        found = [WINOGROUND_EXAMPLES] if task.key == "winoground" else [f"{task.key.split('/')[1]}.json", SUGARCREPE_IMAGES]
        return all((data_dir / m).exists() for m in found)
    return all((data_dir / m).exists() for m in markers.get(task.kind, ["test/nshards.txt"]))


def export_command(task: Task, root: str = "EVAL_ROOT") -> str:
    """How to make a set on no host: clip-benchmark's exporter, one split at a time (docs/meru.md)."""
    if task.kind == "probe":
        return f"euclip download probesets --tasks {task.key} --root {root} (docs/meru.md)"
    dataset = task.key.split("/", 1)[1]
    then = f", then its classnames.txt from {NAMES_FROM[dataset]}" if dataset in NAMES_FROM else ""
    return (f"clip_benchmark_export_wds --dataset {task.exporter_name} --split test --output {root}/{task.folder}"
            f"{then} (docs/meru.md)")


def fetch_command(tasks: list[Task]) -> str:
    """The one command that fetches the evaluation sets of ``tasks``."""
    if all(t.suite == "world" for t in tasks):
        return "euclip download world"
    hosted = [t for t in tasks if not t.folder and t.suite not in ("world", "compositional")]
    composed = [t for t in tasks if t.suite == "compositional"]
    commands = []
    for suite, named in (("datacomp", hosted), ("compositional", composed)):
        keys = ",".join(dict.fromkeys(t.images_key for t in named))
        commands += [f"euclip download evalsets --tasks {keys if len(named) <= 3 else suite}"] if named else []
    # A set on no host is made from the original dataset by clip-benchmark's exporter (docs/meru.md).
    commands += [export_command(t) for t in tasks if t.folder]
    return "' and '".join(commands)


def read_set(batches, task: Task, data_dir: Path):
    """The batches of ``task``'s evaluation set in ``data_dir``; what goes wrong while reading them (a shard cut
    short, a member that is not an image) is the set's damage, named with its folder and the command that
    fetches it again, not an internal error."""
    found = iter(batches)
    while True:
        try:
            batch = next(found)
        except StopIteration:
            return
        except Exception as err:  # noqa: BLE001 (tarfile, PIL and webdataset raise many kinds)
            what = (str(err).splitlines() or [""])[0][:160] or "no message"
            raise EvalError(f"task {task.key}: its evaluation set in {data_dir} cannot be read ({type(err).__name__}: "
                            f"{what}); fetch it again: '{fetch_command([task])}'") from None
        yield batch


def _require_data(task: Task, data_dir: Path) -> None:
    if not has_data(task, data_dir):
        raise EvalError(f"task {task.key}: no data in {data_dir}: run '{fetch_command([task])}'")


def _prototypes(model: EuclipModel, tokenizer, classes: list[str], templates: list[str],
                device: torch.device) -> torch.Tensor:
    """``(C, D)`` class prototypes by the geometry's rule from every (class, template) prompt."""
    texts = [template.replace("{c}", name) for name in classes for template in templates]
    text_emb = embed_texts(model, tokenizer, texts).reshape(len(classes), len(templates), -1)
    return model.geometry.prototypes(text_emb)


def evaluate_task(model: EuclipModel, cfg: C.Config, task: Task, data_dir: Path, device: torch.device,
                  batch_size: int, cache: Optional[FeatureCache] = None,
                  on_images: Callable[[int], None] = lambda n: None, hits: Optional[dict] = None) -> dict:
    """The task's metrics; ``on_images(n)`` is called as each batch of n images is embedded. ``hits``, when
    given, receives the per-example outcomes of zero-shot classification (top-1) and retrieval (R@1). ``cache``
    keeps the images' embeddings under its world's or files' identity (``FeatureCache.with_files``)."""
    cache = cache or FeatureCache(None)
    if task.kind == "winogavil":
        return evaluate_winogavil(model, cfg, task, data_dir, device, batch_size, cache, on_images)
    _require_data(task, data_dir)
    if task.kind == "selection":
        return evaluate_selection(model, cfg, task, data_dir, device, batch_size, cache, on_images, hits)
    if task.kind == "probe":
        return evaluate_probe(model, task, data_dir, device, batch_size, cache, on_images)
    if task.key in ("fairness/fairface", "fairness/utkface"):
        return evaluate_fairface(model, cfg, task, data_dir, device, batch_size, cache, on_images)
    _, transform = transforms_for(model.clip, resize=task.resize)
    tokenizer = tokenizer_for(cfg.model.arch)
    curv = model.curvature()
    if task.kind == "retrieval":
        ds = build_dataset("wds/" + task.images_key, root=str(data_dir), transform=transform, split="test",
                           task="zeroshot_retrieval")
        loader = torch.utils.data.DataLoader(ds.batched(batch_size, collation_fn=image_captions_collate_fn),
                                             batch_size=None, num_workers=0)
        image_emb, captions = cache.get(task.features_key,
                                        lambda: embed_images(model, read_set(loader, task, data_dir), device, on_images),
                                        per_world=task.suite == "world")
        texts = [c for caps in captions for c in caps]
        owner = torch.tensor([i for i, caps in enumerate(captions) for _ in caps], device=device)
        text_emb = embed_texts(model, tokenizer, texts)
        return retrieval_metrics(model.geometry, image_emb.to(device), text_emb, owner, curv, hits=hits)
    image_emb, prototypes, targets = classification_inputs(model, cfg, task, data_dir, device, batch_size, cache,
                                                           on_images)
    metrics = classification_metrics(model.geometry, image_emb, prototypes, targets, curv, hits=hits)
    if task.kind in ("wilds", "fairness"):
        meta_labels, metadata = read_metadata(data_dir)
        if not torch.equal(meta_labels, targets.cpu()):
            raise EvalError(f"task {task.key}: the shards' metadata pass does not line up with the images in {data_dir}")
        topk = top_classes(model.geometry, image_emb, prototypes, curv)
        metrics.update(wilds_metrics(task.key, topk.cpu(), targets.cpu(), metadata))
    return metrics


def classification_inputs(model: EuclipModel, cfg: C.Config, task: Task, data_dir: Path, device: torch.device,
                          batch_size: int, cache: Optional[FeatureCache] = None,
                          on_images: Callable[[int], None] = lambda n: None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A classification task's ``(image_emb (N, D), prototypes (C, D), targets (N,))`` on ``device``: the
    images through the feature cache (shared by the tasks that read one evaluation set), the class
    prototypes by the geometry's rule from the set's class names and the task's templates (its own, as
    MERU's suite brings, else the set's): what ``evaluate_task`` scores, and ``euclip analyze hierarchy`` reads."""
    cache = cache or FeatureCache(None)
    _require_data(task, data_dir)
    _, transform = transforms_for(model.clip, resize=task.resize)
    ds = build_dataset("wds/" + task.images_key, root=str(data_dir), transform=transform, split="test")
    loader = torch.utils.data.DataLoader(ds.batched(batch_size), batch_size=None, num_workers=0)
    image_emb, labels = cache.get(task.features_key,
                                  lambda: embed_images(model, read_set(loader, task, data_dir), device, on_images),
                                  per_world=task.suite == "world")
    templates = list(task.templates) or ds.templates
    if not task.classes and task.images_key not in DIGIT_SETS and ds.classes == [str(i) for i in range(len(ds.classes))]:
        raise EvalError(f"task {task.key}: {data_dir / 'classnames.txt'} names the classes by their label numbers "
                        f"0..{len(ds.classes) - 1}, not by what they are, so zero-shot prompts would read 'a photo of "
                        f"a 7': write the names there, one per line in label order ({fetch_command([task])})")
    if task.classes and len(task.classes) != len(ds.classes):
        raise EvalError(f"task {task.key}: {data_dir / 'classnames.txt'} has {len(ds.classes)} classes where the "
                        f"task names {len(task.classes)} ({', '.join(task.classes)}); fetch the set again "
                        f"({fetch_command([task])})")
    prototypes = _prototypes(model, tokenizer_for(cfg.model.arch), task.class_names(ds.classes), templates, device)
    return image_emb.to(device), prototypes, torch.tensor(labels, device=device)


def evaluate_probe(model: EuclipModel, task: Task, data_dir: Path, device: torch.device, batch_size: int,
                   cache: FeatureCache, on_images: Callable[[int], None]) -> dict:
    """MERU's linear probe (``probe.linear_probe``) on the image tower's features before its projection,
    each split's cached like zero-shot features; without a ``val`` split, ``task.val_fraction`` of each
    class of ``train`` (``probe.stratified_holdout``) is the validation split."""
    from euclip_cli.evaluate.probe import linear_probe, stratified_holdout

    _, transform = transforms_for(model.clip)

    def features(split: str) -> tuple[torch.Tensor, list]:
        ds = build_dataset("wds/" + task.key, root=str(data_dir), transform=transform, split=split)
        loader = torch.utils.data.DataLoader(ds.batched(batch_size), batch_size=None, num_workers=0)
        return embed_image_trunks(model, read_set(loader, task, data_dir), device, on_images)

    splits = {split: cache.get(f"{task.key}-{split}", lambda split=split: features(split))
              for split in ("train", "val", "test") if (data_dir / split / "nshards.txt").exists()}
    train_x, train_y = splits["train"][0].numpy(), np.asarray(splits["train"][1])
    if "val" in splits:
        val = (splits["val"][0].numpy(), np.asarray(splits["val"][1]))
    else:
        held = stratified_holdout(train_y, task.val_fraction)
        if not held.any():
            raise EvalError(f"task {task.key}: the train split in {data_dir} has no class with two images to hold "
                            f"one out for validation")
        val, train_x, train_y = (train_x[held], train_y[held]), train_x[~held], train_y[~held]
    test_x = splits["test"][0].numpy()
    shared = test_in_train(np.concatenate([train_x, val[0]]), test_x)
    if shared > len(test_x) // 2:
        # clip-benchmark's sun397, caltech101 and eurosat return the whole dataset for every split.
        raise EvalError(f"task {task.key}: {shared} of the {len(test_x)} test images in {data_dir} are also train or "
                        f"val images: the exporter wrote one dataset as every split; export the VTAB version "
                        f"(e.g. --dataset vtab/{task.key.split('/', 1)[1]}), whose splits are disjoint")
    found = linear_probe((train_x, train_y), val, (test_x, np.asarray(splits["test"][1])))
    return found | {"test_in_train": shared} | meru_sizes(task, found, "val" in splits)


def meru_sizes(task: Task, found: dict, own_val: bool) -> dict:
    """The probe set's split sizes against MERU's Table 6: ``meru_sizes`` (its train, val, test) and
    ``sizes_match_meru`` (``sets.sizes_match_meru``)."""
    from euclip_cli.evaluate.sets import sizes_match_meru
    from euclip_cli.published import meru_split_sizes

    published = meru_split_sizes().get(task.key.split("/", 1)[1])
    if published is None:
        return {}
    return {"meru_sizes": {split: published[split] for split in ("train", "val", "test")},
            "sizes_match_meru": sizes_match_meru(found, published, own_val)}


def test_in_train(train: np.ndarray, test: np.ndarray) -> int:
    """How many rows of ``test (N, F)`` equal a row of ``train (M, F)``: an image in both splits has the same
    features bit for bit (one tower, one transform), so this counts the images the splits share."""
    seen = {row.tobytes() for row in train}
    return sum(row.tobytes() in seen for row in test)


def evaluate_fairface(model: EuclipModel, cfg: C.Config, task: Task, data_dir: Path, device: torch.device,
                      batch_size: int, cache: FeatureCache, on_images: Callable[[int], None]) -> dict:
    """DataComp's FairFace/UTKFace protocol: class names and templates are ``objective:text`` lines;
    each objective gets its own prototypes, and each image one prediction per objective, in the
    run's geometry."""
    import webdataset as wds

    classes: dict[str, list[str]] = {o: [] for o in FAIRFACE_OBJECTIVES}
    templates: dict[str, list[str]] = {o: [] for o in FAIRFACE_OBJECTIVES}
    for target, path in ((classes, data_dir / "classnames.txt"),
                         (templates, data_dir / "zeroshot_classification_templates.txt")):
        for line in _lines(path):
            objective, _, text = line.partition(":")
            if objective not in target:
                raise EvalError(f"task {task.key}: {path} has the line '{line}', whose objective is not one of "
                                f"{', '.join(FAIRFACE_OBJECTIVES)}")
            target[objective].append(text)
    _, transform = transforms_for(model.clip)
    pipeline = (wds.WebDataset(_shards(data_dir), shardshuffle=False).decode("pilrgb")
                .to_tuple(IMAGE_KEYS, "npy").map_tuple(transform, lambda row: torch.as_tensor(row).reshape(-1).long())
                .batched(batch_size))
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=0)
    image_emb, rows = cache.get(task.key, lambda: embed_images(model, read_set(loader, task, data_dir), device, on_images))
    image_emb, metadata = image_emb.to(device), torch.tensor(rows)
    tokenizer = tokenizer_for(cfg.model.arch)
    predicted = {}
    for objective in FAIRFACE_OBJECTIVES:
        if not classes[objective] or not templates[objective]:
            raise EvalError(f"task {task.key}: no class names or templates for the objective '{objective}' in {data_dir}")
        prototypes = _prototypes(model, tokenizer, classes[objective], templates[objective], device)
        predicted[objective] = top_classes(model.geometry, image_emb, prototypes, model.curvature(), k=1)[:, 0].cpu()
    return fairface_metrics(predicted, metadata)


@torch.no_grad()
def selection_inputs(model: EuclipModel, cfg: C.Config, task: Task, data_dir: Path, device: torch.device,
                     batch_size: int, cache: Optional[FeatureCache] = None,
                     on_images: Callable[[int], None] = lambda n: None) -> tuple[torch.Tensor, torch.Tensor]:
    """A selection task's ``(image_emb (N, I, D), text_emb (N, T, D))`` on ``device``: each instance's images
    (through the feature cache) and captions, read by clip-benchmark's SugarCrepe builder or ``WinogroundSet``."""
    from euclip_cli.evaluate.selection import WinogroundSet

    cache = cache or FeatureCache(None)
    _require_data(task, data_dir)
    _, transform = transforms_for(model.clip)
    if task.suite == "world":  # the caption and its negative as a retrieval set's captions (world_files)
        ds = build_dataset("wds/" + task.key, root=str(data_dir), transform=transform, split="test",
                           task="zeroshot_retrieval")
        loader = torch.utils.data.DataLoader(ds.batched(batch_size, collation_fn=image_captions_collate_fn),
                                             batch_size=None, num_workers=0)
    else:
        ds = (WinogroundSet(data_dir, transform) if task.key == "winoground" else
              # every file it reads is there (has_data), so its builder fetches nothing
              build_dataset(task.key, root=str(data_dir), transform=transform, split="test",
                            task="image_caption_selection"))
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, collate_fn=image_captions_collate_fn,
                                             num_workers=0)

    def embed() -> tuple[torch.Tensor, list]:
        embs, captions = [], []
        for images, texts in read_set(loader, task, data_dir):
            images = images if images.dim() == 5 else images[:, None]  # (B, I, C, H, W): one image per instance
            flat = model.encode_image(images.flatten(0, 1).to(device))
            embs.append(flat.reshape(images.shape[0], images.shape[1], -1).cpu())
            captions += [list(t) for t in texts]
            on_images(images.shape[0] * images.shape[1])
        return torch.cat(embs), captions

    image_emb, captions = cache.get(task.features_key, embed, per_world=task.suite == "world")
    if len({len(c) for c in captions}) != 1:
        raise EvalError(f"task {task.key}: the instances in {data_dir} hold different numbers of captions "
                        f"({sorted({len(c) for c in captions})}); fetch the set again ({fetch_command([task])})")
    text_emb = embed_texts(model, tokenizer_for(cfg.model.arch), [t for caps in captions for t in caps])
    return image_emb.to(device), text_emb.reshape(len(captions), len(captions[0]), -1)


def evaluate_selection(model: EuclipModel, cfg: C.Config, task: Task, data_dir: Path, device: torch.device,
                       batch_size: int, cache: FeatureCache, on_images: Callable[[int], None],
                       hits: Optional[dict] = None) -> dict:
    """clip-benchmark's image-caption selection metrics in the run's geometry (``selection.selection_metrics``);
    on the embedded world's hard negatives also ``acc_KIND`` and ``pairs_KIND`` for each kind of negative, and
    the text-only baseline and chance beside them (``text_only_acc``, ``text_only_acc_KIND``, ``chance``)."""
    from euclip_cli.evaluate.selection import selection_metrics

    image_emb, text_emb = selection_inputs(model, cfg, task, data_dir, device, batch_size, cache, on_images)
    hits = {} if hits is None else hits
    metrics = selection_metrics(model.geometry, image_emb, text_emb, model.curvature(), hits=hits)
    if task.suite == "world":
        world, name = WorldDir(data_dir.parent.parent), task.key.split("/", 1)[1]
        kinds = json.loads(world.negative_kinds_file(name).read_text())
        baseline = json.loads(world.text_only_file(name).read_text())
        if len(kinds) != len(hits["acc"]):
            raise EvalError(f"task {task.key}: {len(kinds)} kinds of negative for {len(hits['acc'])} pairs in "
                            f"{data_dir}: generate the world again (euclip download world)")
        for kind in sorted(set(kinds)):
            mine = hits["acc"][torch.tensor([k == kind for k in kinds])]
            metrics |= {f"acc_{kind}": mine.float().mean().item(), f"pairs_{kind}": len(mine)}
        metrics |= {f"text_only_{k}": v for k, v in baseline.items() if k.startswith("acc")}
        metrics["chance"] = baseline["chance"]
    return metrics


def evaluate_winogavil(model: EuclipModel, cfg: C.Config, task: Task, data_dir: Path, device: torch.device,
                       batch_size: int, cache: FeatureCache, on_images: Callable[[int], None]) -> dict:
    """DataComp's WinoGAViL protocol on ``instances.jsonl`` + ``images/`` (``euclip download evalsets``)."""
    from PIL import Image

    _require_data(task, data_dir)
    instances_path = data_dir / "instances.jsonl"
    instances = [json.loads(line) for line in _lines(instances_path)]
    names = sorted({c for inst in instances for c in inst["candidates"]})
    _, transform = transforms_for(model.clip)

    def images():
        for i in range(0, len(names), batch_size):
            chunk = names[i:i + batch_size]
            yield torch.stack([transform(Image.open(data_dir / "images" / f"{n}.jpg").convert("RGB")) for n in chunk]), chunk

    image_emb, order = cache.get(task.key, lambda: embed_images(model, images(), device, on_images))
    index = {name: i for i, name in enumerate(order)}
    image_emb = image_emb.to(device)
    # DataComp's prompt: the lower-cased cue after "A" or "An", no period.
    prompts = [("An " if inst["cue"].lower()[0] in "aeiou" else "A ") + inst["cue"].lower() for inst in instances]
    cue_emb = embed_texts(model, tokenizer_for(cfg.model.arch), prompts)
    candidates = [image_emb[[index[c] for c in inst["candidates"]]] for inst in instances]
    truth = [{inst["candidates"].index(a) for a in inst["associations"]} for inst in instances]
    return winogavil_metrics(model.geometry, cue_emb, candidates, truth, model.curvature())


@dataclass
class EvalOutcome:
    """What ``evaluate_run`` did: the run's newest line per task, the tasks that failed with why, and of
    those the ones without evaluation data (one download fetches them all)."""

    results: list[dict]
    failed: dict[str, str] = field(default_factory=dict)
    missing_data: list[Task] = field(default_factory=list)
    earlier_only: dict[str, int] = field(default_factory=dict)  # tasks scored only at an older checkpoint: their step

    def missing_line(self) -> Optional[str]:
        """The tasks without evaluation data and the one command that fetches them all, or None."""
        if not self.missing_data:
            return None
        keys = ", ".join(sorted(t.key for t in self.missing_data))
        return (f"no evaluation data for {keys if len(self.missing_data) <= 3 else f'{len(self.missing_data)} tasks'}: "
                f"run '{fetch_command(self.missing_data)}'")

    def problems(self, run_name: str) -> list[str]:
        """One line per failed task, and one for all the tasks without data."""
        missing = {t.key for t in self.missing_data}
        lines = [f"{run_name}: {why}" for key, why in self.failed.items() if key not in missing]
        if self.missing_data:
            lines.append(f"{run_name}: {self.missing_line()}")
        return lines

    def suite_lines(self) -> list[str]:
        """Each suite with a task scored: its groups' and average's main metric; then the tasks these leave out
        for having been scored only at an older checkpoint."""
        lines = [line for suite in SUITE_COLUMNS if (line := suite_line(self.results, suite))]
        if self.earlier_only:
            keys = sorted(self.earlier_only)
            named = ", ".join(keys) if len(keys) <= 3 else f"{len(keys)} tasks"
            steps = sorted(set(self.earlier_only.values()))
            lines.append(f"left out: {named}, scored only at an earlier checkpoint (step "
                         f"{', '.join(map(str, steps))}); --tasks {','.join(keys)} scores them at this one")
        return lines


def task_status(line: Optional[dict]) -> str:
    """What became of one task, in words: ``evaluate_run``'s line for it (None: scored before)."""
    if line is None:
        return "already evaluated"
    if line.get("failed"):
        return f"failed: {line['error']}"
    metrics = line["metrics"]
    if "text_only_acc" in metrics:  # a selection task's accuracy means little without what text alone scores
        return f"acc {metrics['acc']:.4f} (text alone {metrics['text_only_acc']:.4f}, chance {metrics['chance']:.2f})"
    value = metrics["main_metric"]
    return "scored (no main metric)" if value is None else f"{value:.4f}"


def evaluate_run(run_dir: Path, device: torch.device, tasks: Optional[list[Task]] = None,
                 eval_root: Optional[Path] = None, world: Optional[Path] = None, batch_size: Optional[int] = None,
                 on_task: Optional[Callable[[Task, Optional[dict]], None]] = None,
                 on_images: Callable[[Task, int], None] = lambda task, n: None, again: bool = False) -> EvalOutcome:
    """Score every task not yet in ``run_dir/eval.jsonl`` for this checkpoint (a world task: on this world, whose
    fingerprint its line records) (with ``again``, every task:
    lines written by an older euclip lack what a newer one keeps, such as the per-example outcomes).

    Unset arguments come from the run's stored config (``eval.tasks``, ``eval.root``, the world it
    trained on). A task that raises is recorded as failed (``"failed": true`` and its reason) and
    the next one runs; ``on_task`` gets each task's line, or None for one already scored.
    """
    run = RunDir(run_dir)
    model, cfg, ckpt, step = load_model(run, device)
    tasks = tasks if tasks is not None else select(cfg.eval.tasks)
    eval_root = eval_root or Path(cfg.eval.root)
    world = world or C.world_dir(cfg)
    batch_size = batch_size or cfg.eval.batch_size
    ckpt_name = str(ckpt.relative_to(run.path))
    world_id = WorldDir(world).identity()

    sets = {task.key: files_identity(task.data_dir(eval_root, world)) for task in tasks if task.suite != "world"}

    def scored(line: dict, task: Task) -> bool:
        """A line that scored ``task`` on this checkpoint, by this protocol, on the same world (a world task) or the
        same evaluation set (another)."""
        source = line.get("world") == world_id if task.suite == "world" else line.get("set") == sets[task.key]
        return (line.get("key") == task.key and line.get("checkpoint") == ckpt_name and line.get("protocol") == PROTOCOL
                and not line.get("failed") and source)

    lines = [] if again else run.eval_lines()
    cache = feature_cache(run, ckpt, model, world_id)
    failed, missing_data = {}, []
    for task in tasks:
        if any(scored(line, task) for line in lines):
            if on_task:
                on_task(task, None)
            continue
        line = {"key": task.key, "dataset": task.name, "checkpoint": ckpt_name, "step": step, "protocol": PROTOCOL}
        if task.suite == "world":
            line["world"] = world_id  # the world's fingerprint: another world's scores are not these
        else:
            line["set"] = sets[task.key]  # another copy of the set (a subset, another release) is scored apart
        if not has_data(task, task.data_dir(eval_root, world)):
            line["missing_data"] = True  # a failure the download fixes: said once for all such tasks
            missing_data.append(task)
        hits: dict[str, torch.Tensor] = {}
        try:
            metrics = evaluate_task(model, cfg, task, task.data_dir(eval_root, world), device, batch_size,
                                    cache.with_files(sets.get(task.key)),
                                    lambda n, task=task: on_images(task, n), hits)
        except EuclipError as err:
            line.update(failed=True, error=str(err))
        except Exception as err:  # a bug: the others still run, and the traceback is kept with the line
            line.update(failed=True, error=f"internal error {type(err).__name__}: {err}",
                        traceback=traceback.format_exc())
        else:
            metrics["main_metric"] = metrics.get(task.main_metric) if task.main_metric else None
            line["metrics"] = metrics
            if hits:
                line["hits"] = {name: pack_hits(outcome) for name, outcome in hits.items()}
        if line.get("failed"):
            failed[task.key] = line["error"]
        run.append_eval(line)
        run.write_datacomp_results()
        if on_task:
            on_task(task, line)
    lines = run.eval_lines()  # the world just evaluated
    return EvalOutcome(run.latest_results(world_id, lines), failed, missing_data, run.earlier_only(world_id, lines))
