"""Image-caption selection (SugarCrepe, Winoground) in every geometry.

clip-benchmark 1.6.2 scores these tasks (``metrics/image_caption_selection.py``) with the cosine of its
normalised features, right for the CLIP geometry only. The rule here is its rule with the geometry's
similarity in place of the cosine: an instance holds I images and T captions, image j belongs with caption
j for j < min(I, T), and the most similar candidate is the first of the tied maxima (``argmax``), as there.

SugarCrepe is read by clip-benchmark's own builder. Its Winoground reader loads ``facebook/winoground``
through the ``datasets`` library and the Hub at every start; ``WinogroundSet`` serves the same items from
the folder ``euclip download evalsets --tasks winoground`` writes (``examples.jsonl``, ``images/``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from PIL import Image

from euclip_cli.evaluate.selection_sets import WINOGROUND_EXAMPLES, WINOGROUND_IMAGES
from euclip_cli.geometry import Geometry


def selection_outcomes(geometry: Geometry, image_emb: torch.Tensor, text_emb: torch.Tensor,
                       curv: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
    """Each instance's outcomes, ``(N,)`` bool: ``text`` (every image picks its own caption), ``image``
    (every caption picks its own image) and ``group`` (both).

    ``image_emb (N, I, D)``, ``text_emb (N, T, D)``: instance n's images and captions in output space.
    """
    n, images, _ = image_emb.shape
    pairs = min(images, text_emb.shape[1])
    own = torch.arange(pairs, device=image_emb.device)
    text_ok, image_ok = [], []
    for i in range(n):
        scores = geometry.similarity(image_emb[i], text_emb[i], curv)  # (I, T)
        text_ok.append(bool((scores.argmax(dim=1)[:pairs] == own).all()))
        image_ok.append(bool((scores.argmax(dim=0)[:pairs] == own).all()))
    text, image = torch.tensor(text_ok, dtype=torch.bool), torch.tensor(image_ok, dtype=torch.bool)
    return {"text": text, "image": image, "group": text & image}


def selection_metrics(geometry: Geometry, image_emb: torch.Tensor, text_emb: torch.Tensor,
                      curv: Optional[torch.Tensor] = None, hits: Optional[dict] = None) -> dict[str, float]:
    """clip-benchmark's names: ``text_acc`` (Winoground's text score; SugarCrepe's accuracy), ``image_acc``
    (Winoground's image score; 1 on SugarCrepe, whose one image has no rival) and ``acc`` (the group score;
    SugarCrepe's accuracy). ``hits``, when given, receives ``acc``'s per-instance outcome."""
    found = selection_outcomes(geometry, image_emb, text_emb, curv)
    if hits is not None:
        hits["acc"] = found["group"]
    return {"image_acc": found["image"].float().mean().item(), "text_acc": found["text"].float().mean().item(),
            "acc": found["group"].float().mean().item()}


class WinogroundSet(torch.utils.data.Dataset):
    """Winoground's 400 instances from ``root/examples.jsonl`` and ``root/images/``: item i is
    ``(images (2, C, H, W) after ``transform``, [caption_0, caption_1])``, clip-benchmark's WinoGround's item."""

    def __init__(self, root: Path, transform=None):
        self.root, self.transform = Path(root), transform
        lines = (self.root / WINOGROUND_EXAMPLES).read_text().splitlines()
        self.examples = [json.loads(line) for line in lines if line.strip()]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int):
        example = self.examples[i]
        images = [Image.open(self.root / WINOGROUND_IMAGES / example[f"image_{k}"]) for k in (0, 1)]
        if self.transform is not None:
            images = torch.stack([self.transform(image) for image in images])
        return images, [example["caption_0"], example["caption_1"]]
