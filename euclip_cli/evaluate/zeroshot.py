"""Geometry-aware zero-shot classification and retrieval metrics.

clip-benchmark supplies the datasets, class names, templates and ``recall_at_k``; its own
zero-shot loops hard-code cosine similarity and its accuracy helper breaks under numpy 2.4,
so the prototype rule, the logits and top-k accuracy here are euclip's, as are the
group metrics of DataComp's WILDS and fairness evaluators (DataComp patches the ``wilds``
package to run them; the arithmetic is a few lines). Everything takes
output-space embeddings and a geometry, so one code path serves every geometry.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch
from clip_benchmark.metrics.zeroshot_retrieval import recall_at_k

from euclip_cli.geometry import Geometry


def top_classes(geometry: Geometry, image_emb: torch.Tensor, prototypes: torch.Tensor,
                curv: Optional[torch.Tensor] = None, k: int = 5) -> torch.Tensor:
    """``(N, min(k, C))`` class indices, most similar prototype first, in the geometry's similarity."""
    scores = geometry.similarity(image_emb, prototypes, curv)  # (N, C)
    return scores.topk(min(k, prototypes.shape[0]), dim=1).indices


def classification_metrics(geometry: Geometry, image_emb: torch.Tensor, prototypes: torch.Tensor,
                           targets: torch.Tensor, curv: Optional[torch.Tensor] = None,
                           hits: Optional[dict] = None) -> dict[str, Optional[float]]:
    """acc1, acc5 (None under 5 classes) and mean per-class recall of nearest-prototype predictions.

    ``image_emb (N, D)``, ``prototypes (C, D)``, ``targets (N,)`` class indices. ``hits``, when given,
    receives ``acc1``'s per-image outcome, ``(N,)`` bool: what a paired comparison of two models on the
    same images reads (``stats.paired_proportion_se``).
    """
    n_classes = prototypes.shape[0]
    topk = top_classes(geometry, image_emb, prototypes, curv)
    hit = topk == targets[:, None]
    pred = topk[:, 0]
    if hits is not None:
        hits["acc1"] = hit[:, 0].cpu()
    # Balanced accuracy, as sklearn's balanced_accuracy_score: mean over classes present in targets.
    recalls = [(pred[targets == c] == c).float().mean().item() for c in targets.unique()]
    return {
        "acc1": hit[:, 0].float().mean().item(),
        "acc5": hit.any(dim=1).float().mean().item() if n_classes >= 5 else None,
        "mean_per_class_recall": sum(recalls) / len(recalls),
    }


def retrieval_metrics(geometry: Geometry, image_emb: torch.Tensor, text_emb: torch.Tensor,
                      text_to_image: torch.Tensor, curv: Optional[torch.Tensor] = None,
                      ks: tuple[int, ...] = (1, 5, 10), hits: Optional[dict] = None) -> dict[str, float]:
    """Recall@k both ways and DataComp's mean_recall@1.

    ``image_emb (N_img, D)``, ``text_emb (N_txt, D)``, ``text_to_image (N_txt,)`` the image index of each
    caption. A query scores 1 at k when any true match is in its top k (clip-benchmark's rule). ``hits``,
    when given, receives each query's outcome at k = 1: ``image_retrieval_recall@1 (N_txt,)`` and
    ``text_retrieval_recall@1 (N_img,)``, bool.
    """
    scores = geometry.similarity(text_emb, image_emb, curv)  # (N_txt, N_img)
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(text_to_image)), text_to_image] = True
    out = {}
    for k in ks:
        # With fewer candidates than k, all of them are in the top k (topk itself refuses k > N).
        k_t2i, k_i2t = min(k, scores.shape[1]), min(k, scores.shape[0])
        t2i, i2t = recall_at_k(scores, positive, k_t2i) > 0, recall_at_k(scores.T, positive.T, k_i2t) > 0
        out[f"image_retrieval_recall@{k}"], out[f"text_retrieval_recall@{k}"] = t2i.float().mean().item(), i2t.float().mean().item()
        if hits is not None and k == 1:
            hits.update({"image_retrieval_recall@1": t2i.cpu(), "text_retrieval_recall@1": i2t.cpu()})
    out["mean_recall@1"] = (out["image_retrieval_recall@1"] + out["text_retrieval_recall@1"]) / 2
    return out


def group_means(values: torch.Tensor, groups: torch.Tensor) -> dict[int, float]:
    """Mean of ``values (N,)`` for each group id in ``groups (N,)`` that has members."""
    return {int(g): values[groups == g].float().mean().item() for g in groups.unique()}


def worst_group(values: torch.Tensor, groups: torch.Tensor) -> float:
    """WILDS' worst-group number: the minimum over groups with a non-zero count."""
    return min(group_means(values, groups).values())


def macro_over_present(metric: Callable, targets: torch.Tensor, pred: torch.Tensor) -> float:
    """A macro-averaged sklearn metric over the labels present in ``targets`` (as WILDS passes them)."""
    y_true, y_pred = targets.cpu().numpy(), pred.cpu().numpy()
    return float(metric(y_true, y_pred, average="macro", labels=np.unique(y_true), zero_division=0))


def wilds_metrics(task_key: str, topk: torch.Tensor, targets: torch.Tensor,
                  metadata: torch.Tensor) -> dict[str, float]:
    """The extra metrics DataComp's WILDS and fairness evaluators add to a classification pass.

    ``topk (N, k)`` predicted classes, ``targets (N,)``, ``metadata (N, F)`` the shards' ``npy``
    arrays, whose columns are the evaluators' metadata fields:
    iWildCam [location, sequence, year, month, day, hour, minute, second, y], Camelyon17
    [hospital, slide, y], FMoW [region, year, y], Dollar Street [income_ds, income_meta, region],
    GeoDE [region, country].
    """
    hit = topk[:, 0] == targets
    if task_key == "wilds/iwildcam":
        # Imported here: scikit-learn adds over a second to the start of every eval, and only iWildCam needs it.
        from sklearn.metrics import f1_score, recall_score

        return {"acc_avg": hit.float().mean().item(),
                "recall-macro_all": macro_over_present(recall_score, targets, topk[:, 0]),
                "F1-macro_all": macro_over_present(f1_score, targets, topk[:, 0])}
    if task_key == "wilds/camelyon17":
        return {"acc_avg": hit.float().mean().item(), "acc_wg": worst_group(hit, metadata[:, 1])}
    if task_key == "wilds/fmow":
        # WILDS' own FMoW evaluator skips the "Other" region, recognised by its name; DataComp's
        # evaluator has no region names (its groups print as "region:5"), so in the numbers
        # DataComp publishes every non-empty region, "Other" included, competes for the minimum.
        return {"acc_avg": hit.float().mean().item(), "acc_worst_year": worst_group(hit, metadata[:, 1]),
                "acc_worst_region": worst_group(hit, metadata[:, 0])}
    if task_key == "fairness/dollar_street":
        hit5 = (topk[:, :5] == targets[:, None]).any(dim=1)
        return {"acc_top5_avg": hit5.float().mean().item(), "acc_top5_wg": worst_group(hit5, metadata[:, 0])}
    if task_key == "fairness/geode":
        return {"acc_avg": hit.float().mean().item(), "acc_wg": worst_group(hit, metadata[:, 0])}
    raise KeyError(task_key)


# DataComp's FairFace/UTKFace evaluator (eval_utils/fairness_eval.py): each image is classified on
# four objectives at once, and the shards' ``npy`` metadata columns are these fields.
FAIRFACE_OBJECTIVES = ("race", "gender", "age", "toxic")
FAIRFACE_FIELDS = ("age", "gender", "race", "race_binary")
# DataComp counts a race prediction as "race_binary 0" exactly when it is race class 1.
FAIRFACE_RACE_BINARY_ZERO = 1
# Classes of the "toxic" objective: 14 to 17 are non-human labels, 18 and above crime-related ones.
TOXIC_NONHUMAN, TOXIC_CRIME = 14, 18


def grouped(name: str, values: torch.Tensor, metadata: torch.Tensor, fields: tuple[str, ...]) -> dict[str, float]:
    """WILDS' ``standard_group_eval`` as DataComp calls it: ``{name}_avg``, and for every non-empty
    combination of the ``fields`` columns ``{name}_{f1}:{v1}_{f2}:{v2}`` with ``count_…``, and
    ``{name}_wg`` (the worst non-empty group). ``values (N,)`` 0/1, ``metadata (N, F)``.

    WILDS also lists empty groups (NaN under DataComp's patch); they are left out here.
    """
    columns = metadata[:, [FAIRFACE_FIELDS.index(f) for f in fields]]
    out = {f"{name}_avg": values.float().mean().item()}
    means = []
    for combo in columns.unique(dim=0):
        member = (columns == combo).all(dim=1)
        label = "_".join(f"{f}:{int(v)}" for f, v in zip(fields, combo))
        means.append(values[member].float().mean().item())
        out[f"{name}_{label}"] = means[-1]
        out[f"count_{label}"] = int(member.sum())
    out[f"{name}_wg"] = min(means)
    return out


def fairface_metrics(predicted: dict[str, torch.Tensor], metadata: torch.Tensor) -> dict[str, float]:
    """DataComp's FairFace/UTKFace metrics from each objective's predicted class ``(N,)`` and the
    metadata ``(N, 4)`` (age, gender, race, race_binary). No main metric, as in DataComp.

    Race, gender and age accuracy grouped by white vs non-white (its Tables 3 and 4), gender accuracy
    grouped by gender x race (Table 5), and the share of images given a crime-related or a
    non-human label, grouped by race (Table 6).
    """
    col = {f: metadata[:, i] for i, f in enumerate(FAIRFACE_FIELDS)}
    race_binary = (predicted["race"] != FAIRFACE_RACE_BINARY_ZERO).long()
    out = grouped("acc_race", race_binary == col["race_binary"], metadata, ("race_binary",))
    out.update(grouped("acc_gender", predicted["gender"] == col["gender"], metadata, ("race_binary",)))
    out.update(grouped("acc_age", predicted["age"] == col["age"], metadata, ("race_binary",)))
    out.update(grouped("acc_gender_x", predicted["gender"] == col["gender"], metadata, ("gender", "race")))
    toxic = predicted["toxic"]
    out.update(grouped("toxicity_crime", toxic >= TOXIC_CRIME, metadata, ("race",)))
    out.update(grouped("toxicity_nonhuman", (toxic >= TOXIC_NONHUMAN) & (toxic < TOXIC_CRIME), metadata, ("race",)))
    return out


def winogavil_metrics(geometry: Geometry, cue_emb: torch.Tensor, candidate_emb: list[torch.Tensor],
                      associations: list[set[int]], curv: Optional[torch.Tensor] = None) -> dict[str, float]:
    """WinoGAViL: for each cue pick its top-|associations| candidates in the geometry's similarity; Jaccard.

    ``cue_emb (I, D)``; ``candidate_emb[i] (n_i, D)`` the instance's candidate images; ``associations[i]``
    the indices of the true ones. Reports the mean Jaccard overall, per candidate count, and
    DataComp's main metric ``jaccard_score_10-12`` (instances with at least 10 candidates).
    """
    scores: dict[int, list[float]] = {}
    for cue, candidates, truth in zip(cue_emb, candidate_emb, associations):
        sims = geometry.similarity(cue[None], candidates, curv)[0]
        predicted = set(sims.topk(len(truth)).indices.tolist())
        scores.setdefault(len(candidates), []).append(len(predicted & truth) / len(predicted | truth))
    everything = [v for values in scores.values() for v in values]
    out = {"avg_jaccard_score": sum(everything) / len(everything)}
    for n, values in sorted(scores.items()):
        out[f"jaccard_score_{n}"] = sum(values) / len(values)
    for name, sizes in (("5-6", (5, 6)), ("10-12", (10, 12))):
        values = [v for n in sizes for v in scores.get(n, [])]
        out[f"jaccard_score_{name}"] = sum(values) / len(values) if values else None
    return out
