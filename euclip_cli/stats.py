"""Statistics over seeds: means with intervals, paired differences, and claim verdicts.

A study trains every configuration with the same seeds; a seed fixes both the initialisation and
the data order, so two configurations' runs of one seed are paired, and their difference is the
quantity whose interval decides a claim.

Intervals are two-sided 95% by default, either Student's t over the seeds (``"t"``) or a
percentile bootstrap of the mean (``"bootstrap"``, resampling seeds with a fixed generator).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

INTERVALS = ("t", "bootstrap")
BOOTSTRAP_RESAMPLES = 10_000


@dataclass(frozen=True)
class Estimate:
    """The mean of ``n`` values with its sample standard deviation and interval (None for n < 2)."""

    n: int
    mean: float
    sd: Optional[float]
    low: Optional[float]
    high: Optional[float]


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def estimate(values: Sequence[float], interval: str = "t", level: float = 0.95, seed: int = 0) -> Estimate:
    """Mean, sd and a ``level`` interval of the mean of ``values`` (one per seed)."""
    if interval not in INTERVALS:
        raise ValueError(f"interval {interval!r} is not one of {INTERVALS}")
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise ValueError("no values to estimate from")
    mean = statistics.fmean(values)
    if n < 2:
        return Estimate(n, mean, None, None, None)
    sd = statistics.stdev(values)
    if interval == "t":
        half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
        return Estimate(n, mean, sd, mean - half, mean + half)
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=n)) for _ in range(BOOTSTRAP_RESAMPLES))
    tail = (1 - level) / 2
    low = means[int(math.floor(tail * (BOOTSTRAP_RESAMPLES - 1)))]
    high = means[int(math.ceil((1 - tail) * (BOOTSTRAP_RESAMPLES - 1)))]
    return Estimate(n, mean, sd, low, high)


def binomial_se(p: float, n: int) -> float:
    """The standard error of a proportion ``p`` in [0, 1] measured on ``n`` independent examples,
    sqrt(p (1 - p) / n): how far a run's score on a finite evaluation set can sit from its score on
    unlimited examples from the same distribution."""
    if n < 1:
        raise ValueError(f"n = {n}: a proportion needs at least one example")
    return math.sqrt(p * (1 - p) / n)


def paired_difference(a: dict[int, float], b: dict[int, float], interval: str = "t", level: float = 0.95,
                      seed: int = 0) -> Optional[Estimate]:
    """The mean of ``a[s] - b[s]`` over the seeds ``s`` both have, with its interval; None without a
    common seed."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    return estimate([a[s] - b[s] for s in common], interval, level, seed)


def seeds_needed(sd: Optional[float], half_width: float, level: float = 0.95, most: int = 1000) -> Optional[int]:
    """The fewest seeds n >= 2 whose ``level`` t interval of a mean with standard deviation ``sd`` is
    no wider than ± ``half_width``: t(0.5 + level / 2, n - 1) sd / sqrt(n) <= half_width. None without
    an sd or a positive half width, or when more than ``most`` seeds would be needed."""
    if sd is None or not half_width > 0:
        return None
    for n in range(2, most + 1):
        if t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n) <= half_width:
            return n
    return None


REPRODUCED, OPPOSITE, INCONCLUSIVE = "reproduced", "opposite", "inconclusive"


def verdict(effect: Optional[Estimate], expected_sign: int) -> str:
    """``reproduced`` when the interval excludes 0 on the expected side (``expected_sign`` +1 or -1),
    ``opposite`` when it excludes 0 on the other side, ``inconclusive`` otherwise (or without an
    interval)."""
    if effect is None or effect.low is None:
        return INCONCLUSIVE
    if expected_sign * effect.low > 0 and expected_sign * effect.high > 0:
        return REPRODUCED
    if expected_sign * effect.low < 0 and expected_sign * effect.high < 0:
        return OPPOSITE
    return INCONCLUSIVE


def claim_digits(metric: str) -> int:
    """Decimals an effect on ``metric`` is shown with: points of accuracy 1, β 2, probabilities and curvature 3."""
    return 3 if metric in ("text_nearer_root", "curvature_fall") else 2 if metric == "temperature_final" else 1


def paper_cell(effect: Optional[float], source: str) -> str:
    """The claims tables' "paper" cell: the published effect with its source, or the source alone."""
    if effect is None or effect != effect:  # None, or NaN read back from claims.csv
        return source if isinstance(source, str) else ""
    return f"{effect:+.2f} ({source})"
