"""Retrieval on the embedded world for tiny-euclip seeds 0-2: hits each way, top-1 ties, and the share of
per-query hits two seeds have in common."""
import glob, sys
from pathlib import Path
import torch
from euclip_cli.encode import embed_texts, load_model
from euclip_cli.rundir import RunDir
from euclip_cli.towers import tokenizer_for

runs = sys.argv[1:]
hits = {}
for path in runs:
    model, cfg, _, _ = load_model(RunDir(Path(path)), torch.device("cpu"))
    cached = torch.load(glob.glob(f"{path}/features/*/world__retrieval@*.pt")[0], weights_only=True)
    images, captions = cached["image_emb"], cached["labels"]
    texts = [c for caps in captions for c in caps]
    owner = torch.tensor([i for i, caps in enumerate(captions) for _ in caps])
    scores = model.geometry.similarity(embed_texts(model, tokenizer_for(cfg.model.arch), texts), images, None)
    t2i = scores.topk(1, dim=1).indices[:, 0] == owner
    per_image = scores.T
    i2t = owner[per_image.topk(1, dim=1).indices[:, 0]] == torch.arange(len(images))
    best = per_image.max(dim=1, keepdim=True).values
    tied = (per_image == best).sum(1) > 1
    any_own = torch.tensor([bool(((per_image[j] == best[j, 0]) & (owner == j)).any()) for j in range(len(images))])
    hits[path] = t2i
    print(f"{Path(path).name}: captions {len(texts)} ({len(set(texts))} distinct), text->image hits {int(t2i.sum())}, "
          f"image->text hits {int(i2t.sum())}, a + 2b = {int(t2i.sum()) + 2 * int(i2t.sum())}, mean R@1 "
          f"{100 * (t2i.float().mean() + i2t.float().mean()).item() / 2:.3f}; images whose top texts tie: "
          f"{int(tied.sum())}, of which the own caption is among the tied: {int((tied & any_own).sum())}, "
          f"image->text hits counting any tied own caption: {int(any_own.sum())}")
names = list(hits)
for i in range(len(names)):
    for j in range(i + 1, len(names)):
        a, b = hits[names[i]], hits[names[j]]
        print(f"text->image hits shared by {Path(names[i]).name} and {Path(names[j]).name}: {int((a & b).sum())}")
