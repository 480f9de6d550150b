"""Can an image tower see the embedded world? A probe outside CLIP's trainer, from labels or captions.

    python examples/tower-probe/probe.py --arch tiny-vit-conv --steps 200 --lr 2e-3

Builds ``--arch``'s image tower (``euclip_cli.towers.build_clip``) and trains it on single-object
world scenes rendered on the fly, JPEG-encoded as the shards are, through the arch's eval
transform. ``--objective labels`` (the default): two linear heads, cross-entropy on the shape (12
classes) and the position (5 cells). ``--objective contrastive``: CLIP's symmetric loss between
the image embeddings and a learned table of 60 "captions", one per (shape, position), with
CLIP's learned logit scale from 1/0.07; a batch's repeated captions are negatives, as in CLIP.
``--objective text``: the same, with the 60 captions ("a star on the left") embedded by the arch's
own text tower, trained alongside as in CLIP. Accuracy is then zero-shot: the nearest of the 60
captions names a shape and a position. ``--pairs world`` (with ``--objective text``) trains on the
world's own pairs instead, drawn as ``euclip download world`` draws them (1-3 objects, captions at
five levels, ``--mismatch`` of them describing another scene; ``--objects`` and ``--levels`` narrow
that), and still tests on single objects.
It prints, before training, the mean pairwise cosine of the tower's embeddings of the first 64
held-out scenes (in train mode, so a BatchNorm tower uses batch statistics), and then, at each
quarter of the run, the accuracies on the 1,000 held-out scenes.

A research aid for the search in docs/embedded-world.md, not part of the CLI: it separates "the
tower cannot learn the world's spatial features" from "CLIP's signal does not teach them", the
contrastive objective from the text tower learned beside it, and both from the world's scenes.
"""

from __future__ import annotations

import argparse
import io
import math
import random
import sys
import time

import torch
from PIL import Image
from torch import nn

from euclip_cli.data.world import (LEVELS, POSITIONS, POSITION_PHRASE, SHAPES, encode_jpeg, render, sample_scene,
                                   training_pair)
from euclip_cli.errors import EuclipError
from euclip_cli.loss import contrastive as contrastive_loss
from euclip_cli.towers import build_clip, tokenizer_for, transforms_for
from euclip_cli.towers.archs import lookup


def as_read_from_shards(image: Image.Image, transform) -> torch.Tensor:
    """``image -> (3, H, W)``: JPEG-encoded as the shards store it, decoded and transformed as training reads it."""
    return transform(Image.open(io.BytesIO(encode_jpeg(image))).convert("RGB"))


def scenes(rng: random.Random, n: int, transform) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` single-object scenes: images ``(n, 3, H, W)``, shape labels ``(n,)``, position labels ``(n,)``."""
    images, shapes, cells = [], [], []
    cell_names = list(POSITIONS)
    for _ in range(n):
        scene = sample_scene(rng, count=1)
        images.append(as_read_from_shards(render(scene, rng), transform))
        shapes.append(SHAPES.index(scene[0].shape))
        cells.append(cell_names.index(scene[0].position))
    return torch.stack(images), torch.tensor(shapes), torch.tensor(cells)


def world_pairs(rng: random.Random, n: int, transform, mismatch: float, objects: int | None,
                levels: list[str]) -> tuple[torch.Tensor, list[str]]:
    """``n`` pairs drawn as ``euclip download world`` draws them: images ``(n, 3, H, W)`` and captions.

    ``objects`` pins the object count (None: the world's 1-3); ``levels`` are the caption levels
    allowed, at the world's relative weights.
    """
    images, captions = [], []
    for _ in range(n):
        image, caption, *_ = training_pair(rng, mismatch, count=objects, levels=levels)
        images.append(as_read_from_shards(image, transform))
        captions.append(caption)
    return torch.stack(images), captions


def mean_pairwise_cosine(features: torch.Tensor) -> float:
    """``(n, d) -> ()``: the mean cosine over the n(n-1) ordered pairs of distinct rows."""
    unit = nn.functional.normalize(features, dim=-1)
    off_diagonal = ~torch.eye(len(unit), dtype=torch.bool)
    return (unit @ unit.T)[off_diagonal].mean().item()


def caption_ids(shape: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """``(n,), (n,) -> (n,)``: the index of the (shape, position) caption in the contrastive table."""
    return shape * len(POSITIONS) + cell


def clip_loss(images: torch.Tensor, captions: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """``(n, d), (n, d), () -> ()``: CLIP's symmetric cross-entropy; row i of each side is a pair."""
    return contrastive_loss(logit_scale.exp() * nn.functional.normalize(images, dim=-1)
                            @ nn.functional.normalize(captions, dim=-1).T)


def positive(text: str) -> int:
    """argparse's type for counts: a zero step count or warm-up would divide by zero in the schedule."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive whole number")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="tiny-vit")
    parser.add_argument("--objective", choices=["labels", "contrastive", "text"], default="labels")
    parser.add_argument("--pairs", choices=["single", "world"], default="single",
                        help="training data: single-object scenes, or the world's pairs (--objective text only)")
    parser.add_argument("--mismatch", type=float, default=0.1, help="with --pairs world: the share of false captions")
    parser.add_argument("--objects", type=positive, default=None,
                        help="with --pairs world: objects per scene (default: the world's 1-3)")
    parser.add_argument("--levels", default=",".join(LEVELS),
                        help=f"with --pairs world: caption levels, comma-separated (default: all, {','.join(LEVELS)})")
    parser.add_argument("--steps", type=positive, default=200)
    parser.add_argument("--batch", type=positive, default=128)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--warmup", type=positive, default=20)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--test", type=positive, default=1000, help="held-out scenes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.pairs == "world" and args.objective != "text":
        parser.error("--pairs world needs --objective text: the world's captions are free text")
    if not 0 <= args.mismatch < 1:
        parser.error(f"--mismatch: {args.mismatch} is not in [0, 1)")
    levels = args.levels.split(",")
    if unknown := sorted(set(levels) - set(LEVELS)):
        parser.error(f"--levels: unknown level {', '.join(unknown)}; choose from {', '.join(LEVELS)}")

    torch.manual_seed(args.seed)
    clip = build_clip(args.arch)
    tower = clip.visual.train()
    _, transform = transforms_for(clip)
    width = lookup(args.arch).embed_dim
    heads = nn.ModuleDict({"shape": nn.Linear(width, len(SHAPES)), "position": nn.Linear(width, len(POSITIONS))})
    every_caption = torch.arange(len(SHAPES) * len(POSITIONS))
    # CLIP's initial temperature 0.07, learned in log space as open_clip does.
    logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
    contrastive = args.objective != "labels"
    if args.objective == "text":
        # In caption_ids' order: shape-major, position-minor.
        tokenize = tokenizer_for(args.arch)
        tokens = tokenize([f"a {shape} {POSITION_PHRASE[cell]}" for shape in SHAPES for cell in POSITIONS])
        captions = [p for name, p in clip.named_parameters() if not name.startswith("visual.") and name != "logit_scale"]

        def embed_captions(ids: torch.Tensor) -> torch.Tensor:
            return clip.encode_text(tokens[ids])
    else:
        embed_captions = nn.Embedding(len(every_caption), width)
        captions = [*embed_captions.parameters()]

    train_rng, test_rng = random.Random(args.seed + 1), random.Random(args.seed + 99)
    x_test, shape_test, cell_test = scenes(test_rng, args.test, transform)
    sample = x_test[:64]
    with torch.no_grad():
        print(f"{args.arch}: mean pairwise cosine of {len(sample)} embeddings at initialisation "
              f"{mean_pairwise_cosine(tower(sample)):.3f}", flush=True)

    trained = [*captions, logit_scale] if contrastive else [*heads.parameters()]
    optimizer = torch.optim.AdamW([*tower.parameters(), *trained], lr=args.lr, weight_decay=args.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / args.warmup)
                                                 * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    start = time.time()
    for step in range(1, args.steps + 1):
        if args.pairs == "world":
            x, texts = world_pairs(train_rng, args.batch, transform, args.mismatch, args.objects, levels)
            loss = clip_loss(tower(x), clip.encode_text(tokenize(texts)), logit_scale)
        else:
            x, shape, cell = scenes(train_rng, args.batch, transform)
            features = tower(x)
            if contrastive:
                loss = clip_loss(features, embed_captions(caption_ids(shape, cell)), logit_scale)
            else:
                loss = (nn.functional.cross_entropy(heads["shape"](features), shape)
                        + nn.functional.cross_entropy(heads["position"](features), cell))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % max(1, args.steps // 4) == 0 or step == args.steps:
            # Test features in train mode as well: a BatchNorm tower is then judged as it trains.
            with torch.no_grad():
                features = torch.cat([tower(chunk) for chunk in x_test.split(250)])
                if contrastive:
                    nearest = (nn.functional.normalize(features, dim=-1)
                               @ nn.functional.normalize(embed_captions(every_caption), dim=-1).T).argmax(1)
                    shape_pred, cell_pred = nearest // len(POSITIONS), nearest % len(POSITIONS)
                else:
                    shape_pred, cell_pred = heads["shape"](features).argmax(1), heads["position"](features).argmax(1)
                shape_acc = (shape_pred == shape_test).float().mean().item()
                cell_acc = (cell_pred == cell_test).float().mean().item()
            print(f"step {step}: loss {loss.item():.3f}, shape {100 * shape_acc:.1f}%, "
                  f"position {100 * cell_acc:.1f}% ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    try:
        main()
    except EuclipError as error:  # e.g. an unknown --arch: one line and euclip's exit code, no traceback
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
