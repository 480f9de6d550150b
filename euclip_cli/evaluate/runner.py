"""Evaluate a run's latest checkpoint on a list of tasks; one eval.jsonl line per finished task.

A line is appended (and flushed) as soon as its task finishes, so an interrupted evaluation
loses at most the task in progress, and a re-run skips every task already scored for the
same checkpoint and protocol version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import torch
from clip_benchmark.datasets.builder import build_dataset, image_captions_collate_fn

from euclip_cli import config as C
from euclip_cli.evaluate.tasks import Task, select
from euclip_cli.evaluate.zeroshot import (classification_metrics, retrieval_metrics, top_classes, wilds_metrics,
                                         winogavil_metrics)
from euclip_cli.model import EuclipModel, tokenizer_for, transforms_for
from euclip_cli.train import checkpoint

# Bump when a change alters any metric's value; lines of another protocol are not reused.
PROTOCOL = "euclip-eval-1"
# Bump when a change alters image embeddings (transforms, encoders): cached features are keyed by it.
FEATURES = "features-1"


class EvalError(Exception):
    """The evaluation cannot proceed; the message says what to run or fix."""


class FetchError(Exception):
    """Pretrained weights could not be fetched (a runtime failure, not a usage mistake)."""


def load_run(run_dir: Path, device: torch.device) -> tuple[EuclipModel, C.Config, Path, int]:
    """The model of a run's latest checkpoint, rebuilt from the config stored inside it."""
    found = checkpoint.latest(run_dir / "checkpoints")
    if found is None:
        raise EvalError(f"{run_dir} has no checkpoint: train it first (euclip train --recipe RECIPE)")
    state = checkpoint.load(found, map_location=str(device))
    cfg = C.from_dict(state["config"])
    model = EuclipModel(cfg)
    model.load_state_dict(state["model"])
    return model.to(device).eval(), cfg, found, state["step"]


def read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a crash mid-write; its task is evaluated again
    return lines


@torch.no_grad()
def embed_images(model, loader, device, on_images: Callable[[int], None]) -> tuple[torch.Tensor, list]:
    embs, labels = [], []
    for images, label in loader:
        embs.append(model.encode_image(images.to(device)))
        labels.extend(label if isinstance(label, (list, tuple)) else label.tolist())
        on_images(len(images))
    return torch.cat(embs), labels


@torch.no_grad()
def embed_texts(model, tokenizer, texts: list[str], device, batch_size: int = 256) -> torch.Tensor:
    return torch.cat([model.encode_text(tokenizer(texts[i:i + batch_size]).to(device))
                      for i in range(0, len(texts), batch_size)])


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


class FeatureCache:
    """Image embeddings of one checkpoint per task, so a task's images are encoded once.

    Text prototypes are cheap and always recomputed; a new checkpoint gets a new folder.
    """

    def __init__(self, folder: Optional[Path]):
        self.folder = folder

    def get(self, task: Task, compute: Callable[[], tuple[torch.Tensor, list]]) -> tuple[torch.Tensor, list]:
        if self.folder is None:
            return compute()
        path = self.folder / (task.key.replace("/", "__") + ".pt")
        if path.exists():
            cached = torch.load(path, map_location="cpu", weights_only=True)
            return cached["image_emb"], cached["labels"]
        image_emb, labels = compute()
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"image_emb": image_emb.cpu(), "labels": labels}, tmp)
        tmp.replace(path)
        return image_emb, labels


def feature_cache(run_dir: Path, ckpt: Path) -> FeatureCache:
    """The cache of one checkpoint, keyed by the file itself: a run trained again writes new files."""
    return FeatureCache(run_dir / "features" / f"{ckpt.stem}-{ckpt.stat().st_mtime_ns}-{FEATURES}")


def evaluate_task(model: EuclipModel, cfg: C.Config, task: Task, data_dir: Path, device: torch.device,
                  batch_size: int, cache: Optional[FeatureCache] = None,
                  on_images: Callable[[int], None] = lambda n: None) -> dict:
    """The task's metrics; ``on_images(n)`` is called as each batch of n images is embedded."""
    cache = cache or FeatureCache(None)
    if task.key in ("fairness/fairface", "fairness/utkface"):
        raise EvalError(f"task {task.key}: {task.kind} scoring is not implemented yet; evaluate the other tasks")
    if task.kind == "winogavil":
        return evaluate_winogavil(model, cfg, task, data_dir, device, batch_size, cache, on_images)
    if not (data_dir / "test" / "nshards.txt").exists():
        hint = "euclip download world" if task.suite == "world" else f"euclip download evalsets --tasks {task.key}"
        raise EvalError(f"task {task.key}: no data in {data_dir}: run '{hint}'")
    _, transform = transforms_for(model.clip)
    tokenizer = tokenizer_for(cfg.model.arch)
    curv = model.curvature()
    if task.kind == "retrieval":
        ds = build_dataset("wds/" + task.key, root=str(data_dir), transform=transform, split="test",
                           task="zeroshot_retrieval")
        loader = torch.utils.data.DataLoader(ds.batched(batch_size, collation_fn=image_captions_collate_fn),
                                             batch_size=None, num_workers=0)
        image_emb, captions = cache.get(task, lambda: embed_images(model, loader, device, on_images))
        texts = [c for caps in captions for c in caps]
        owner = torch.tensor([i for i, caps in enumerate(captions) for _ in caps], device=device)
        text_emb = embed_texts(model, tokenizer, texts, device)
        return retrieval_metrics(model.geometry, image_emb.to(device), text_emb, owner, curv)
    ds = build_dataset("wds/" + task.key, root=str(data_dir), transform=transform, split="test")
    loader = torch.utils.data.DataLoader(ds.batched(batch_size), batch_size=None, num_workers=0)
    image_emb, labels = cache.get(task, lambda: embed_images(model, loader, device, on_images))
    image_emb, targets = image_emb.to(device), torch.tensor(labels, device=device)
    texts = [template.replace("{c}", name) for name in ds.classes for template in ds.templates]
    text_emb = embed_texts(model, tokenizer, texts, device).reshape(len(ds.classes), len(ds.templates), -1)
    prototypes = model.geometry.prototypes(text_emb)  # (C, D), the geometry's rule
    metrics = classification_metrics(model.geometry, image_emb, prototypes, targets, curv)
    if task.kind in ("wilds", "fairness"):
        meta_labels, metadata = read_metadata(data_dir)
        if not torch.equal(meta_labels, targets.cpu()):
            raise EvalError(f"task {task.key}: the shards' metadata pass does not line up with the images in {data_dir}")
        topk = top_classes(model.geometry, image_emb, prototypes, curv)
        metrics.update(wilds_metrics(task.key, topk.cpu(), targets.cpu(), metadata))
    return metrics


def import_openclip(spec: str, runs_dir: Path) -> Path:
    """An open_clip pretrained model (``ARCH:TAG``, TAG a pretrained name or a checkpoint file) as a run.

    The weights are written as a step-0 checkpoint of a clip-geometry run under ``runs_dir``, so
    evaluation, its resumable results and the reports treat it like a trained run.
    """
    import open_clip

    arch, _, tag = spec.partition(":")
    if not arch or not tag:
        raise EvalError(f"--openclip '{spec}': expected ARCH:TAG, e.g. ViT-B-32:datacomp_m_s128m_b4k")
    run_dir = runs_dir / ("openclip-" + "-".join(filter(None, [arch, Path(tag).stem if "/" in tag else tag])))
    if checkpoint.latest(run_dir / "checkpoints") is not None:
        return run_dir
    cfg = C.load_config(None, [f"model.arch={arch}", "geometry.name=clip", "eval.tasks=datacomp"])
    try:
        clip = open_clip.create_model(arch, pretrained=tag)
    except RuntimeError as err:  # open_clip's message for an unknown model or tag
        raise EvalError(f"--openclip '{spec}': {str(err).splitlines()[0]}") from None
    except OSError as err:  # the Hugging Face hub unreachable, or the file missing
        raise FetchError(f"--openclip '{spec}': could not load the weights ({str(err).splitlines()[0]}); "
                         f"check the network connection or the path") from None
    model = EuclipModel(cfg, clip=clip)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(C.dumps(cfg))
    (run_dir / "meta.json").write_text(json.dumps({"source": "open_clip pretrained", "arch": arch, "pretrained": tag},
                                                  indent=2))
    meta = {"arch": arch, "final_ln": True, "geometry": "clip", "logit": "cos", "blocks": cfg.geometry.blocks,
            "embed_dim": model.embed_dim}
    checkpoint.save({"model": model.state_dict(), "step": 0, "config": C.to_dict(cfg), "meta": meta},
                    run_dir / "checkpoints", 0, keep=1)
    return run_dir


def evaluate_winogavil(model: EuclipModel, cfg: C.Config, task: Task, data_dir: Path, device: torch.device,
                       batch_size: int, cache: FeatureCache, on_images: Callable[[int], None]) -> dict:
    """DataComp's WinoGAViL protocol on ``instances.jsonl`` + ``images/`` (``euclip download evalsets``)."""
    from PIL import Image

    instances_path = data_dir / "instances.jsonl"
    if not instances_path.exists():
        raise EvalError(f"task {task.key}: no data in {data_dir}: run 'euclip download evalsets --tasks {task.key}'")
    instances = [json.loads(line) for line in instances_path.read_text().splitlines() if line.strip()]
    names = sorted({c for inst in instances for c in inst["candidates"]})
    _, transform = transforms_for(model.clip)

    def images():
        for i in range(0, len(names), batch_size):
            chunk = names[i:i + batch_size]
            yield torch.stack([transform(Image.open(data_dir / "images" / f"{n}.jpg").convert("RGB")) for n in chunk]), chunk

    image_emb, order = cache.get(task, lambda: embed_images(model, images(), device, on_images))
    index = {name: i for i, name in enumerate(order)}
    image_emb = image_emb.to(device)
    # DataComp's prompt: the lower-cased cue after "A" or "An", no period.
    prompts = [("An " if inst["cue"].lower()[0] in "aeiou" else "A ") + inst["cue"].lower() for inst in instances]
    cue_emb = embed_texts(model, tokenizer_for(cfg.model.arch), prompts, device)
    candidates = [image_emb[[index[c] for c in inst["candidates"]]] for inst in instances]
    truth = [{inst["candidates"].index(a) for a in inst["associations"]} for inst in instances]
    return winogavil_metrics(model.geometry, cue_emb, candidates, truth, model.curvature())


def world_root(cfg: C.Config) -> Path:
    """The embedded world a run was trained on (its eval tasks sit beside its training shards)."""
    return C.train_dir(cfg).parent if cfg.data.dataset == "world" else Path("data") / "world"


def evaluate_run(run_dir: Path, device: torch.device, tasks: Optional[list[Task]] = None,
                 eval_root: Optional[Path] = None, world: Optional[Path] = None, batch_size: Optional[int] = None,
                 on_task: Optional[Callable[[Task, Optional[dict]], None]] = None,
                 on_images: Callable[[Task, int], None] = lambda task, n: None) -> list[dict]:
    """Score every task not yet in ``run_dir/eval.jsonl`` for this checkpoint; return its latest lines.

    Unset arguments come from the run's stored config (``eval.tasks``, ``eval.root``, the world it trained on).
    """
    model, cfg, ckpt, step = load_run(run_dir, device)
    tasks = tasks if tasks is not None else select(cfg.eval.tasks)
    eval_root = eval_root or Path(cfg.eval.root)
    world = world or world_root(cfg)
    batch_size = batch_size or cfg.eval.batch_size
    out_path = run_dir / "eval.jsonl"
    ckpt_name = str(ckpt.relative_to(run_dir))
    done = {r["key"] for r in read_results(out_path) if r.get("checkpoint") == ckpt_name and r.get("protocol") == PROTOCOL}
    cache = feature_cache(run_dir, ckpt)
    for task in tasks:
        if task.key in done:
            if on_task:
                on_task(task, None)
            continue
        metrics = evaluate_task(model, cfg, task, task.data_dir(eval_root, world), device, batch_size, cache,
                                lambda n, task=task: on_images(task, n))
        metrics["main_metric"] = metrics.get(task.main_metric) if task.main_metric else None
        line = {"key": task.key, "dataset": task.name, "metrics": metrics, "checkpoint": ckpt_name,
                "step": step, "protocol": PROTOCOL}
        with out_path.open("a+b") as f:  # appends always go to the end, whatever was read
            cut_short = False
            if f.tell() > 0:
                # A line cut short by a crash has no newline: end it, or this line would be glued to it.
                f.seek(-1, 2)
                cut_short = f.read(1) != b"\n"
            f.write((("\n" if cut_short else "") + json.dumps(line) + "\n").encode())
        if on_task:
            on_task(task, line)
    return latest_results(out_path)


def latest_results(path: Path) -> list[dict]:
    """One line per task: the newest, by checkpoint step then file order."""
    best: dict[str, dict] = {}
    for line in read_results(path):
        key = line["key"]
        if key not in best or line.get("step", 0) >= best[key].get("step", 0):
            best[key] = line
    return list(best.values())
