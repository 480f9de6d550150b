"""Linear probes on frozen image features, as MERU (its Appendix C and Table 7) and CLIP evaluate them:
scikit-learn's logistic regression (L-BFGS, at most 1,000 iterations), its inverse regularisation C chosen
on a validation split by a two-pass search, then refit on train + validation and scored on the test split
by mean per-class accuracy.

scikit-learn does the fitting; the search is written here because it is the protocol's own (MERU's
``LinearProbeClassificationEvaluator`` follows CLIP's description), not a library's.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

# First pass: C = 1e-6, 1e-4, ..., 1e6. Second: 4 steps, each trying the best C divided and multiplied by
# delta (10, then its square root each step: 10, 3.16, 1.78, 1.33).
FIRST_PASS = tuple(10.0 ** e for e in range(-6, 7, 2))
REFINE_STEPS = 4


def search_cost(score: Callable[[float], float]) -> tuple[float, float, dict[float, float]]:
    """``(best C, its score, every C tried -> score)`` for a validation score to maximise. A later C
    replaces the best only when strictly better, so ties keep the one found first."""
    tried: dict[float, float] = {}

    def at(cost: float) -> float:
        if cost not in tried:
            tried[cost] = score(cost)
        return tried[cost]

    best = FIRST_PASS[0]
    for cost in FIRST_PASS:
        if at(cost) > at(best):
            best = cost
    delta = 10.0
    for _ in range(REFINE_STEPS):
        for cost in (best / delta, best * delta):  # both around the best as the step began
            if at(cost) > at(best):
                best = cost
        delta **= 0.5
    return best, tried[best], tried


# The validation split's draw: fixed, so a rerun holds out the same images.
HOLDOUT_SEED = 0


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int = HOLDOUT_SEED) -> np.ndarray:
    """A boolean mask (N,) over ``labels`` (N,) holding out ``fraction`` of each class for validation, drawn
    by a seeded permutation: every class with two or more images keeps at least one on each side, whatever
    order the set is stored in. Exporters keep a dataset's order, and several sets (Food-101, Country211,
    Caltech-101) are stored class by class, where MERU's "last 10%" would hold out whole classes."""
    rng = np.random.default_rng(seed)
    held = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        if len(members) < 2:
            continue  # one image: it trains
        count = min(len(members) - 1, max(1, round(fraction * len(members))))
        held[rng.permutation(members)[:count]] = True
    return held


def _classifier(cost: float):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=cost, max_iter=1000, random_state=0)


def mean_per_class_accuracy(true: np.ndarray, predicted: np.ndarray) -> float:
    """Accuracy within each class present in ``true``, averaged over those classes (a guess of a class
    absent from ``true`` counts as a miss, which scikit-learn warns of; it is what the metric means here)."""
    import warnings

    from sklearn.metrics import balanced_accuracy_score

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="y_pred contains classes not in y_true")
        return float(balanced_accuracy_score(true, predicted))


def linear_probe(train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray],
                 test: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    """The probe's test metrics; each split is ``(features (N, F), labels (N,))``."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    def val_score(cost: float) -> float:
        return mean_per_class_accuracy(val[1], _classifier(cost).fit(*train).predict(val[0]))

    with warnings.catch_warnings():  # the protocol caps iterations at 1,000; tiny C and huge C may stop there
        warnings.simplefilter("ignore", ConvergenceWarning)
        cost, val_best, tried = search_cost(val_score)
        final = _classifier(cost).fit(np.concatenate([train[0], val[0]]), np.concatenate([train[1], val[1]]))
    predicted = final.predict(test[0])
    return {"mean_per_class_recall": mean_per_class_accuracy(test[1], predicted),
            "acc1": float((predicted == test[1]).mean()), "cost": cost, "val_mean_per_class_recall": val_best,
            "costs_tried": len(tried), "train": len(train[1]), "val": len(val[1]), "test": len(test[1]),
            # A validation split missing classes chooses C on the others only: worth seeing beside the score.
            "train_classes": len(np.unique(train[1])), "val_classes": len(np.unique(val[1]))}
