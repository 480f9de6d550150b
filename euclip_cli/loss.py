"""Symmetric InfoNCE over geometry logits, plus lambda times the mean entailment loss."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from euclip_cli.geometry import Geometry


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Upcast half precision to fp32; leave fp32 and fp64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def contrastive(logits: torch.Tensor) -> torch.Tensor:
    """Mean of image->text and text->image cross-entropy; pair i matches pair i. ``(B, B) -> ()``."""
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def objective(geometry: Geometry, image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor,
              curv: Optional[torch.Tensor] = None, entail_weight: float = 0.0,
              min_radius: float = 0.1) -> dict[str, torch.Tensor]:
    """The training loss on matching pairs ``image[i], text[i]`` (output-space embeddings, ``(B, D)`` each).

    Returns ``{"loss": total, "contrastive": ..., "entailment": ...}``: every entry is a 0-dim tensor
    the trainer can log without knowing its name. Runs in fp32 with autocast disabled.
    """
    with torch.autocast(image.device.type, enabled=False):
        image, text = at_least_fp32(image), at_least_fp32(text)
        logits = logit_scale * geometry.similarity(image, text, curv)
        cont = contrastive(logits)
        out = {"contrastive": cont}
        total = cont
        if entail_weight > 0:
            # Text is the generic concept (the cone's apex), the image the specific one.
            entail = geometry.entailment(text, image, min_radius, curv).mean()
            out["entailment"] = entail
            total = total + entail_weight * entail
        out["loss"] = total
        return out
