"""The embedding studies behind ``euclip analyze``: distances from [ROOT], isotropy and traversals.

Each returns a JSON-able dict (and the arrays a figure needs); plotting lives in
``euclip_cli.figures``. Each takes a ``Protocol`` (``analysis.protocol``): the papers'
procedure or euclip's alternative, recorded in the result.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.svm import LinearSVC

from euclip_cli.analysis.embeddings import RunEmbeddings
from euclip_cli.analysis.isotropy import (apply_linear, clip_loss, fit_lstsq, fit_pca, fit_procrustes, fit_whitening,
                                          partition_isotropy, singular_values)
from euclip_cli.analysis.protocol import Protocol
from euclip_cli.analysis.traverse import ROOT, caption_count, traverse
from euclip_cli.data import world as W
from euclip_cli.geometry import Geometry

ROOT_TEXT = "[ROOT]"


def distance_study(g: Geometry, image: torch.Tensor, text: torch.Tensor, curv: Optional[torch.Tensor],
                   protocol: Protocol, root: torch.Tensor, reference: torch.Tensor) -> dict:
    """Each modality's distances from [ROOT] and from the embedding average, and their separation.

    ``root (D,)`` is [ROOT] as the protocol defines it; ``reference (M, D)`` the embeddings whose
    average is the second reference (the paper's appendix D; omitted where [ROOT] is already an
    average). Under the paper protocol distances from [ROOT] are on the papers' axes
    (``plotted_distance_to_root``), else geodesics; distances from the average are geodesics.
    ``auc_text_closer``: the probability that a random caption lies closer to [ROOT] than a random
    image (0.5: no gap; near 1: captions nearer the root, the hierarchy entailment asks for).
    ``image (N, D)`` and ``text (M, D)`` are output-space embeddings.
    """
    out = {"geometry": g.name, "logit": g.logit, "protocol": protocol.name,
           "scale": g.plotted_axis if protocol.plotted_distances else "geodesic distance from [ROOT]",
           "references": {}, "arrays": {}}
    references = {"root": root, "average": reference.mean(dim=0)}
    if g.facts.root == "mean":
        del references["average"]  # [ROOT] is the average already
        out["average_norm"] = reference.mean(dim=0).norm().item()
    for ref_name, ref in references.items():
        measure = g.plotted_distance_to_root if ref_name == "root" and protocol.plotted_distances else g.distance_to_root
        image_d, text_d = measure(image, ref, curv), measure(text, ref, curv)
        labels = [0] * len(image_d) + [1] * len(text_d)
        out["references"][ref_name] = {
            "norm": ref.norm().item(),
            "auc_text_closer": float(roc_auc_score(labels, (-torch.cat([image_d, text_d])).numpy())),
            **{m: {"mean": d.mean().item(), "std": d.std().item(), "min": d.min().item(), "max": d.max().item()}
               for m, d in (("image", image_d), ("text", text_d))}}
        out["arrays"][ref_name] = {"image": image_d.tolist(), "text": text_d.tolist()}
    root_ref = out["references"]["root"]
    out.update(root_norm=root_ref["norm"], auc_text_closer=root_ref["auc_text_closer"],
               distances={"image": root_ref["image"], "text": root_ref["text"]})
    return out


def _unit(x: torch.Tensor) -> torch.Tensor:
    # Zero rows (possible after PCA of a constant direction) stay zero instead of dividing by 0.
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _zero_shot(images: torch.Tensor, prototypes: torch.Tensor, labels: torch.Tensor) -> float:
    """Cosine nearest-prototype accuracy, as the isotropy paper scores transformed embeddings."""
    return ((_unit(images) @ _unit(prototypes).T).argmax(dim=1) == labels).double().mean().item()


def _separability(image_fit, text_fit, image_test, text_test) -> dict[str, float]:
    """Held-out accuracy of a logistic regression and of a linear SVC telling images from captions."""
    x_fit = torch.cat([image_fit, text_fit]).numpy()
    y_fit = [0] * len(image_fit) + [1] * len(text_fit)
    x_test = torch.cat([image_test, text_test]).numpy()
    y_test = [0] * len(image_test) + [1] * len(text_test)
    return {"logistic": float(LogisticRegression(max_iter=2000).fit(x_fit, y_fit).score(x_test, y_test)),
            "linear_svc": float(LinearSVC(max_iter=20000).fit(x_fit, y_fit).score(x_test, y_test))}


def fit_maps(fit, each_modality: bool, fit_i: torch.Tensor, fit_t: torch.Tensor):
    """``(on_image, on_text)`` maps of a fitted linear transform: one per modality or one for both."""
    if each_modality:
        mean_i, proj_i = fit(fit_i)
        mean_t, proj_t = fit(fit_t)
        return lambda x: apply_linear(x, mean_i, proj_i), lambda x: apply_linear(x, mean_t, proj_t)
    mean, proj = fit(torch.cat([fit_i, fit_t]))
    return (lambda x: apply_linear(x, mean, proj),) * 2


def isotropy_study(emb: RunEmbeddings, k: int, protocol: Protocol, loss_batch: int = 100) -> dict:
    """I1/I2, spectra, separability, CLIP loss and zero-shot accuracy before and after each transform.

    The isotropy paper's Tables 1-3: transforms are fitted on the first half of the image-caption
    pairs and measured on the second half (CLIP loss on both halves, as Table 2's train and test)
    and on every classification task of the world (``zero_shot``, and their mean). Centering,
    whitening-k and PCA-k compare images with captions through one map fitted on both modalities;
    their I1/I2 come from a map fitted on each modality's own embeddings under the paper protocol
    (Table 1 whitens each set), from the shared map under euclip's. Orthogonal Procrustes and least
    squares map captions onto their images (applied to text, including the class prototypes).
    Embeddings are unit-normalized before and after every transform. The CLIP loss uses the run's
    logit scale on cosines, over batches of ``loss_batch`` pairs.
    """
    image, text = _unit(emb.image.double()), _unit(emb.text.double())
    half = len(image) // 2
    fit_i, fit_t, test_i, test_t = image[:half], text[:half], image[half:], text[half:]
    classes = {k: (_unit(t.images.double()), _unit(t.prototypes.double()), t.labels) for k, t in emb.classes.items()}
    identity = torch.eye(image.shape[1], dtype=torch.float64)
    fits = {"centering": lambda w: (w.mean(dim=0), identity), f"whitening-{k}": lambda w: fit_whitening(w, k),
            f"pca-{k}": lambda w: fit_pca(w, k)}
    transforms = {"none": (lambda x: x, lambda x: x)}
    isotropy_maps = dict(transforms)
    for name, fit in fits.items():
        transforms[name] = fit_maps(fit, False, fit_i, fit_t)
        isotropy_maps[name] = fit_maps(fit, protocol.fit_each_modality, fit_i, fit_t)
    omega = fit_procrustes(fit_t, fit_i)
    transforms["procrustes text->image"] = (lambda x: x, lambda x: x @ omega)
    beta = fit_lstsq(fit_t, fit_i)
    transforms["lstsq text->image"] = (lambda x: x, lambda x: x @ beta)

    rows = {}
    signs = protocol.eigenvector_signs
    for name, (on_image, on_text) in transforms.items():
        ti, tt = _unit(on_image(test_i)), _unit(on_text(test_t))
        fi, ft = _unit(on_image(fit_i)), _unit(on_text(fit_t))
        iso_image, iso_text = isotropy_maps.get(name, (on_image, on_text))
        i1_img, i2_img = partition_isotropy(_unit(iso_image(test_i)), signs)
        i1_txt, i2_txt = partition_isotropy(_unit(iso_text(test_t)), signs)
        separable = _separability(fi, ft, ti, tt)
        rows[name] = {
            "I1_image": i1_img, "I2_image": i2_img, "I1_text": i1_txt, "I2_text": i2_txt,
            "pair_cosine": (ti * tt).sum(dim=1).mean().item(),
            "separability": separable["logistic"], "separability_svc": separable["linear_svc"],
            "clip_loss_fit": clip_loss(fi, ft, emb.scale, loss_batch),
            "clip_loss_test": clip_loss(ti, tt, emb.scale, loss_batch),
            "zero_shot": {k: _zero_shot(on_image(i), on_text(p), y) for k, (i, p, y) in classes.items()},
        }
        rows[name]["zero_shot_mean"] = sum(rows[name]["zero_shot"].values()) / len(classes)
    spectra = {f"{m}{'' if not c else ' centered'}": singular_values(x, center=c).tolist()
               for m, x in (("image", image), ("text", text)) for c in (False, True)}
    own = {key: (emb.geometry.similarity(t.images, t.prototypes, emb.curv).argmax(dim=1) == t.labels).double().mean()
           .item() for key, t in emb.classes.items()}
    return {"geometry": emb.geometry.name, "logit": emb.geometry.logit, "protocol": protocol.name,
            "eigenvector_signs": signs, "isotropy_fitted_on": "each modality" if protocol.fit_each_modality else "both",
            "pairs": len(image), "fit_pairs": half, "k": k, "loss_scale": emb.scale, "loss_batch": loss_batch,
            "zero_shot_own_geometry": own, "transforms": rows, "spectra": spectra}


def traversal_study(emb: RunEmbeddings, specs: list[dict], scenes: list[list], images: int, steps: int,
                    ks: list[Optional[float]], protocol: Protocol, root: torch.Tensor, examples: int = 5) -> dict:
    """Traversals of the first ``images`` retrieval images over the world's caption vocabulary, scored.

    ``specs`` are the vocabulary's caption specs (``emb.vocabulary`` embeds them), ``scenes`` the
    ground-truth scene of each retrieval image, ``root (D,)`` [ROOT] as the protocol defines it
    (a candidate caption under the paper protocol, never counted). Per filter (None: no
    entailment filter, else K): captions per image, ``precision`` (traversal captions true of
    the image), ``generic_order`` (consecutive captions that do not get more specific),
    ``ends_generic`` (the last caption is a family or a single attribute), ``no_caption`` (the
    share of images whose first hop is [ROOT]), and example traversals. For geometries with
    entailment cones, ``entailment_test`` gives the precision and recall of "the caption's cone
    contains the image" against the ground truth, over every (caption, image) pair.
    """
    g, curv, vocab = emb.geometry, emb.curv, emb.vocabulary
    texts = [W.caption_text(s) for s in specs]
    chosen = range(min(images, len(emb.image)))
    truth = torch.tensor([[W.entails(s, scenes[i]) for s in specs] for i in chosen])  # (N, V)
    result = {"geometry": g.name, "logit": g.logit, "protocol": protocol.name, "root_in_pool": protocol.root_in_pool,
              "images": len(chosen), "steps": steps, "vocabulary": len(specs), "filters": {}}
    for k in ks:
        walks = [traverse(g, emb.image[i], root, vocab, curv, steps, k, protocol.root_in_pool) for i in chosen]
        sequences = [[c for c in walk if c != ROOT] for walk in walks]
        flat = [(i, c) for i, seq in zip(chosen, sequences) for c in seq]
        pairs = [(a, b) for seq in sequences for a, b in zip(seq, seq[1:])]
        result["filters"]["none" if k is None else f"K={k:g}"] = {
            "captions_per_image": sum(map(caption_count, walks)) / len(walks),
            "precision": sum(bool(truth[i, c]) for i, c in flat) / max(len(flat), 1),
            "generic_order": sum(specs[b]["rank"] <= specs[a]["rank"] for a, b in pairs) / max(len(pairs), 1),
            "ends_generic": sum(bool(seq) and specs[seq[-1]]["rank"] <= 1 for seq in sequences) / len(sequences),
            "no_caption": sum(not seq for seq in sequences) / len(sequences),
            "examples": [{"image": i, "captions": [ROOT_TEXT if c == ROOT else texts[c] for c in walk]}
                         for i, walk in list(zip(chosen, walks))[:examples]],
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


def folder_traversal_study(g: Geometry, curv: Optional[torch.Tensor], names: list[str], images: torch.Tensor,
                           captions: list[str], texts: torch.Tensor, root: torch.Tensor, steps: int,
                           ks: list[Optional[float]], protocol: Protocol) -> dict:
    """Traversals of a folder's images ``(N, D)`` over a caption pool ``(C, D)``: no ground truth to score.

    Per filter: captions per image ([ROOT] excluded, as EuCLIP's Table 6 counts them), the share of
    images with none, and each image's traversal.
    """
    result = {"geometry": g.name, "logit": g.logit, "protocol": protocol.name, "root_in_pool": protocol.root_in_pool,
              "images": len(names), "steps": steps, "vocabulary": len(captions), "filters": {}}
    for k in ks:
        walks = [traverse(g, z, root, texts, curv, steps, k, protocol.root_in_pool) for z in images]
        result["filters"]["none" if k is None else f"K={k:g}"] = {
            "captions_per_image": sum(map(caption_count, walks)) / len(walks),
            "no_caption": sum(caption_count(w) == 0 for w in walks) / len(walks),
            "traversals": {n: [ROOT_TEXT if c == ROOT else captions[c] for c in walk] for n, walk in zip(names, walks)}}
    return result


# Generic points scored against every specific one at once (``entailment_study``'s cone).
CONE_ROWS = 32


def entailment_study(g, curv: Optional[torch.Tensor], generic: torch.Tensor, specific: torch.Tensor,
                     related: torch.Tensor, min_radius: float) -> dict:
    """How well a geometry's scores tell the (generic, specific) pairs the tree relates from the others,
    as ROC AUC and average precision. ``generic (G, D)``, ``specific (S, D)``, ``related (G, S)`` bool.

    ``similarity``: the geometry's own similarity, CLIP's cosine analogue and every geometry's baseline;
    ``cone``: minus how far the specific point lies outside the generic one's entailment cone (the
    run's ``loss.entail_min_radius``), for geometries with cones.
    """
    scores = {"similarity": g.similarity(generic, specific, curv)}
    if g.has_entailment:
        # A block of generic rows at a time: the pairs' broadcast (G, S, D) would not fit for a caption pool.
        scores["cone"] = torch.cat([-g.cone_violation(generic[i:i + CONE_ROWS, None], specific[None], min_radius, curv)
                                    for i in range(0, len(generic), CONE_ROWS)])
    labels = related.flatten().numpy()
    return {name: {"roc_auc": float(roc_auc_score(labels, s.flatten().double().numpy())),
                   "average_precision": float(average_precision_score(labels, s.flatten().double().numpy())),
                   "positives": int(labels.sum()), "pairs": len(labels)} for name, s in scores.items()}


def order_study(g, curv: Optional[torch.Tensor], texts: torch.Tensor, pairs: list[tuple[int, int]],
                root: torch.Tensor, min_radius: float) -> dict:
    """How well a geometry's scores put each related pair of captions in its order: every ``(generic,
    specific)`` pair of ``pairs`` (indices into ``texts (T, D)``) against the same pair reversed, as ROC AUC
    (0.5: the order is not told; a symmetric similarity scores exactly that, so none is scored here).

    ``root_order``: d(root, specific) - d(root, generic), the specific caption farther from [ROOT]
    (``root (D,)``), for every geometry; ``cone``: minus how far the second lies outside the first one's
    entailment cone, for geometries with cones (what entailment trains).
    """
    generic = torch.tensor([a for a, _ in pairs])
    specific = torch.tensor([b for _, b in pairs])
    from_root = g.distance_to_root(texts, root, curv)
    scores = {"root_order": (from_root[specific] - from_root[generic],
                             from_root[generic] - from_root[specific])}
    if g.has_entailment:
        scores["cone"] = (-g.cone_violation(texts[generic], texts[specific], min_radius, curv),
                          -g.cone_violation(texts[specific], texts[generic], min_radius, curv))
    labels = np.r_[np.ones(len(pairs)), np.zeros(len(pairs))]
    return {name: {"roc_auc": float(roc_auc_score(labels, torch.cat([right, reversed_]).double().numpy())),
                   "pairs": len(pairs)} for name, (right, reversed_) in scores.items()}
