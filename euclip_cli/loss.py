"""Symmetric InfoNCE over geometry logits, or SigLIP's sigmoid loss on them plus a learnable bias, plus
lambda times the mean entailment loss; or HyCoCLIP's compositional loss on (image, box image, text, box
text) quadruples (``hycoclip_objective``).

``objective`` is the loss of a whole batch. ``local_objective`` is one rank's share of the loss of
the global batch (DataComp's ``--local-loss --gather-with-grad``): its images' logits against every
text and its texts' against every image, ``(b, B)`` each rather than the global ``(B, B)``; the
ranks' shares add up to the global loss, and through a gather that carries gradients the sum's
gradient reaches every rank's features.
"""

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


def sigmoid_pairs(logits: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """SigLIP's loss summed over every pair, -log sigmoid(z * logit) with z = 1 for a matching pair and -1
    for every other: ``logits (b, B)`` are images ``offset ..`` of the batch against all its texts, so row i
    matches column ``offset + i``. ``-> ()``, a sum (SigLIP divides by the batch)."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    signs = torch.full_like(logits, -1.0)
    signs[rows, rows + offset] = 1.0
    return -F.logsigmoid(signs * logits).sum()


def objective(geometry: Geometry, image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor,
              curv: Optional[torch.Tensor] = None, entail_weight: float = 0.0,
              min_radius: float = 0.1, logit_bias: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
    """The training loss on matching pairs ``image[i], text[i]`` (output-space embeddings, ``(B, D)`` each).
    ``logit_bias``: SigLIP's bias b (0-dim); given, the pairwise term is its sigmoid loss on
    ``logit_scale * sim + b`` over every pair, divided by B, instead of InfoNCE.

    Returns ``{"loss": total, "contrastive": ..., "entailment": ...}``: every entry is a 0-dim tensor
    the trainer can log without knowing its name. Runs in fp32 with autocast disabled.
    """
    with torch.autocast(image.device.type, enabled=False):
        image, text = at_least_fp32(image), at_least_fp32(text)
        logits = logit_scale * geometry.similarity(image, text, curv)
        cont = (contrastive(logits) if logit_bias is None
                else sigmoid_pairs(logits + logit_bias) / logits.shape[0])
        out = {"contrastive": cont}
        total = cont
        if entail_weight > 0:
            # Text is the generic concept (the cone's apex), the image the specific one.
            entail = geometry.entailment(text, image, min_radius, curv).mean()
            out["entailment"] = entail
            total = total + entail_weight * entail
        out["loss"] = total
        return out


def _rows_cross_entropy(logits: torch.Tensor, offset: int) -> torch.Tensor:
    """Summed cross-entropy of rows ``logits (b, B)`` whose row i matches column ``offset + i``. ``-> ()``."""
    labels = torch.arange(offset, offset + logits.shape[0], device=logits.device)
    return F.cross_entropy(logits, labels, reduction="sum")


def local_contrastive(rows: torch.Tensor, columns: torch.Tensor, offset: int, total: int) -> torch.Tensor:
    """One rank's share of ``contrastive`` on a global batch of ``total`` pairs: ``rows (b, B)`` are its
    images' logits against every text, ``columns (b, B)`` its texts' against every image (a column of the
    global matrix, transposed), and its pair i is the global pair ``offset + i``. ``-> ()``."""
    return (_rows_cross_entropy(rows, offset) + _rows_cross_entropy(columns, offset)) / (2 * total)


def local_objective(geometry: Geometry, image: torch.Tensor, text: torch.Tensor, all_images: torch.Tensor,
                    all_texts: torch.Tensor, offset: int, logit_scale: torch.Tensor,
                    curv: Optional[torch.Tensor] = None, entail_weight: float = 0.0,
                    min_radius: float = 0.1, logit_bias: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
    """This rank's share of ``objective`` on the global batch ``all_images, all_texts`` (``(B, D)``), whose
    pairs ``offset ..`` are this rank's ``image, text`` (``(b, D)``): summed over ranks, each entry is the
    global batch's. The entailment term is a mean over pairs, so each rank adds its own pairs' over B.
    SigLIP's loss (``logit_bias`` given) counts each pair once: a rank's share is its images' rows."""
    with torch.autocast(image.device.type, enabled=False):
        image, text = at_least_fp32(image), at_least_fp32(text)
        all_images, all_texts = at_least_fp32(all_images), at_least_fp32(all_texts)
        total = all_images.shape[0]
        rows = logit_scale * geometry.similarity(image, all_texts, curv)
        if logit_bias is not None:
            cont = sigmoid_pairs(rows + logit_bias, offset) / total
        else:
            # The global matrix's columns for this rank's texts, as objective's logits.T holds them.
            columns = (logit_scale * geometry.similarity(all_images, text, curv)).T
            cont = local_contrastive(rows, columns, offset, total)
        out = {"contrastive": cont}
        loss = cont
        if entail_weight > 0:
            entail = geometry.entailment(text, image, min_radius, curv).sum() / total
            out["entailment"] = entail
            loss = loss + entail_weight * entail
        out["loss"] = loss
        return out


# HyCoCLIP's cones (hycoclip/models.py, HyCoCLIP.forward): across modalities (text over its image, box text
# over its box image) the half-aperture is narrowed to 0.7 of its value; within one (box image over its
# image, box text over its text) widened to 1.2.
INTER_MODAL_APERTURE = 0.7
INTRA_MODAL_APERTURE = 1.2


def local_hycoclip_objective(geometry: Geometry, image: torch.Tensor, text: torch.Tensor, box_image: torch.Tensor,
                             box_text: torch.Tensor, all_images: torch.Tensor, all_texts: torch.Tensor, offset: int,
                             logit_scale: torch.Tensor, curv: Optional[torch.Tensor] = None,
                             entail_weight: float = 0.0, min_radius: float = 0.1) -> dict[str, torch.Tensor]:
    """This rank's share of ``hycoclip_objective`` on a global batch of ``all_images, all_texts`` (``(B, D)``),
    whose pairs ``offset ..`` are this rank's quadruples ``image, text, box_image, box_text`` (``(b, D)``
    each). HyCoCLIP's own code computes exactly this share on each rank (its features gathered with their
    gradients, its cross-entropies averaged over the rank's rows, and DDP's mean over ranks), so the shares
    summed are the global loss. Box images and box texts are never negatives: only the whole images and
    texts are gathered."""
    with torch.autocast(image.device.type, enabled=False):
        image, text, box_image, box_text, all_images, all_texts = (
            at_least_fp32(x) for x in (image, text, box_image, box_text, all_images, all_texts))
        total = all_images.shape[0]

        def rows(x: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
            return _rows_cross_entropy(logit_scale * geometry.similarity(x, others, curv), offset)

        # Four terms at a quarter each: an image and its box image against every text, a text and its box
        # text against every image.
        cont = (rows(image, all_texts) + rows(text, all_images) + rows(box_image, all_texts)
                + rows(box_text, all_images)) / (4 * total)
        out = {"contrastive": cont}
        loss = cont
        if entail_weight > 0:
            def cone(generic: torch.Tensor, specific: torch.Tensor, factor: float) -> torch.Tensor:
                return geometry.entailment(generic, specific, min_radius, curv, factor).sum() / total

            parts = {"entail_text_image": cone(text, image, INTER_MODAL_APERTURE),
                     "entail_box_text_box_image": cone(box_text, box_image, INTER_MODAL_APERTURE),
                     "entail_box_image_image": cone(box_image, image, INTRA_MODAL_APERTURE),
                     "entail_box_text_text": cone(box_text, text, INTRA_MODAL_APERTURE)}
            # HyCoCLIP halves the sum of its four means (not a mean of them).
            entail = 0.5 * sum(parts.values())
            out |= parts | {"entailment": entail}
            loss = loss + entail_weight * entail
        out["loss"] = loss
        return out


def hycoclip_objective(geometry: Geometry, image: torch.Tensor, text: torch.Tensor, box_image: torch.Tensor,
                       box_text: torch.Tensor, logit_scale: torch.Tensor, curv: Optional[torch.Tensor] = None,
                       entail_weight: float = 0.0, min_radius: float = 0.1) -> dict[str, torch.Tensor]:
    """HyCoCLIP's loss (Pal et al., 2025; ``HyCoCLIP.forward`` in its code) on quadruples ``image[i], text[i],
    box_image[i], box_text[i]`` (output-space embeddings, ``(B, D)`` each), on the geometry's logits:

    - contrastive, a quarter each: image -> every text, text -> every image, box image -> every text, box
      text -> every image;
    - entailment (where ``entail_weight`` > 0), half the sum of four mean cone losses: text over image and box
      text over box image with the aperture at 0.7, box image over image and box text over text at 1.2.

    In the hyperbolic geometry with the d logit this is HyCoCLIP's; in Euclidean cones it is euclip's own.
    Returns the terms as ``objective`` does, the four cone losses among them."""
    return local_hycoclip_objective(geometry, image, text, box_image, box_text, image, text, 0, logit_scale, curv,
                                    entail_weight, min_radius)
