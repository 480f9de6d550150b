"""The embedding studies behind ``euclip analyze``: distances from [ROOT], and isotropy.

Each returns a JSON-able dict (and the arrays a figure needs); plotting lives in
``euclip_cli.report.figures``.
"""

from __future__ import annotations

from typing import Optional

import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from euclip_cli.analysis.embeddings import RunEmbeddings
from euclip_cli.analysis.traverse import traverse
from euclip_cli.data import world as W
from euclip_cli.geometry import Geometry
from euclip_cli.analysis.isotropy import (apply_linear, fit_lstsq, fit_pca, fit_procrustes, fit_whitening,
                                          partition_isotropy, singular_values)


def distance_study(g: Geometry, image: torch.Tensor, text: torch.Tensor, curv: Optional[torch.Tensor]) -> dict:
    """Each modality's distances from [ROOT] and from the embedding average, and their separation.

    [ROOT] is the geometry's (the origin for Euclidean and hyperbolic models, the average of the
    normalized embeddings for spherical ones); the average of all image and text embeddings is
    also reported with its norm, as the paper's appendix D does for EuCLIP and MERU.
    ``auc_text_closer``: the probability that a random caption lies closer to [ROOT] than a random
    image (0.5: no gap; near 1: captions nearer the root, the hierarchy entailment asks for).
    ``image (N, D)`` and ``text (M, D)`` are output-space embeddings.
    """
    both = torch.cat([image, text])
    out = {"geometry": g.name, "logit": g.logit, "references": {}, "arrays": {}}
    references = {"root": g.root(both), "average": both.mean(dim=0)}
    if g.facts.root == "mean":
        del references["average"]  # [ROOT] is the average already
    for ref_name, ref in references.items():
        image_d = g.distance_to_root(image, ref, curv)
        text_d = g.distance_to_root(text, ref, curv)
        labels = [0] * len(image_d) + [1] * len(text_d)
        out["references"][ref_name] = {
            "norm": ref.norm().item(),
            "auc_text_closer": float(roc_auc_score(labels, (-torch.cat([image_d, text_d])).numpy())),
            **{m: {"mean": d.mean().item(), "std": d.std().item(), "min": d.min().item(), "max": d.max().item()}
               for m, d in (("image", image_d), ("text", text_d))}}
        out["arrays"][ref_name] = {"image": image_d.tolist(), "text": text_d.tolist()}
    root = out["references"]["root"]
    out.update(root_norm=root["norm"], auc_text_closer=root["auc_text_closer"],
               distances={"image": root["image"], "text": root["text"]})
    return out


def _unit(x: torch.Tensor) -> torch.Tensor:
    # Zero rows (possible after PCA of a constant direction) stay zero instead of dividing by 0.
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _zero_shot(images: torch.Tensor, prototypes: torch.Tensor, labels: torch.Tensor) -> float:
    """Cosine nearest-prototype accuracy, as the isotropy paper scores transformed embeddings."""
    return ((_unit(images) @ _unit(prototypes).T).argmax(dim=1) == labels).double().mean().item()


def _separability(image_fit, text_fit, image_test, text_test) -> float:
    """Held-out accuracy of a logistic regression telling images from captions."""
    x_fit = torch.cat([image_fit, text_fit]).numpy()
    y_fit = [0] * len(image_fit) + [1] * len(text_fit)
    clf = LogisticRegression(max_iter=2000).fit(x_fit, y_fit)
    return float(clf.score(torch.cat([image_test, text_test]).numpy(), [0] * len(image_test) + [1] * len(text_test)))


def isotropy_study(emb: RunEmbeddings, k: int) -> dict:
    """I1/I2, spectra and zero-shot accuracy before and after each transform (the isotropy paper).

    Transforms are fitted on the first half of the image-caption pairs and measured on the second
    half and on every classification task of the world (``zero_shot``, and their mean): whitening-k and PCA-k on both modalities together; orthogonal
    Procrustes and least squares mapping captions onto their images (applied to text, including
    the class prototypes). Embeddings are unit-normalized before and after every transform.
    """
    image, text = _unit(emb.image.double()), _unit(emb.text.double())
    half = len(image) // 2
    fit_i, fit_t, test_i, test_t = image[:half], text[:half], image[half:], text[half:]
    classes = {k: (_unit(t.images.double()), _unit(t.prototypes.double()), t.labels) for k, t in emb.classes.items()}
    both = torch.cat([fit_i, fit_t])
    transforms = {"none": (lambda x: x, lambda x: x)}
    mean, proj = fit_whitening(both, k)
    transforms[f"whitening-{k}"] = (lambda x: apply_linear(x, mean, proj),) * 2
    pca_mean, pca_proj = fit_pca(both, k)
    transforms[f"pca-{k}"] = (lambda x: apply_linear(x, pca_mean, pca_proj),) * 2
    omega = fit_procrustes(fit_t, fit_i)
    transforms["procrustes text->image"] = (lambda x: x, lambda x: x @ omega)
    beta = fit_lstsq(fit_t, fit_i)
    transforms["lstsq text->image"] = (lambda x: x, lambda x: x @ beta)

    rows = {}
    for name, (on_image, on_text) in transforms.items():
        ti, tt = _unit(on_image(test_i)), _unit(on_text(test_t))
        i1_img, i2_img = partition_isotropy(ti)
        i1_txt, i2_txt = partition_isotropy(tt)
        rows[name] = {
            "I1_image": i1_img, "I2_image": i2_img, "I1_text": i1_txt, "I2_text": i2_txt,
            "pair_cosine": (ti * tt).sum(dim=1).mean().item(),
            "separability": _separability(_unit(on_image(fit_i)), _unit(on_text(fit_t)), ti, tt),
            "zero_shot": {k: _zero_shot(on_image(i), on_text(p), y) for k, (i, p, y) in classes.items()},
        }
        rows[name]["zero_shot_mean"] = sum(rows[name]["zero_shot"].values()) / len(classes)
    spectra = {f"{m}{'' if not c else ' centered'}": singular_values(x, center=c).tolist()
               for m, x in (("image", image), ("text", text)) for c in (False, True)}
    own = {key: (emb.geometry.similarity(t.images, t.prototypes, emb.curv).argmax(dim=1) == t.labels).double().mean()
           .item() for key, t in emb.classes.items()}
    return {"geometry": emb.geometry.name, "logit": emb.geometry.logit, "pairs": len(image), "fit_pairs": half,
            "k": k, "zero_shot_own_geometry": own, "transforms": rows, "spectra": spectra}


def traversal_study(emb: RunEmbeddings, specs: list[dict], scenes: list[list], images: int, steps: int,
                    ks: list[Optional[float]], examples: int = 5) -> dict:
    """Traversals of the first ``images`` retrieval images over the world's caption vocabulary, scored.

    ``specs`` are the vocabulary's caption specs (``emb.vocabulary`` embeds them), ``scenes`` the
    ground-truth scene of each retrieval image. Per filter (None: no entailment filter, else K):
    captions per image, ``precision`` (traversal captions true of the image), ``generic_order``
    (consecutive captions that do not get more specific), ``ends_generic`` (the last caption is a
    family or a single attribute), and example traversals. For geometries with entailment cones,
    ``entailment_test`` gives the precision and recall of "the caption's cone contains the image"
    against the ground truth, over every (caption, image) pair.
    """
    g, curv, vocab = emb.geometry, emb.curv, emb.vocabulary
    root = g.root(torch.cat([emb.image, emb.text]))
    texts = [W.caption_text(s) for s in specs]
    chosen = range(min(images, len(emb.image)))
    truth = torch.tensor([[W.entails(s, scenes[i]) for s in specs] for i in chosen])  # (N, V)
    result = {"geometry": g.name, "logit": g.logit, "images": len(chosen), "steps": steps, "vocabulary": len(specs),
              "filters": {}}
    for k in ks:
        sequences = [traverse(g, emb.image[i], root, vocab, curv, steps, k) for i in chosen]
        flat = [(i, c) for i, seq in zip(chosen, sequences) for c in seq]
        pairs = [(a, b) for seq in sequences for a, b in zip(seq, seq[1:])]
        result["filters"]["none" if k is None else f"K={k:g}"] = {
            "captions_per_image": sum(map(len, sequences)) / len(sequences),
            "precision": sum(bool(truth[i, c]) for i, c in flat) / max(len(flat), 1),
            "generic_order": sum(specs[b]["rank"] <= specs[a]["rank"] for a, b in pairs) / max(len(pairs), 1),
            "ends_generic": sum(bool(seq) and specs[seq[-1]]["rank"] <= 1 for seq in sequences) / len(sequences),
            "examples": [{"image": i, "captions": [texts[c] for c in seq]}
                         for i, seq in list(zip(chosen, sequences))[:examples]],
        }
    if g.has_entailment:
        result["entailment_test"] = {}
        for k in [k for k in ks if k is not None] or [0.1]:
            predicted = g.entails(vocab[None], emb.image[list(chosen)][:, None], k, curv)  # (N, V)
            tp = (predicted & truth).sum().item()
            result["entailment_test"][f"K={k:g}"] = {
                "precision": tp / max(predicted.sum().item(), 1), "recall": tp / max(truth.sum().item(), 1),
                "predicted_share": predicted.double().mean().item(), "true_share": truth.double().mean().item()}
    return result
