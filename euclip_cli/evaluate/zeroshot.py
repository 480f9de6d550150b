"""Geometry-aware zero-shot classification and retrieval metrics.

clip-benchmark supplies the datasets, class names, templates and ``recall_at_k``; its own
zero-shot loops hard-code cosine similarity and its accuracy helper breaks under numpy 2.4,
so the prototype rule, the logits and top-k accuracy here are euclip's. Everything takes
output-space embeddings and a geometry, so one code path serves every geometry.
"""

from __future__ import annotations

from typing import Optional

import torch
from clip_benchmark.metrics.zeroshot_retrieval import recall_at_k

from euclip_cli.geometry import Geometry


def classification_metrics(geometry: Geometry, image_emb: torch.Tensor, prototypes: torch.Tensor,
                           targets: torch.Tensor, curv: Optional[torch.Tensor] = None) -> dict[str, Optional[float]]:
    """acc1, acc5 (None under 5 classes) and mean per-class recall of nearest-prototype predictions.

    ``image_emb (N, D)``, ``prototypes (C, D)``, ``targets (N,)`` class indices.
    """
    scores = geometry.similarity(image_emb, prototypes, curv)  # (N, C)
    n_classes = prototypes.shape[0]
    topk = scores.topk(min(5, n_classes), dim=1).indices
    hit = topk == targets[:, None]
    pred = topk[:, 0]
    # Balanced accuracy, as sklearn's balanced_accuracy_score: mean over classes present in targets.
    recalls = [(pred[targets == c] == c).float().mean().item() for c in targets.unique()]
    return {
        "acc1": hit[:, 0].float().mean().item(),
        "acc5": hit.any(dim=1).float().mean().item() if n_classes >= 5 else None,
        "mean_per_class_recall": sum(recalls) / len(recalls),
    }


def retrieval_metrics(geometry: Geometry, image_emb: torch.Tensor, text_emb: torch.Tensor,
                      text_to_image: torch.Tensor, curv: Optional[torch.Tensor] = None,
                      ks: tuple[int, ...] = (1, 5, 10)) -> dict[str, float]:
    """Recall@k both ways and DataComp's mean_recall@1.

    ``image_emb (N_img, D)``, ``text_emb (N_txt, D)``, ``text_to_image (N_txt,)`` the image index of each
    caption. A query scores 1 at k when any true match is in its top k (clip-benchmark's rule).
    """
    scores = geometry.similarity(text_emb, image_emb, curv)  # (N_txt, N_img)
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(text_to_image)), text_to_image] = True
    out = {}
    for k in ks:
        # With fewer candidates than k, all of them are in the top k (topk itself refuses k > N).
        k_t2i, k_i2t = min(k, scores.shape[1]), min(k, scores.shape[0])
        out[f"image_retrieval_recall@{k}"] = (recall_at_k(scores, positive, k_t2i) > 0).float().mean().item()
        out[f"text_retrieval_recall@{k}"] = (recall_at_k(scores.T, positive.T, k_i2t) > 0).float().mean().item()
    out["mean_recall@1"] = (out["image_retrieval_recall@1"] + out["text_retrieval_recall@1"]) / 2
    return out
