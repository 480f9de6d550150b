"""A run's embeddings of the embedded world's evaluation images and captions, for the analyses.

Pairs come from the retrieval task (each image with its first caption), classes from every
classification task (images, labels and the geometry's class prototypes; image features are
shared with ``euclip eval``'s per-checkpoint cache). Everything is in the geometry's output
space, as ``similarity`` consumes it (tangent vectors for hyperbolic runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

import torch
from clip_benchmark.datasets.builder import build_dataset, image_captions_collate_fn

from euclip_cli import config as C
from euclip_cli.worlddir import WorldDir
from euclip_cli.encode import embed_images, embed_texts, feature_cache, files_identity, load_model
from euclip_cli.errors import UsageError
from euclip_cli.protocol.tasks import TASKS, list_tasks
from euclip_cli.geometry import Geometry
from euclip_cli.rundir import RunDir
from euclip_cli.towers import tokenizer_for, transforms_for


@dataclass
class ClassTask:
    images: torch.Tensor  # (M, D)
    labels: torch.Tensor  # (M,)
    prototypes: torch.Tensor  # (C, D) the geometry's class prototypes


@dataclass
class RunEmbeddings:
    geometry: Geometry
    curv: Optional[torch.Tensor]
    image: torch.Tensor  # (N, D) retrieval images
    text: torch.Tensor  # (N, D) their first captions, row-aligned with ``image``
    classes: dict[str, "ClassTask"]  # every classification task of the world, by task key
    scale: float  # the run's logit scale exp(t)
    vocabulary: Optional[torch.Tensor] = None  # (V, D) extra captions, when asked for


@torch.no_grad()
def collect(run_dir: Path, device: torch.device, world: Optional[Path] = None, batch_size: int = 64,
            vocabulary: Optional[list[str]] = None, at_init: bool = False) -> RunEmbeddings:
    """``at_init``: the untrained model the run started from, not its latest checkpoint."""
    run = RunDir(run_dir)
    model, cfg, ckpt, _ = load_model(run, device, at_init)
    world = world or C.world_dir(cfg)
    _, transform = transforms_for(model.clip)
    tokenizer = tokenizer_for(cfg.model.arch)
    tasks = [t for t in list_tasks("world") if t.kind == "classification"]
    for task in [TASKS["world/retrieval"], *tasks]:
        if not (task.data_dir(Path(), world) / "test" / "nshards.txt").exists():
            raise UsageError(f"no embedded-world task '{task.key}' under {world}/eval: run 'euclip download world'")
    cache = feature_cache(run, ckpt, model, WorldDir(world).identity())

    retrieval = build_dataset("wds/world/retrieval", root=str(WorldDir(world).task("retrieval")), transform=transform,
                              split="test", task="zeroshot_retrieval")
    loader = torch.utils.data.DataLoader(retrieval.batched(batch_size, collation_fn=image_captions_collate_fn),
                                         batch_size=None, num_workers=0)
    image, captions = cache.get("world/retrieval", lambda: embed_images(model, loader, device, lambda n: None),
                                per_world=True)
    text = embed_texts(model, tokenizer, [caps[0] for caps in captions])

    classes = {}
    for task in tasks:
        ds = build_dataset("wds/" + task.key, root=str(task.data_dir(Path(), world)), transform=transform, split="test")
        loader = torch.utils.data.DataLoader(ds.batched(batch_size), batch_size=None, num_workers=0)
        images, labels = cache.get(task.key, lambda: embed_images(model, loader, device, lambda n: None), per_world=True)
        prompts = [template.replace("{c}", name) for name in ds.classes for template in ds.templates]
        templates = embed_texts(model, tokenizer, prompts).reshape(len(ds.classes), len(ds.templates), -1)
        classes[task.key] = ClassTask(images.cpu(), torch.tensor(labels), model.geometry.prototypes(templates).cpu())
    curv = model.curvature()
    extra = embed_texts(model, tokenizer, vocabulary).cpu() if vocabulary else None
    return RunEmbeddings(model.geometry, None if curv is None else curv.detach().cpu(), image.cpu(), text.cpu(),
                         classes, model.logit_scale().item(), extra)


class TrainingPairs(NamedTuple):
    geometry: Geometry
    curv: Optional[torch.Tensor]
    image: torch.Tensor  # (N, D)
    text: torch.Tensor  # (N, D)
    scale: float  # the run's logit scale exp(t)


@torch.no_grad()
def training_pairs(run_dir: Path, device: torch.device, samples: int, batch_size: int = 64,
                   at_init: bool = False) -> TrainingPairs:
    """The run's geometry and scalars with the embeddings of the first ``samples`` pairs of its
    training shards, in shard order, through the evaluation transform (no augmentation).

    Cached with the checkpoint's other features: distances and traversals share one pass.
    """
    import webdataset as wds

    from euclip_cli.data.loader import list_shards

    run = RunDir(run_dir)
    model, cfg, ckpt, _ = load_model(run, device, at_init)
    _, transform = transforms_for(model.clip)
    tokenizer = tokenizer_for(cfg.model.arch)
    hint = "euclip download world" if cfg.data.dataset == "world" else f"euclip download --recipe {cfg.recipe}"

    def compute() -> tuple[torch.Tensor, list]:
        pipeline = (wds.WebDataset(list_shards(C.train_dir(cfg), hint), shardshuffle=False,
                                   handler=wds.ignore_and_continue)
                    .decode("pilrgb", handler=wds.ignore_and_continue)
                    .to_tuple("jpg;png;webp;jpeg", "txt", handler=wds.ignore_and_continue))
        images, texts, image_emb, text_emb, captions = [], [], [], [], []

        def flush() -> None:
            if images:
                image_emb.append(model.encode_image(torch.stack(images).to(device)).cpu())
                text_emb.append(embed_texts(model, tokenizer, texts).cpu())
                images.clear()
                texts.clear()

        for image, caption in pipeline:
            if len(captions) == samples:
                break
            images.append(transform(image))
            texts.append(caption)
            captions.append(caption)
            if len(images) == batch_size:
                flush()
        flush()
        # One tensor (2, N, D): the cache stores an embedding tensor and a list per name.
        return torch.stack([torch.cat(image_emb), torch.cat(text_emb)]), captions

    cache = feature_cache(run, ckpt, model).with_files(files_identity(C.train_dir(cfg)))
    both, _ = cache.get(f"train-pairs-{samples}", compute)
    curv = model.curvature()
    return TrainingPairs(model.geometry, None if curv is None else curv.detach().cpu(), both[0], both[1],
                         model.logit_scale().item())


def paper_root(run_dir: Path, device: torch.device, samples: int, at_init: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``([ROOT] (D,), training embeddings (2N, D))`` as the papers define them.

    The origin for origin-rooted geometries; for mean-rooted ones the L2-normalised (projected)
    mean of the images and captions of the first ``samples`` training pairs (EuCLIP appendix B:
    "the embedding average of all the training text and images after L2 normalization"; the
    world's pairs are drawn independently, so a prefix is a random sample of them).
    """
    try:
        pairs = training_pairs(run_dir, device, samples, at_init=at_init)
    except UsageError as e:
        raise UsageError(f"{e} (the paper protocol takes [ROOT] from training pairs; --protocol euclip takes it "
                         f"from the analysed pairs instead)") from None
    both = torch.cat([pairs.image, pairs.text])
    return pairs.geometry.project(pairs.geometry.root(both)), both


@torch.no_grad()
def folder_embeddings(run_dir: Path, device: torch.device, image_dir: Path, captions: list[str],
                      batch_size: int = 64) -> tuple[Geometry, Optional[torch.Tensor], list[str], torch.Tensor,
                                                     torch.Tensor]:
    """``(geometry, curv, image names, image (N, D), captions (C, D))`` for a folder of images and a caption list."""
    from PIL import Image

    model, cfg, _, _ = load_model(RunDir(run_dir), device)
    _, transform = transforms_for(model.clip)
    paths = sorted(p for p in image_dir.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"))
    if not paths:
        raise UsageError(f"no images (.jpg, .jpeg, .png, .webp) in {image_dir}")
    def image(path: Path):
        try:
            return Image.open(path).convert("RGB")
        except (OSError, ValueError) as err:  # PIL's UnidentifiedImageError is an OSError; a cut file, too
            raise UsageError(f"{path} is not an image PIL can read ({type(err).__name__}): remove it from "
                             f"{image_dir} or replace it") from None

    embs = []
    for i in range(0, len(paths), batch_size):
        batch = torch.stack([transform(image(p)) for p in paths[i:i + batch_size]])
        embs.append(model.encode_image(batch.to(device)).cpu())
    text = embed_texts(model, tokenizer_for(cfg.model.arch), captions).cpu()
    curv = model.curvature()
    return (model.geometry, None if curv is None else curv.detach().cpu(), [p.name for p in paths], torch.cat(embs),
            text)
