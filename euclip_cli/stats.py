"""Statistics over seeds: means with intervals, paired differences, power, claim verdicts, and
power laws fitted across budgets.

A study trains every configuration with the same seeds; a seed fixes both the initialisation and
the data order, so two configurations' runs of one seed are paired, and their difference is the
quantity whose interval decides a claim.

Intervals are two-sided 95% by default, either Student's t over the seeds (``"t"``) or a
percentile bootstrap of the mean (``"bootstrap"``, resampling seeds with a fixed generator, and
only from ``MIN_BOOTSTRAP_SEEDS`` seeds). A study decides each family of claims together (its
primary claims, declared before it runs, and the rest), from intervals at Holm's levels
(``holm_levels``) so that the chance of any wrong verdict in a family stays at most 5%.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

INTERVALS = ("t", "bootstrap")
BOOTSTRAP_RESAMPLES = 10_000
# A percentile bootstrap of a mean of n values has C(2n - 1, n) distinct resamples: 10 for 3 seeds,
# 35 for 4, 6,435 for 8; below 8 its 2.5% and 97.5% quantiles are a handful of coarse values.
MIN_BOOTSTRAP_SEEDS = 8


@dataclass(frozen=True)
class Estimate:
    """The mean of ``n`` values with its sample standard deviation and interval (None for n < 2)."""

    n: int
    mean: float
    sd: Optional[float]
    low: Optional[float]
    high: Optional[float]


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def estimate(values: Sequence[float], interval: str = "t", level: float = 0.95, seed: int = 0) -> Estimate:
    """Mean, sd and a ``level`` interval of the mean of ``values`` (one per seed); no interval from one
    value, nor a bootstrap one from fewer than ``MIN_BOOTSTRAP_SEEDS``."""
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
    if interval == "bootstrap" and n < MIN_BOOTSTRAP_SEEDS:  # no interval, as with one value (a study's runs so far)
        return Estimate(n, mean, sd, None, None)
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


def paired_proportion_se(a: Sequence[bool], b: Sequence[bool]) -> float:
    """The standard error of the difference of two proportions measured on the same ``n`` examples, ``a[i]``
    and ``b[i]`` whether each of two models got example i right: sqrt(var(a_i - b_i) / n), the plug-in
    variance of McNemar's test, ((r + w) / n - ((r - w) / n)^2) / n with r the examples only ``a`` got right
    and w those only ``b`` did. Examples both get right or wrong add nothing, so two similar models on one
    evaluation set differ by less sampling noise than either score carries (``binomial_se``)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"{len(a)} and {len(b)} outcomes: a paired difference needs the same examples, at least one")
    n = len(a)
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    # Never negative in exact arithmetic (|r - w| <= r + w <= n); the max keeps rounding from making it so.
    return math.sqrt(max(0.0, (only_a + only_b) / n - ((only_a - only_b) / n) ** 2) / n)


def paired_difference(a: dict[int, float], b: dict[int, float], interval: str = "t", level: float = 0.95,
                      seed: int = 0) -> Optional[Estimate]:
    """The mean of ``a[s] - b[s]`` over the seeds ``s`` both have, with its interval; None without a
    common seed."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    return estimate([a[s] - b[s] for s in common], interval, level, seed)


def welch_difference(a: Estimate, b: Estimate, level: float = 0.95) -> Optional[tuple[float, float, float]]:
    """``a.mean - b.mean`` for two means of independent samples (say one configuration's paired Δ at two
    budgets, trained by different runs) with Welch's ``level`` interval: standard error
    sqrt(sa²/na + sb²/nb) and the Welch–Satterthwaite degrees of freedom. (mean, low, high); None where
    either has fewer than two values."""
    if a.sd is None or b.sd is None:
        return None
    va, vb = a.sd ** 2 / a.n, b.sd ** 2 / b.n
    diff, se = a.mean - b.mean, math.sqrt(va + vb)
    if se == 0:  # both samples constant: no spread to widen the difference
        return diff, diff, diff
    df = (va + vb) ** 2 / (va ** 2 / (a.n - 1) + vb ** 2 / (b.n - 1))
    half = t_quantile(0.5 + level / 2, df) * se
    return diff, diff - half, diff + half


def family_level(level: float, claims: int) -> float:
    """Bonferroni: the level of each of ``claims`` intervals such that all of them hold together with
    probability at least ``level`` (1 - (1 - level) / claims)."""
    return 1 - (1 - level) / max(1, claims)


def t_test_p(values: Sequence[float]) -> Optional[float]:
    """The two-sided p-value of Student's t test that the mean of ``values`` (one per seed) is 0:
    the level 1 - p is the widest t interval that still excludes 0. 0 when the values agree on a
    nonzero mean, 1 when all are 0; None from fewer than two values."""
    from scipy.stats import t

    values = [float(v) for v in values]
    if len(values) < 2:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    if sd == 0:
        return 0.0 if mean != 0 else 1.0
    return float(2 * t.sf(abs(mean) / (sd / math.sqrt(len(values))), len(values) - 1))


def holm_levels(p_values: dict[str, float], level: float = 0.95) -> dict[str, float]:
    """Holm's step-down procedure as interval levels: the level of the interval each of a family's
    tests is read from, so that the family's chance of any wrong rejection stays at most 1 - ``level``.

    The claims are taken from the smallest p-value up; the k-th of m (from 0) is read at
    1 - (1 - level) / (m - k), the Bonferroni level over the claims not yet decided, while each
    interval so far excluded 0. The first that does not, and every claim after it, is read at that
    claim's level: their p-values are no smaller, so none of their intervals excludes 0 there either.
    Holm rejects every claim Bonferroni does, and more where several effects are clear.
    """
    order = sorted(p_values, key=lambda k: p_values[k])
    alpha, m = 1 - level, len(order)
    levels, stopped = {}, None
    for k, key in enumerate(order):
        if stopped is None and p_values[key] > alpha / (m - k):
            stopped = 1 - alpha / (m - k)
        levels[key] = stopped if stopped is not None else 1 - alpha / (m - k)
    return levels


def power(n: int, effect: float, sd: float, level: float = 0.95) -> float:
    """The chance that a two-sided ``level`` t interval over ``n`` paired seeds excludes 0, when the
    true mean difference is ``effect`` and its seed-to-seed standard deviation ``sd``.

    With d the mean difference and s the seeds' sample sd, the interval misses 0's exclusion when
    |d| <= t* s / sqrt(n). Writing d sqrt(n) / sd = Z + delta (Z standard normal, delta = |effect|
    sqrt(n) / sd) and (n - 1) s^2 / sd^2 = V (chi-squared with n - 1 degrees of freedom, independent
    of Z), that is V >= (n - 1) (Z + delta)^2 / t*^2: the power is one minus the mean over Z of
    that chi-squared tail. SciPy's noncentral t, the textbook route, returns NaN at large
    noncentralities (e.g. n = 6, delta = 5 with SciPy 1.17), which made 80% power look out of reach
    where it was not.
    """
    from scipy.integrate import quad
    from scipy.special import chdtrc

    df = n - 1
    critical = t_quantile(0.5 + level / 2, df)
    shift = abs(effect) * math.sqrt(n) / sd
    root_two_pi = math.sqrt(2 * math.pi)

    # The normal density and the chi-squared tail (chdtrc, what scipy.stats' chi2.sf evaluates) as scalar
    # functions: quad calls this hundreds of times per power, and scipy.stats' distribution objects spend
    # a quarter of a millisecond a call checking arguments (a study's seeds-needed column took 45 s).
    def missed(z: float) -> float:
        return math.exp(-z * z / 2) / root_two_pi * float(chdtrc(df, df * ((z + shift) / critical) ** 2))

    # The normal density is below 1e-300 beyond |z| = 37, so [-40, 40] holds all of the mean; the
    # integrand's peak sits between -shift and 0, given to quad as a break point.
    inside = [-shift] if shift < 40 else []
    miss, _ = quad(missed, -40.0, 40.0, points=inside, epsabs=1e-13, epsrel=1e-10, limit=500)
    # The integral of a density-weighted probability lies in [0, 1]; the clamp removes quadrature's
    # last-digit excursions past either end.
    return min(1.0, max(0.0, 1.0 - miss))


POWER = 0.8
# A learnable scalar that moved less than this share of its initial value is reported "frozen":
# a study says nothing about where it would settle.
FROZEN_BELOW = 0.05


def seeds_needed(sd: Optional[float], effect: float, level: float = 0.95, target: float = POWER,
                 most: int = 1000) -> Optional[int]:
    """The fewest seeds n >= 2 whose ``level`` interval excludes 0 with probability ``target`` (80%
    power) when the true effect is ``effect`` and the paired sd is ``sd``. 2 when ``sd`` is 0; None
    without an sd or a nonzero effect, or when more than ``most`` seeds would be needed."""
    if sd is None or not abs(effect) > 0:
        return None
    if sd == 0:
        return 2

    def enough(n: int) -> bool:
        return power(n, effect, sd, level) >= target

    # Power grows with n (the interval narrows and its t quantile falls), so the first n with enough
    # is found by doubling, then bisecting between the last n without and the first with.
    low, high = 1, 2
    while not enough(high):
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while high - low > 1:  # enough(high), and not enough(low) unless low is 1
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


# What the data say about a claim's statement, read in its own direction (``verdict``).
HOLDS, NONINFERIOR, OPPOSITE = "holds", "non-inferior", "opposite"
EXCLUDES_PAPER, UNDETERMINED, NO_SPREAD = "excludes the paper's effect", "undetermined", "no spread"
# A claim that involves a configuration whose runs did not learn (``above_chance``): comparing scores at
# the chance floor says nothing about the claim.
NOT_TESTABLE = "not testable"
VERDICTS = (HOLDS, NONINFERIOR, OPPOSITE, EXCLUDES_PAPER, UNDETERMINED, NO_SPREAD, NOT_TESTABLE)
# A study's families of claims: those its recipe declares primary, the rest, or one family of all
# where it declares none; each is decided apart (``holm_levels``).
PRIMARY, SECONDARY, ALL = "primary", "secondary", "all"
# How the effect sits beside the published result of the nearest regime (``beside_paper``), a question
# apart from the statement's: a paper's small-scale table can run against its own statement.
SAME_SIGN, OTHER_SIGN, SIGN_OPEN = "same sign", "other sign", "sign undetermined"
NO_PUBLISHED = "no published value"
# Only where the statement holds, with the paper's sign, at a regime the paper itself ran.
REPRODUCED = "reproduced"
BESIDE_PAPER = (SAME_SIGN, OTHER_SIGN, SIGN_OPEN, NO_PUBLISHED, REPRODUCED, NOT_TESTABLE)


def _read_at(effect: Estimate, resolution: float) -> Optional[tuple[float, float]]:
    """The interval a verdict reads: None where every seed gave no effect (to within half the
    ``resolution``); where every seed gave the same nonzero effect (sd below the resolution: a t
    interval around it says how far apart the seeds' last digits fell), an interval of no width at it,
    so that the same evidence gets the same word at every budget."""
    if effect.sd < resolution / 2 or effect.sd == 0:
        if abs(effect.mean) < resolution / 2 or effect.mean == 0:
            return None
        return effect.mean, effect.mean
    return effect.low, effect.high


def verdict(effect: Optional[Estimate], margin: Optional[float] = None, paper_effect: Optional[float] = None,
            resolution: float = 0.0) -> str:
    """What an interval of an effect says about a claim's statement (``higher - lower`` > 0, or a
    measure's change beyond its control's), in this order:

    ``no spread`` when every seed gave no effect (``_read_at``), as a measure does that sits at a bound
    of its range with and without the cause; ``holds`` when the interval excludes 0 above;
    ``non-inferior`` (a claim of "matches or beats", with ``margin``) when it excludes a deficit as
    large as ``margin``; ``opposite`` when it excludes 0 below; ``excludes the paper's effect`` when it
    leaves the sign open but excludes ``paper_effect``; ``undetermined`` otherwise, and without an
    interval. What the paper found at its own regime does not enter: that is ``beside_paper``'s.
    """
    if effect is None or effect.low is None:
        return UNDETERMINED
    read = _read_at(effect, resolution)
    if read is None:
        return NO_SPREAD
    low, high = read
    if low > 0:
        return HOLDS
    if margin is not None and low > -margin:
        return NONINFERIOR
    if high < 0:
        return OPPOSITE
    if paper_effect is not None and not low <= paper_effect <= high:
        return EXCLUDES_PAPER
    return UNDETERMINED


def beside_paper(effect: Optional[Estimate], paper_sign: Optional[int], paper_regime: bool = False,
                 resolution: float = 0.0) -> str:
    """How an effect's interval sits beside the published result of the nearest regime, whose sign is
    ``paper_sign`` (+1 or -1; None where nothing is published): ``same sign`` or ``other sign`` where
    the interval excludes 0, ``sign undetermined`` where it does not, ``no published value``; and
    ``reproduced`` in place of ``same sign`` where the effect is positive (the statement holds) and the
    study ran at a regime the paper itself ran (``paper_regime``)."""
    if paper_sign is None:
        return NO_PUBLISHED
    read = None if effect is None or effect.low is None else _read_at(effect, resolution)
    if read is None or read[0] <= 0 <= read[1]:
        return SIGN_OPEN
    sign = 1 if read[0] > 0 else -1
    if sign != paper_sign:
        return OTHER_SIGN
    return REPRODUCED if paper_regime and sign > 0 else SAME_SIGN


def above_chance(scores: Sequence[float], chance: float, images: Optional[int] = None,
                 level: float = 0.95) -> Estimate:
    """A configuration's main score over its seeds (points) less ``chance``, with its ``level`` t
    interval. Every seed is scored on the same ``images``, so their sampling error does not average out
    over seeds: a model that names one class for every image scores that class's share of the set,
    which differs from chance by about a binomial standard error. Where ``images`` is known that error,
    at the mean score, joins the seeds' in the interval's standard error (sd² / n + p (1 - p) / images);
    none from one seed."""
    excess = estimate([s - chance for s in scores], "t", level)
    if excess.sd is None or not images:
        return excess
    p = min(1.0, max(0.0, (excess.mean + chance) / 100))  # a mean score outside [0, 100] only by rounding
    se = math.sqrt(excess.sd ** 2 / excess.n + (100 * binomial_se(p, images)) ** 2)
    half = t_quantile(0.5 + level / 2, excess.n - 1) * se
    return Estimate(excess.n, excess.mean, excess.sd, excess.mean - half, excess.mean + half)


def proportion_interval(right: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper and Pearson's exact ``level`` interval of a proportion seen as ``right`` of ``n``
    independent examples: one run's accuracy on its evaluation set, against which chance is tested."""
    from scipy.stats import beta

    if not 0 <= right <= n or n < 1:
        raise ValueError(f"{right} of {n}: a proportion needs 0 <= right <= n and n >= 1")
    tail = (1 - level) / 2
    low = 0.0 if right == 0 else float(beta.ppf(tail, right, n - right + 1))
    high = 1.0 if right == n else float(beta.ppf(1 - tail, right + 1, n - right))
    return low, high


def claim_digits(metric: str) -> int:
    """Decimals an effect on ``metric`` is shown with: points of accuracy 1, β and tree edges 2,
    probabilities, AUCs and curvature 3."""
    if metric in ("text_nearer_root", "curvature_fall", "shapes_jaccard", "shapes_h_precision",
                  "family_similarity_auc", "family_cone_auc", "caption_root_order_auc", "caption_cone_order_auc"):
        return 3
    return 2 if metric in ("temperature_final", "shapes_tie", "shapes_mistake_tie") else 1


def paper_cell(effect: Optional[float], source: str) -> str:
    """The claims tables' "paper" cell: the published effect with its source, or the source alone."""
    if effect is None or effect != effect:  # None, or NaN read back from a CSV
        return source if isinstance(source, str) else ""
    return f"{effect:+.2f} ({source})"


def _given(value) -> bool:
    return value is not None and value == value  # None, or NaN read back from a CSV


# A configuration's metric the study has no run of (the configuration table's cell).
MISSING = "missing"


# (study metric, heading, digits): the run measures the configuration table shows beside the groups, where
# the runs have them: the learned temperature, the Shapes mistakes' tree-induced error and the family
# captions' entailment AUC (``euclip analyze hierarchy``), and the world's hard negatives (in %).
RUN_COLUMNS = (("temperature_final", "β final", 2), ("shapes_tie", "tree-induced error (Shapes)", 2),
               ("family_cone_auc", "entailment AUC, cone", 3), ("world/hard-negatives", "hard negatives", 1))


def config_table(rows: list[dict], configs: list[str], baseline: str, groups: dict[str, str]) -> list[dict[str, str]]:
    """The configuration table (study.md, ``euclip report``, the README): one display row per
    configuration of ``configs`` from study.csv's ``rows`` (dicts; None or NaN where a value is
    absent): its seeds; each of a suite's ``groups`` (``{metric: heading}``, "main" and "average"
    among them) as mean ± sd over seeds in points (``MISSING`` where it has no run), after whether it
    learned (``learned_cell``) where the rows say; the mean
    difference to the ``baseline`` paired by seed, with its interval, of the main group and of the
    average; then the ``RUN_COLUMNS`` that some configuration has."""
    by = {(r["config"], r["metric"]): r for r in rows}

    def mean_sd(r: Optional[dict], digits: int) -> str:
        if r is None:
            return MISSING
        return f"{r['mean']:.{digits}f}" + (f" ± {r['sd']:.{digits}f}" if _given(r.get("sd")) else "")

    def difference(config: str, metric: str) -> str:
        r = by.get((config, metric), {})
        if config == baseline:
            return "baseline"
        if not _given(r.get("diff_mean")):
            return MISSING
        return f"{r['diff_mean']:+.1f}" + (f" [{r['diff_low']:.1f}, {r['diff_high']:.1f}]" if _given(r.get("diff_low"))
                                           else "")

    measures = [c for c in RUN_COLUMNS if any((config, c[0]) in by for config in configs)]
    learning = any("learned" in r for (_, metric), r in by.items() if metric == "main")
    table = []
    for config in configs:
        seeds = [r["n_seeds"] for (c, _), r in by.items() if c == config]
        row = {"config": config, "seeds": str(int(max(seeds))) if seeds else "0"}
        if learning:
            row["learned"] = learned_cell(by.get((config, "main")))
        row |= {heading: mean_sd(by.get((config, metric)), 1) for metric, heading in groups.items()}
        row |= {f"Δ {groups[m]} vs baseline": difference(config, m) for m in ("main", "average")}
        row |= {heading: mean_sd(by.get((config, metric)), digits) for metric, heading, digits in measures}
        table.append(row)
    return table


def learned_cell(main: Optional[dict]) -> str:
    """Whether a configuration learned, from its study.csv main row (``study.verdicts.learning``): "yes" or
    "no", "–" where unknown (no chance level, or neither test could be made)."""
    flag = None if main is None else main.get("learned")
    if flag is None or flag == "" or flag != flag:  # None, or empty or NaN read back from a CSV
        return "–"
    return "yes" if flag in (True, "True") else "no"


def did_not_learn(rows: Iterable[dict]) -> frozenset[str]:
    """The configurations study.csv's main rows say did not learn (``rows``: as computed, or read back from
    the CSV, where the mark is text)."""
    return frozenset(r["config"] for r in rows if r.get("metric") == "main" and r.get("learned") in (False, "False"))


CLAIMS_HEADER = ("claim", "effect here, raw 95%", "family-wise interval", "statement", "beside the paper",
                 "paper's effect, nearest regime", "other published", "seeds for 80% power")


def claim_cells(c: dict) -> tuple[str, ...]:
    """One claims.csv row as the claims table shows it (study.md and ``euclip report``): the effect
    with its raw 95% interval, with its family-wise one, what they say of the statement, and apart
    from that, how the effect sits beside the published result of the nearest regime."""
    digits = claim_digits(c["metric"])

    def interval(mean, low, high) -> str:
        if not _given(mean):
            return "no runs"
        return f"{mean:+.{digits}f}" + (f" [{low:.{digits}f}, {high:.{digits}f}]" if _given(low) else "")

    effect = interval(c["effect"], c["ci_low"], c["ci_high"]) + (f" (n={int(c['n_seeds'])})" if c["n_seeds"] else "")
    if _given(c.get("config_trained")):
        effect += (f"; trained {c['config_trained']:.{digits}f} from {c['config_init']:.{digits}f}, control "
                   f"{c['control_trained']:.{digits}f} from {c['control_init']:.{digits}f}")
    family = interval(c["effect"], c["fw_low"], c["fw_high"]) + f" ({100 * c['family_level']:.2f}%)"
    seeds = c["seeds_for_80pct_power"]
    return (f"{c['statement']} ({c['metric']})", effect, family, statement_words(c, short=True),
            c["paper"] if isinstance(c.get("paper"), str) else "–",
            paper_cell(c["paper_effect"], c["paper_source"]) if isinstance(c["read_against"], str) and c["read_against"]
            else "none: euclip's own measure" if c.get("own") is True else "–",
            c["beside"] if isinstance(c["beside"], str) and c["beside"] else "–",
            "–" if not _given(seeds) else "more than 1,000" if seeds == math.inf else str(int(seeds)))


def statement_words(c: dict, short: bool = False) -> str:
    """A claims.csv row's verdict on its statement in words: ``short`` as the claims table's cell, else
    with what the family-wise interval shows."""
    if c["verdict"] == NOT_TESTABLE:
        return f"not testable: {c['not_learned']} did not learn"
    given = _given(c.get("margin"))
    if short:
        return c["verdict"] + (f" (margin {c['margin']:g})" if given else "")
    return {HOLDS: "holds: the interval excludes 0 in the statement's direction",
            NONINFERIOR: "non-inferior: the interval excludes a deficit as large as its margin"
                         + (f", {c['margin']:g}" if given else ""),
            OPPOSITE: "opposite: the interval excludes 0 against the statement",
            EXCLUDES_PAPER: "undetermined in sign, but the interval excludes the paper's effect",
            NO_SPREAD: "no effect in any seed (a measure saturated with and without the cause)",
            UNDETERMINED: "undetermined: the interval includes 0"}[c["verdict"]]


def claim_sentence(c: dict) -> str:
    """One claims.csv row as a sentence that says no more than its family-wise interval: the verdict on
    the statement, the effect with that interval (and the raw one), apart from it how the effect sits
    beside the paper's at the nearest regime, and, where the claim is undetermined, whether more seeds
    would settle it at the paper's effect (the power the spread measured here gives)."""
    digits = claim_digits(c["metric"])
    n = int(c["n_seeds"]) if _given(c.get("n_seeds")) else 0
    if c["verdict"] == NOT_TESTABLE:
        return f"**{c['statement']}**: {statement_words(c)} ({c['metric']}, {n} seeds)."
    if not n or not _given(c.get("fw_low")):
        return f"**{c['statement']}**: undetermined ({n} seed{'s' if n != 1 else ''}, no interval)."
    where = (f"{c['effect']:+.{digits}f} [{c['fw_low']:.{digits}f}, {c['fw_high']:.{digits}f}] "
             f"({c['metric']}, {n} seeds; family-wise at {100 * c['family_level']:.2f}%, raw 95% "
             f"[{c['ci_low']:.{digits}f}, {c['ci_high']:.{digits}f}])")
    paper = (f"; beside the paper's {c['read_against']} ({c['paper_effect']:+.2f}): {c['paper']}"
             if _given(c.get("paper_effect")) and isinstance(c.get("read_against"), str) and c["read_against"]
             else "")
    sentence = f"**{c['statement']}**: {statement_words(c)}; {where}{paper}"
    if c["verdict"] == UNDETERMINED:
        sentence += _power_clause(c.get("seeds_for_80pct_power"), n, "the paper's effect")
        sentence += _power_clause(c.get("seeds_for_80pct_power_here"), n, "an effect as large as this one")
    return sentence + "."


def _power_clause(seeds, n: int, what: str) -> str:
    """How many seeds would find ``what`` 80% of the time, at the spread measured."""
    if not _given(seeds):
        return ""
    if seeds == math.inf:
        return f"; more than 1,000 seeds would be needed to find {what}"
    if int(seeds) <= n:
        return f"; {n} seeds find {what} 80% of the time ({int(seeds)} would), so the true effect is likely smaller"
    return f"; {int(seeds)} seeds would find {what} 80% of the time"


# ------------------------------------------------------------------ curves across budgets

@dataclass(frozen=True)
class PowerLaw:
    """A shortfall from a ceiling that falls as a power of the samples seen: ``scale * samples ** -exponent``
    (the form scaling-law comparisons fit to each training procedure's error)."""

    scale: float
    exponent: float

    def at(self, samples: float) -> float:
        return self.scale * samples ** -self.exponent


@dataclass(frozen=True)
class PowerLawFit:
    """A power law fitted to shortfalls each known to a variance: the law, its exponent's standard error,
    and the fit's chi-squared against those variances on ``df`` = budgets - 2 degrees of freedom with its
    p-value (None from two budgets, which any law fits): a curve that misses its points by more than
    their noise has a small one."""

    law: PowerLaw
    exponent_se: float
    chi2: float
    df: int
    p_value: Optional[float]


def fit_power_law(samples: Sequence[float], shortfalls: Sequence[float],
                  log_variances: Sequence[float]) -> PowerLawFit:
    """Weighted least squares through (log samples, log shortfall), each point weighted by the inverse
    of its log shortfall's variance (``log_variances``: the mean's variance over seeds, over the
    shortfall squared): at least two distinct budgets, every shortfall and variance positive."""
    from scipy.special import chdtrc

    if len(set(samples)) < 2 or not len(samples) == len(shortfalls) == len(log_variances):
        raise ValueError("a power law needs shortfalls at two budgets or more, each with a variance")
    if min(shortfalls) <= 0 or min(log_variances) <= 0:
        raise ValueError(f"shortfall {min(shortfalls)}, variance {min(log_variances)}: a power law's are positive")
    x = [math.log(v) for v in samples]
    y = [math.log(e) for e in shortfalls]
    w = [1 / v for v in log_variances]
    total = sum(w)
    mx, my = sum(a * b for a, b in zip(w, x)) / total, sum(a * b for a, b in zip(w, y)) / total
    spread = sum(a * (b - mx) ** 2 for a, b in zip(w, x))
    slope = sum(a * (b - mx) * (c - my) for a, b, c in zip(w, x, y)) / spread
    intercept = my - slope * mx
    chi2 = sum(a * (c - intercept - slope * b) ** 2 for a, b, c in zip(w, x, y))
    df = len(samples) - 2
    return PowerLawFit(PowerLaw(math.exp(intercept), -slope), math.sqrt(1 / spread), chi2, df,
                       float(chdtrc(df, chi2)) if df > 0 else None)


def crossing(a: PowerLaw, b: PowerLaw) -> Optional[float]:
    """The samples at which two power laws' shortfalls are equal; None where they never are (equal
    exponents: parallel in log-log)."""
    if a.exponent == b.exponent:
        return None
    log_samples = (math.log(a.scale) - math.log(b.scale)) / (a.exponent - b.exponent)
    # Nearly parallel laws meet beyond any float (exp overflows past 709): as good as never, but met.
    return math.exp(log_samples) if log_samples < 709 else math.inf
