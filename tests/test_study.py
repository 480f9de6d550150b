"""Studies: statistics against hand computations, the claims file against the study recipes, the
figures, and the study's own checks (the micro study through the CLI: tests/test_micro_study.py)."""

import json
import math
import random
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from euclip_cli import stats
from euclip_cli.cli.main import app
from euclip_cli.config import list_recipes
from euclip_cli.study import jobs as J
from euclip_cli.study import summaries as R
from euclip_cli.study import tables as T
from euclip_cli.config import is_study_recipe
from euclip_cli.study import verdicts as V
from euclip_cli.errors import UsageError
from euclip_cli.study.spec import StudyOptions, load_claims, load_study

runner = CliRunner()


# ---------------------------------------------------------------- statistics

def test_t_interval_matches_a_hand_computation():
    values = [40.0, 43.0, 41.5, 44.5]
    est = stats.estimate(values, "t")
    mean, sd = sum(values) / 4, math.sqrt(sum((v - 41.0 - 1.25) ** 2 for v in values) / 3)
    half = 3.182446305284263 * sd / 2  # t(0.975, 3) from a table, times sd / sqrt(4)
    assert est.n == 4 and est.mean == pytest.approx(mean) and est.sd == pytest.approx(sd)
    assert (est.low, est.high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    one = stats.estimate([3.0])
    assert one.mean == 3.0 and one.sd is None and one.low is None  # one seed: no interval at all


def test_bootstrap_interval_is_reproducible_and_brackets_the_mean():
    values = [1.0, 2.0, 4.0, 7.0, 11.0, 3.0, 5.0, 6.0]
    a, b = stats.estimate(values, "bootstrap", seed=5), stats.estimate(values, "bootstrap", seed=5)
    assert (a.low, a.high) == (b.low, b.high)  # a fixed generator: the same interval every time
    assert min(values) <= a.low < statistics.fmean(values) < a.high <= max(values)
    # A resampled mean of 8 values can only be a multiple of 1/8 of their sum's parts: check one is.
    assert any(math.isclose(a.low * 8, sum(c)) for c in _multisets(values, 8))


def _multisets(values, k):
    from itertools import combinations_with_replacement

    return combinations_with_replacement(values, k)


def test_paired_difference_uses_common_seeds_only():
    a = {0: 50.0, 1: 52.0, 2: 55.0, 3: 60.0}
    b = {0: 48.0, 1: 51.0, 2: 52.0}
    diff = stats.paired_difference(a, b)
    assert diff.n == 3 and diff.mean == pytest.approx((2 + 1 + 3) / 3)
    assert diff.sd == pytest.approx(1.0)
    assert stats.paired_difference({0: 1.0}, {1: 2.0}) is None


def test_the_binomial_standard_error_matches_a_simulation_of_the_evaluation_set():
    """An independent computation: the spread of accuracies over many simulated evaluation sets."""
    import random as rnd

    gen, n, p = rnd.Random(3), 400, 0.3
    accuracies = [sum(gen.random() < p for _ in range(n)) / n for _ in range(4000)]
    assert stats.binomial_se(p, n) == pytest.approx(statistics.stdev(accuracies), rel=0.05)
    assert stats.binomial_se(0.3, 400) == pytest.approx(math.sqrt(0.21 / 400))
    assert stats.binomial_se(1.0, 10) == 0.0
    with pytest.raises(ValueError):
        stats.binomial_se(0.5, 0)


def test_sampling_errors_of_tasks_groups_and_the_average_by_hand(tmp_path):
    from euclip_cli.protocol.tasks import list_tasks

    world = tmp_path / "world"
    world.mkdir()
    (world / "manifest.json").write_text(json.dumps({"eval_size": 400}))
    run = tmp_path / "run"
    run.mkdir()
    keys = [t.key for t in list_tasks("world")]
    lines = []
    for i, key in enumerate(keys):
        metrics = {"main_metric": 0.1 + 0.08 * i}
        if key == "world/retrieval":
            metrics = {"image_retrieval_recall@1": 0.2, "text_retrieval_recall@1": 0.4, "main_metric": 0.3}
        lines.append(json.dumps({"key": key, "checkpoint": "checkpoints/step_1.pt", "step": 1, "metrics": metrics}))
    (run / "eval.jsonl").write_text("\n".join(lines) + "\n")
    errors = R.sampling_errors(J.RunPlan("clip", 0, run, ()), keys, world)
    shapes = 0.1 + 0.08 * keys.index("world/shapes")
    assert errors["world/shapes"] == pytest.approx(100 * math.sqrt(shapes * (1 - shapes) / 400))
    # Text-to-image R@1 over 800 captions (two per image), image-to-text over 400 images, averaged.
    assert errors["world/retrieval"] == pytest.approx(100 * math.sqrt(0.2 * 0.8 / 800 + 0.4 * 0.6 / 400) / 2)
    assert errors["retrieval"] == pytest.approx(errors["world/retrieval"])  # a group of one task
    averaged = [k for k in keys if k != "world/hard-negatives"]  # the ten tasks the average has always had
    by_hand = math.sqrt(sum(errors[k] ** 2 for k in averaged)) / len(averaged)
    assert errors["average"] == pytest.approx(by_hand) and errors["average"] < min(errors[k] for k in averaged)
    assert R.sampling_errors(J.RunPlan("clip", 0, run, ()), keys, tmp_path / "no-world") == {}


def test_the_paired_sampling_error_by_hand_and_against_a_simulation_with_known_truth():
    """Two models scored on the same examples: only the examples one gets right and the other wrong carry
    sampling noise into their difference."""
    import random as rnd

    ours, theirs = [1, 1, 0, 0, 1], [1, 0, 1, 0, 0]  # ours alone right twice, theirs alone once
    assert stats.paired_proportion_se(ours, theirs) == pytest.approx(math.sqrt((3 / 5 - (1 / 5) ** 2) / 5))
    assert stats.paired_proportion_se(ours, ours) == 0.0
    # Known truth: per example, both right 0.5, ours alone 0.15, theirs alone 0.05, neither 0.3; the difference
    # of accuracies over n examples has sd sqrt((0.2 - 0.1^2) / n), far below either score's own binomial one.
    gen, n = rnd.Random(5), 400
    differences, estimates = [], []
    for _ in range(2000):
        draws = [gen.random() for _ in range(n)]
        a = [d < 0.65 for d in draws]
        b = [d < 0.5 or 0.65 <= d < 0.7 for d in draws]
        differences.append((sum(a) - sum(b)) / n)
        estimates.append(stats.paired_proportion_se(a, b))
    truth = math.sqrt((0.2 - 0.1 ** 2) / n)
    assert statistics.stdev(differences) == pytest.approx(truth, rel=0.05)
    assert statistics.fmean(estimates) == pytest.approx(truth, rel=0.02)
    assert truth < math.sqrt(stats.binomial_se(0.65, n) ** 2 + stats.binomial_se(0.55, n) ** 2)  # unpaired
    with pytest.raises(ValueError):
        stats.paired_proportion_se([1, 0], [1])


def test_per_example_outcomes_survive_the_eval_line():
    from euclip_cli.protocol.hits import pack_hits, unpack_hits

    outcomes = [bool(i % 3) for i in range(13)]  # not a whole number of bytes
    packed = json.loads(json.dumps(pack_hits(outcomes)))
    assert packed["n"] == 13 and unpack_hits(packed) == outcomes


def test_paired_sampling_errors_read_both_runs_outcomes_on_the_same_examples(tmp_path):
    from euclip_cli.protocol.hits import pack_hits

    def run(name, shapes, t2i, i2t):
        folder = tmp_path / name
        folder.mkdir()
        hits = {"world/shapes": {"acc1": pack_hits(shapes)},
                "world/retrieval": {"image_retrieval_recall@1": pack_hits(t2i), "text_retrieval_recall@1": pack_hits(i2t)}}
        (folder / "eval.jsonl").write_text("".join(
            json.dumps({"key": key, "checkpoint": "checkpoints/step_1.pt", "step": 1, "metrics": {"main_metric": 0.5},
                        "hits": outcomes}) + "\n" for key, outcomes in hits.items()))
        return J.RunPlan(name, 0, folder, ())

    ours = run("euclip", [1, 1, 0, 0], [1, 0, 1, 1, 0, 0, 1, 1], [1, 1, 0, 0])
    theirs = run("clip", [1, 0, 0, 1], [1, 1, 1, 1, 0, 0, 0, 1], [0, 1, 0, 0])
    errors = R.paired_sampling_errors(ours, theirs, ["world/shapes", "world/retrieval"])
    # Shapes: one example each way of four; retrieval: text-to-image one each way of eight, image-to-text one of four.
    assert errors["world/shapes"] == pytest.approx(100 * math.sqrt(2 / 4 / 4))
    t2i, i2t = math.sqrt(2 / 8 / 8), math.sqrt((1 / 4 - 1 / 16) / 4)
    assert errors["world/retrieval"] == pytest.approx(100 * math.sqrt(t2i ** 2 + i2t ** 2) / 2)
    assert errors["main"] == pytest.approx(errors["world/shapes"]) and "average" not in errors
    other = run("other", [1, 0, 0], [1] * 8, [1] * 4)  # Shapes on other examples: no paired error for it
    assert "world/shapes" not in R.paired_sampling_errors(other, theirs, ["world/shapes", "world/retrieval"])


def test_welchs_interval_of_two_independent_means_is_scipys():
    from scipy.stats import ttest_ind

    rng = random.Random(3)
    for na, nb in ((3, 3), (3, 6), (6, 2), (10, 4)):
        a = [rng.gauss(-2, 2) for _ in range(na)]
        b = [rng.gauss(-10, 5) for _ in range(nb)]
        mean, low, high = stats.welch_difference(stats.estimate(a), stats.estimate(b))
        ci = ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        assert (mean, low, high) == pytest.approx((statistics.fmean(a) - statistics.fmean(b), ci.low, ci.high))
    assert stats.welch_difference(stats.estimate([1.0]), stats.estimate([1.0, 2.0])) is None  # one seed: no spread
    assert stats.welch_difference(stats.estimate([2.0, 2.0]), stats.estimate([1.0, 1.0])) == (1.0, 1.0, 1.0)


def test_the_bonferroni_level_by_hand():
    assert stats.family_level(0.95, 1) == pytest.approx(0.95)
    assert stats.family_level(0.95, 10) == pytest.approx(0.995)  # 0.05 / 10 in the two tails together
    wide = stats.estimate([1.0, 2.0, 4.0], "t", level=0.995)
    # t(0.9975, 2) = 14.089 from a printed table (t(0.975, 2) = 4.303).
    assert wide.high - wide.mean == pytest.approx(14.089 * statistics.stdev([1.0, 2.0, 4.0]) / math.sqrt(3), rel=1e-3)


def test_the_t_tests_p_value_is_the_level_whose_interval_touches_zero():
    for values in ([1.0, 2.0, 4.0], [-3.0, 0.5, -1.0, -2.5], [0.2, -0.1]):
        p = stats.t_test_p(values)
        touching = stats.estimate(values, "t", level=1 - p)
        assert min(abs(touching.low), abs(touching.high)) == pytest.approx(0.0, abs=1e-9)
    assert stats.t_test_p([2.0, 2.0, 2.0]) == 0.0 and stats.t_test_p([0.0, 0.0]) == 1.0
    assert stats.t_test_p([1.0]) is None


def test_holms_levels_by_hand_and_against_its_adjusted_p_values():
    levels = stats.holm_levels({"a": 0.01, "b": 0.02, "c": 0.04})
    # Bonferroni would reject a alone (0.05 / 3 = 0.0167); Holm steps down to 0.025 for b and 0.05 for c.
    assert levels == pytest.approx({"a": 1 - 0.05 / 3, "b": 1 - 0.05 / 2, "c": 0.95})
    levels = stats.holm_levels({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    # d (0.005 <= 0.0125) and a (0.01 <= 0.0167) fall; c (0.03 > 0.025) stops the steps: b is read there too.
    assert levels == pytest.approx({"d": 1 - 0.05 / 4, "a": 1 - 0.05 / 3, "c": 1 - 0.05 / 2, "b": 1 - 0.05 / 2})
    assert stats.holm_levels({}) == {} and stats.holm_levels({"a": 0.3}) == {"a": 0.95}
    # Holm's rejections as its adjusted p-values state them (the running maximum of (m - k) p_(k)).
    rng = random.Random(0)
    for _ in range(500):
        m = rng.randint(1, 12)
        p = {str(i): rng.random() ** rng.choice([1, 3, 6]) for i in range(m)}
        order = sorted(p, key=p.get)
        adjusted, running = {}, 0.0
        for k, key in enumerate(order):
            running = max(running, min(1.0, (m - k) * p[key]))
            adjusted[key] = running
        levels = stats.holm_levels(p)
        assert {k for k in p if p[k] < 1 - levels[k]} == {k for k in p if adjusted[k] < 0.05}


def test_power_matches_a_simulation_with_known_truth():
    import numpy as np
    from scipy.stats import t as student

    rng = np.random.default_rng(0)
    for n, effect, sd, level in ((3, 10.0, 4.0, 0.95), (5, 2.0, 3.0, 0.995), (8, 1.0, 2.0, 0.95)):
        draws = rng.normal(effect, sd, size=(40_000, n))
        half = student.ppf(0.5 + level / 2, n - 1) * draws.std(axis=1, ddof=1) / math.sqrt(n)
        excluded = np.mean(np.abs(draws.mean(axis=1)) > half)  # the interval excludes 0
        assert stats.power(n, effect, sd, level) == pytest.approx(excluded, abs=0.01), (n, effect, sd)


@pytest.mark.parametrize("n, ratio, level", [(2, 20.0, 0.95), (3, 5.0, 1 - 0.05 / 14), (4, 5.0, 1 - 0.05 / 14),
                                             (6, 5.0, 1 - 0.05 / 14), (2, 80.0, 1 - 0.05 / 14), (5, 0.2, 0.95)])
def test_power_holds_at_noncentralities_where_scipys_noncentral_t_gives_nan(n, ratio, level):
    """``ratio``: the effect over its seed-to-seed sd."""
    import numpy as np
    from scipy.stats import nct
    from scipy.stats import t as student

    critical = student.ppf(0.5 + level / 2, n - 1)
    shift = ratio * math.sqrt(n)
    scipy_says = nct.sf(critical, n - 1, shift) + nct.cdf(-critical, n - 1, shift)
    assert math.isnan(scipy_says) or shift < 1  # the cases SciPy 1.17 cannot compute, and one it can
    sd = 3.0
    effect = ratio * sd
    draws = np.random.default_rng(n).normal(effect, sd, size=(400_000, n))
    half = critical * draws.std(axis=1, ddof=1) / math.sqrt(n)
    excluded = np.mean(np.abs(draws.mean(axis=1)) > half)
    tolerance = 4 * math.sqrt(max(excluded * (1 - excluded), 1e-6) / len(draws))
    assert stats.power(n, effect, sd, level) == pytest.approx(excluded, abs=tolerance)
    assert 0.0 <= stats.power(n, effect, sd, level) <= 1.0


def test_seeds_needed_give_eighty_percent_power_and_no_fewer_do():
    for sd, effect, level in ((4.0, 6.75, 0.95), (4.0, 6.75, 0.995), (1.0, 1.0, 0.95), (2.5, -1.48, 0.99)):
        n = stats.seeds_needed(sd, effect, level)
        assert stats.power(n, effect, sd, level) >= 0.8 > stats.power(n - 1, effect, sd, level) if n > 2 else True
    # At 50% power the old yardstick (a half width as wide as the effect) needed 4 seeds for these numbers.
    assert stats.seeds_needed(4.0, 6.75) == 5
    # Where SciPy's noncentral t gave NaN for every n from 5 on, the search read on to 7.
    assert stats.seeds_needed(1.0, 5.0, 1 - 0.05 / 14) == 5
    assert stats.seeds_needed(0.0, 1.0) == 2  # no spread: the fewest seeds with an interval at all
    assert stats.seeds_needed(None, 1.0) is None and stats.seeds_needed(1.0, 0.0) is None
    assert stats.seeds_needed(100.0, 0.1, most=50) is None  # more seeds than anyone would run


def test_a_bootstrap_needs_eight_seeds():
    assert stats.estimate([1.0, 2.0, 4.0], "bootstrap").low is None  # 10 distinct resamples: no interval
    assert stats.estimate([1.0, 2.0, 4.0, 7.0, 11.0, 3.0, 5.0, 6.0], "bootstrap").low is not None


@pytest.mark.parametrize("low,high,margin,paper,expected", [
    (0.5, 2.0, None, None, "holds"), (-2.0, -0.5, None, None, "opposite"),
    (-0.5, 2.0, None, None, "undetermined"), (0.0, 1.0, None, None, "undetermined"),
    # A paper whose own table runs against the statement does not turn the statement round.
    (-2.0, -0.5, None, -1.48, "opposite"),
    (-0.8, 2.0, 1.0, None, "non-inferior"), (-1.2, 2.0, 1.0, None, "undetermined"),
    (-0.8, -0.2, 1.0, None, "non-inferior"), (-3.0, -1.5, 1.0, None, "opposite"),
    (-6.7, 0.1, None, 6.75, "excludes the paper's effect"), (-6.7, 0.1, None, -1.48, "undetermined"),
    (-1.0, 7.0, None, 6.75, "undetermined"), (0.5, 2.0, None, 6.75, "holds")])
def test_verdicts_read_the_statement(low, high, margin, paper, expected):
    assert stats.verdict(stats.Estimate(3, (low + high) / 2, 1.0, low, high), margin, paper) == expected
    assert stats.verdict(stats.Estimate(1, 1.0, None, None, None)) == "undetermined"


@pytest.mark.parametrize("low,high,sign,regime,expected", [
    (0.5, 2.0, +1, False, "same sign"), (-2.0, -0.5, -1, False, "same sign"), (-2.0, -0.5, +1, False, "other sign"),
    (0.5, 2.0, -1, False, "other sign"), (-0.5, 2.0, +1, False, "sign undetermined"),
    (0.5, 2.0, None, False, "no published value"),
    # "reproduced" only where the statement holds at a regime the paper ran.
    (0.5, 2.0, +1, True, "reproduced"), (-2.0, -0.5, -1, True, "same sign"), (-0.5, 2.0, +1, True, "sign undetermined")])
def test_the_paper_is_read_apart_from_the_statement(low, high, sign, regime, expected):
    assert stats.beside_paper(stats.Estimate(3, (low + high) / 2, 1.0, low, high), sign, regime) == expected


def test_no_spread_is_said_only_of_no_effect_and_unanimous_seeds_read_by_their_sign():
    assert stats.verdict(stats.estimate([0.0, 0.0, 0.0])) == "no spread"
    assert stats.beside_paper(stats.estimate([0.0, 0.0, 0.0]), +1) == "sign undetermined"
    # Every seed the same nonzero effect: the 2,048-step [ROOT] case, once "no spread" where 512 steps'
    # weaker evidence held; the same evidence now gets the same word.
    assert stats.verdict(stats.estimate([0.5, 0.5, 0.5])) == "holds"
    assert stats.verdict(stats.estimate([-0.5, -0.5, -0.5])) == "opposite"
    assert stats.beside_paper(stats.estimate([0.5, 0.5, 0.5]), -1) == "other sign"
    assert stats.verdict(stats.estimate([-0.5, -0.5]), margin=1.0) == "non-inferior"
    # Agreeing to within half the resolution the claim is read at: on 0, no spread; off it, its sign.
    assert stats.verdict(stats.estimate([0.0, 0.0, 0.0004]), resolution=1e-3) == "no spread"
    nearly = stats.estimate([1.0, 1.0, 0.999996])
    assert stats.verdict(nearly, resolution=1e-3) == "holds"
    assert stats.verdict(nearly) == "holds"  # read at full precision, the interval has a width
    assert stats.verdict(stats.estimate([0.9, 1.0, 0.95]), resolution=1e-3) == "holds"


def test_a_configuration_at_chance_has_not_learned_even_when_its_seeds_agree():
    """The hycoclip study's failure: six seeds at 8.9 ± 0.3 on Shapes against 8.3. Their t interval alone
    excludes chance, but all six are scored on the same 1,000 images, whose sampling error (about 0.9
    points) the seeds share; counted, the interval includes chance, and no run excludes it on its own."""
    scores = {s: v for s, v in enumerate([8.6, 9.3, 8.7, 8.9, 8.6, 9.2])}
    assert stats.estimate([v - 100 / 12 for v in scores.values()]).low > 0
    idle = V.learning(scores, 100 / 12, 1000)
    assert idle["above_chance_low"] < 0 < idle["above_chance_high"]
    assert idle["runs_above_chance"] == 0 and idle["learned"] is False
    # A run at 12.1% excludes chance on its own (121 of 1,000: exact interval from 10.1%); three such runs
    # learned, though three seeds' interval is wide.
    few = V.learning({0: 12.1, 1: 19.0, 2: 9.5}, 100 / 12, 1000)
    assert few["above_chance_low"] < 0 and few["runs_above_chance"] == 2 and few["learned"] is False
    assert V.learning({0: 12.1, 1: 19.0, 2: 12.5}, 100 / 12, 1000)["learned"] is True
    assert V.learning({0: 40.0}, 100 / 12, None)["learned"] is None  # one seed, outcomes unknown
    assert V.learning({0: 40.0, 1: 45.0, 2: 50.0}, 100 / 12, None)["learned"] is True


def test_an_exact_interval_of_a_proportion_is_clopper_and_pearsons():
    from scipy.stats import binomtest

    for right, n in ((0, 10), (121, 1000), (83, 1000), (10, 10), (1, 3)):
        ci = binomtest(right, n).proportion_ci(0.95, "exact")
        assert stats.proportion_interval(right, n) == pytest.approx((ci.low, ci.high))


# ---------------------------------------------------------------- recipes and claims

def test_a_claims_sentence_says_its_verdict_its_intervals_the_paper_apart_and_what_more_seeds_would_do():
    row = {"statement": "EuCLIP matches or beats CLIP", "metric": "main", "n_seeds": 6, "effect": -3.04,
           "ci_low": -6.5, "ci_high": 0.4, "fw_low": -7.9, "fw_high": 1.81, "family_level": 1 - 0.05 / 3,
           "verdict": "undetermined", "paper": "sign undetermined",
           "read_against": "Table 8 (small)", "paper_effect": -1.48, "margin": None,
           "seeds_for_80pct_power": 40, "seeds_for_80pct_power_here": 12}
    assert stats.claim_sentence(row) == (
        "**EuCLIP matches or beats CLIP**: undetermined: the interval includes 0; -3.0 [-7.9, 1.8] (main, 6 seeds; "
        "family-wise at 98.33%, raw 95% [-6.5, 0.4]); beside the paper's Table 8 (small) (-1.48): sign undetermined; "
        "40 seeds would find the paper's effect 80% of the time; 12 seeds would find an effect as large as this one "
        "80% of the time.")
    row.update(seeds_for_80pct_power=math.inf, seeds_for_80pct_power_here=4)
    assert ("more than 1,000 seeds would be needed to find the paper's effect; 6 seeds find an effect as large as "
            "this one 80% of the time (4 would), so the true effect is likely smaller.") in stats.claim_sentence(row)
    row.update(verdict="opposite", paper="same sign", fw_high=-0.5)
    assert stats.claim_sentence(row).startswith(
        "**EuCLIP matches or beats CLIP**: opposite: the interval excludes 0 against the statement; -3.0 [-7.9, -0.5]")
    assert stats.claim_sentence(row).endswith("beside the paper's Table 8 (small) (-1.48): same sign.")
    row.update(verdict="excludes the paper's effect", paper_effect=6.75, read_against="Table 5 (medium)", fw_high=1.81)
    assert stats.claim_sentence(row).startswith("**EuCLIP matches or beats CLIP**: undetermined in sign, but the "
                                                "interval excludes the paper's effect; -3.0 [-7.9, 1.8]")
    assert "seeds would" not in stats.claim_sentence(row)  # decided: no power to plan
    row.update(verdict="non-inferior", margin=1.0, fw_low=-0.9)
    assert "non-inferior: the interval excludes a deficit as large as its margin, 1; -3.0" in stats.claim_sentence(row)
    row.update(verdict="holds", paper="no published value", read_against="", paper_effect=None, fw_low=0.5)
    assert "holds: the interval excludes 0 in the statement's direction; -3.0 [0.5, 1.8]" in stats.claim_sentence(row)
    assert "paper" not in stats.claim_sentence(row)
    row.update(verdict="not testable", not_learned="multi-8, ps-8")
    assert stats.claim_sentence(row) == ("**EuCLIP matches or beats CLIP**: not testable: multi-8, ps-8 did not "
                                         "learn (main, 6 seeds).")
    row.update(verdict="holds", n_seeds=1, fw_low=None)
    assert stats.claim_sentence(row) == "**EuCLIP matches or beats CLIP**: undetermined (1 seed, no interval)."


def test_every_claim_names_configurations_of_a_shipped_study():
    studies = [load_study(name) for name in list_recipes() if is_study_recipe(name)]
    assert studies, "no study recipe is shipped"
    for claim in load_claims():
        # One study must have both configurations, or no study tests the claim.
        assert any(set(claim.configs) <= set(s.configs) for s in studies), f"claim {claim.id} names {claim.configs}"
        for effect in V.paper_effects(claim):  # and its published rows exist
            if claim.metric == "main":
                assert effect.effect is not None and "ImageNet" in effect.source, claim.id
            else:  # Sun and Li's temperatures: the source of the direction, no effect
                assert effect.effect is None and effect.source.startswith("Sun and Li"), claim.id


def test_the_paper_effects_are_read_from_the_published_tables_of_each_scale():
    claim = next(c for c in load_claims() if c.id == "no-final-ln-helps-euclip")
    (effect,) = V.paper_effects(claim)
    assert effect.effect == pytest.approx(28.97 - 22.22) and effect.table == "Table 5 (medium)"
    small, medium = V.paper_effects(next(c for c in load_claims() if c.id == "euclip-beats-clip"))
    assert small.effect == pytest.approx(3.476 - 4.96) and small.table == "Table 8 (small)"
    assert medium.effect == pytest.approx(28.97 - 27.92) and medium.table == "Table 4 (medium)"
    assert V.read_against([small, medium], "medium") == (medium, [small])
    assert V.read_against([effect], "small") == (effect, [])  # no small row: the table it has
    claim = next(c for c in load_claims() if c.id == "learnable-temperature-helps-ps-inner")
    (effect,) = V.paper_effects(claim)
    assert effect.effect == pytest.approx(30.50 - 21.20) and "Table 7" in effect.source  # learnable vs frozen at 1
    claim = next(c for c in load_claims() if c.id == "product-sphere-settles-below-sphere")
    assert V.paper_effects(claim)[0].source == ("Sun and Li Table 7: sphere-init2.659 4.033 vs ps-inner-init2.659 "
                                                "2.231, final temperature as printed")


def test_siglip_in_clips_geometry_is_read_against_laions_grid_at_the_studys_samples_seen():
    from euclip_cli.published import grid_samples, laion_scaling_grid

    small, medium = V.paper_effects(next(c for c in load_claims() if c.id == "siglip-matches-infonce-clip"))
    # The grid's ViT-B/32 cells as its notebook prints them: 0.108 vs 0.112 at 12.8M, 0.397 vs 0.404 at 128M.
    assert (small.scale, small.effect) == ("small", pytest.approx(10.8 - 11.2))
    assert (medium.scale, medium.effect) == ("medium", pytest.approx(39.7 - 40.4))
    assert "SigLIP 10.8 vs CLIP 11.2" in small.source and "best of a sweep" in small.source
    assert [grid_samples(x) for x in ("1.28M", "12.8M", "1.28B")] == [1_280_000, 12_800_000, 1_280_000_000]
    with pytest.raises(ValueError, match="'12.8'"):
        grid_samples("12.8")
    grid = laion_scaling_grid()
    assert not grid.duplicated(["arch", "model", "samples_seen"]).any()
    assert set(grid["model"]) == {"CLIP", "SigLIP"} and all(grid_samples(x) > 0 for x in grid["samples_seen"])

    study = load_study("study-siglip")
    shapes = {"clip-siglip": {0: 16.0, 1: 18.0, 2: 17.5}, "clip": {0: 48.0, 1: 50.0, 2: 51.0}}
    by_config = {c: {seed: {"main": v} for seed, v in values.items()} for c, values in shapes.items()}
    rows = {r["claim"]: r for r in V.evaluate_claims(study, load_claims(), by_config, reading("small"))}
    row = rows["siglip-matches-infonce-clip"]
    assert row["read_against"] == "LAION grid ViT-B-32 12.8M" and not row["own"]
    assert row["paper_effect"] == pytest.approx(-0.4) and "128M" in row["beside"]
    # The statement fails here, and the deficit has the grid's sign: two readings, not one word.
    assert row["verdict"] == "opposite" and row["paper"] == "same sign"


def test_a_study_is_read_against_the_scale_whose_budget_it_reaches():
    from euclip_cli.data.datacomp import scale_for_steps

    assert [scale_for_steps(s) for s in (256, 3124, 3125, 31_249, 31_250, 10 ** 6)] == [
        "small", "small", "small", "small", "medium", "medium"]
    study = load_study("study-geometries")
    reading = V.regime(study, {"clip": {0: {"temperature_init": 14.29, "temperature_final": 14.35}},
                               "meru": {0: {"curvature_init": 1.0, "curvature_final": 0.8}}})
    assert reading["steps"] == 256 and reading["samples"] == 32_768 and reading["scale"] == "small"
    # The tiny recipes' schedule: 100 warm-up steps to 2.5e-4, then a cosine to 0 at 256.
    by_hand = sum(2.5e-4 * (s + 1) / 100 if s < 100 else 2.5e-4 * 0.5 * (1 + math.cos(math.pi * (s - 100) / 156))
                  for s in range(256))
    assert reading["summed_lr"] == pytest.approx(by_hand)
    beta, curvature = reading["scalars"]
    assert beta["frozen"] and beta["relative_change"] == pytest.approx(0.06 / 14.29)
    assert not curvature["frozen"] and curvature["relative_change"] == pytest.approx(0.2)


def test_a_short_study_reads_euclip_against_clip_in_table_8s_direction():
    study = load_study("study-geometries")
    shapes = {"euclip": {0: 30.0, 1: 28.0, 2: 29.0}, "clip": {0: 44.0, 1: 40.0, 2: 45.0}}
    by_config = {c: {seed: {"main": v} for seed, v in values.items()} for c, values in shapes.items()}
    small = {r["claim"]: r for r in V.evaluate_claims(study, load_claims(), by_config, reading("small"))}["euclip-beats-clip"]
    medium = {r["claim"]: r for r in V.evaluate_claims(study, load_claims(), by_config, reading("medium"))}["euclip-beats-clip"]
    # Table 8 has EuCLIP 1.48 behind CLIP: the statement ("matches or beats") is shown not to hold, at either
    # scale; what changes with the scale is the published sign the deficit sits beside.
    assert small["read_against"] == "Table 8 (small)" and small["verdict"] == "opposite" and small["margin"] == 1.0
    assert small["paper"] == "same sign" and medium["paper"] == "other sign"
    assert "Table 4" in small["beside"] and medium["read_against"] == "Table 4 (medium)"
    assert medium["verdict"] == "opposite" and medium["margin"] == 1.0
    assert small["family_size"] == 1 and small["family_level"] == pytest.approx(0.95)


def test_holm_adjusts_the_declared_primary_claims_among_themselves_and_the_rest_apart():
    from dataclasses import replace

    study = load_study("study-geometries")
    assert study.primary == ("euclip-beats-clip", "entailment-helps-euclidean", "no-final-ln-helps-euclip")
    values = {"euclip": [30.0, 34.0, 38.0], "euclip-ln": [30.0, 30.0, 30.0], "clip": [40.0, 41.0, 45.0],
              "meru": [20.0, 26.0, 21.0]}
    by_config = {c: {seed: {"main": v} for seed, v in enumerate(vs)} for c, vs in values.items()}
    out = [r for r in V.evaluate_claims(study, load_claims(), by_config, reading("small")) if r["n_seeds"]]
    # The primary family first, in its declared order.
    assert [r["claim"] for r in out] == ["euclip-beats-clip", "no-final-ln-helps-euclip", "euclip-beats-meru"]
    rows = {r["claim"]: r for r in out}
    ln, clip, meru = rows["no-final-ln-helps-euclip"], rows["euclip-beats-clip"], rows["euclip-beats-meru"]
    assert ln["family"] == clip["family"] == "primary" and meru["family"] == "secondary"
    assert ln["family_size"] == clip["family_size"] == 2 and meru["family_size"] == 1
    # EuCLIP - CLIP: -10, -7, -7 (p = 0.015 < 0.05 / 2), read first at 97.5%; the final LN: 0, 4, 8 (p = 0.23),
    # the last step, at 95%. Alone in its family, MERU's claim is read at 95% too.
    t_statistic = 8.0 / (statistics.stdev([-10.0, -7.0, -7.0]) / math.sqrt(3))
    assert clip["p_value"] == pytest.approx(2 * student_sf(t_statistic, 2), rel=1e-6)
    assert clip["family_level"] == pytest.approx(1 - 0.05 / 2)
    assert ln["family_level"] == pytest.approx(0.95) and meru["family_level"] == pytest.approx(0.95)
    half = student_quantile(1 - 0.05 / 4, 2) * statistics.stdev([-10.0, -7.0, -7.0]) / math.sqrt(3)
    assert (clip["fw_low"], clip["fw_high"]) == pytest.approx((-8.0 - half, -8.0 + half))
    assert (ln["fw_low"], ln["fw_high"]) == pytest.approx((ln["ci_low"], ln["ci_high"]))
    # Table 5 (medium) is the only table with this ablation: read there, its +6.75 lies in the interval.
    assert ln["read_against"] == "Table 5 (medium)" and ln["verdict"] == "undetermined"
    # A study that declares no primary claims decides all of them as one family.
    single = {r["claim"]: r for r in V.evaluate_claims(replace(study, primary=()), load_claims(), by_config, reading("small"))
              if r["n_seeds"]}
    assert {r["family"] for r in single.values()} == {"all"} and single["euclip-beats-meru"]["family_size"] == 3


def reading(scale: str) -> dict:
    """What evaluate_claims reads of a regime (``verdicts.regime``): the scale, not one the paper ran."""
    return {"scale": scale, "paper_regime": False}


def student_sf(x, df):
    from scipy.stats import t

    return float(t.sf(x, df))


def student_quantile(p, df):
    from scipy.stats import t

    return float(t.ppf(p, df))


def test_a_measured_property_is_credited_only_with_what_training_changed_beyond_its_control():
    study = load_study("study-geometries")
    key, init = "text_nearer_root", "text_nearer_root" + V.AT_INIT
    trained = {"euclip": [0.99, 1.0, 0.97], "euclidean-d2-l0": [0.95, 0.98, 0.9]}
    untrained = {"euclip": [0.8, 0.85, 0.9], "euclidean-d2-l0": [0.8, 0.85, 0.9]}  # the same init for both
    by_config = {c: {s: {key: trained[c][s], init: untrained[c][s]} for s in range(3)} for c in trained}
    (row,) = [r for r in V.evaluate_claims(study, load_claims(), by_config, reading("small")) if r["n_seeds"]]
    assert row["claim"] == "euclip-text-nearer-root" and row["configs"] == "euclip (control euclidean-d2-l0)"
    assert row["effect"] == pytest.approx(statistics.fmean([0.04, 0.02, 0.07]))
    assert row["config_trained"] == pytest.approx(statistics.fmean(trained["euclip"]))
    assert row["config_init"] == pytest.approx(0.85) and row["control_init"] == pytest.approx(0.85)
    saturated = {c: {s: {key: 1.0, init: 1.0} for s in range(3)} for c in trained}
    (row,) = [r for r in V.evaluate_claims(study, load_claims(), saturated, reading("small")) if r["n_seeds"]]
    assert row["verdict"] == "no spread" and row["effect"] == 0.0
    # The 2,048-step study's case: the measure stays at 1 with entailment and falls to 0 without it, one
    # seed's control at 4e-6 (one comparison of many): the effect sits at its bound, the seeds agree to far
    # finer than the 0.001 it is read at, and every seed shows all of it: it holds, as weaker evidence does.
    control = {0: 0.0, 1: 0.0, 2: 4e-6}
    at_bound = {"euclip": {s: {key: 1.0, init: 1.0} for s in range(3)},
                "euclidean-d2-l0": {s: {key: control[s], init: 1.0} for s in range(3)}}
    (row,) = [r for r in V.evaluate_claims(study, load_claims(), at_bound, reading("small")) if r["n_seeds"]]
    assert row["verdict"] == "holds" and row["effect"] == pytest.approx(1.0, abs=1e-5)


def test_a_temperature_claim_compares_the_learned_beta_paired_by_seed():
    study = load_study("study-temperature-noise")
    finals = {"sphere-m40": {0: 21.0, 1: 21.0, 2: 22.5}, "sphere-m0": {0: 18.0, 1: 18.5, 2: 19.0}}
    by_config = {c: {seed: {"temperature_final": v} for seed, v in values.items()} for c, values in finals.items()}
    (row,) = [r for r in V.evaluate_claims(study, load_claims(), by_config, reading("small")) if r["n_seeds"]]
    assert row["claim"] == "noisier-captions-raise-the-temperature" and row["metric"] == "temperature_final"
    diffs = [3.0, 2.5, 3.5]
    assert row["effect"] == pytest.approx(statistics.fmean(diffs))
    half = 4.302652729911275 * statistics.stdev(diffs) / math.sqrt(3)  # t(0.975, 2)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((statistics.fmean(diffs) - half, statistics.fmean(diffs) + half))
    # A direction without a value: the effect's sign is read beside it, the paper's own regime never run here.
    assert row["verdict"] == "holds" and row["paper_effect"] is None and row["paper"] == "same sign"
    assert row["seeds_for_80pct_power"] is None  # no published value to measure the spread against
    assert row["paper_source"] == "Sun and Li, sections 2.1 (Figure 1) and 2.4: a direction, no value"


def test_a_claim_with_a_published_effect_says_how_many_seeds_give_eighty_percent_power():
    study = load_study("study-geometries")
    shapes = {"euclip": {0: 30.0, 1: 34.0, 2: 38.0}, "euclip-ln": {0: 30.0, 1: 30.0, 2: 30.0}}  # paired: 0, 4, 8
    by_config = {c: {seed: {"main": v} for seed, v in values.items()} for c, values in shapes.items()}
    (row,) = [r for r in V.evaluate_claims(study, load_claims(), by_config, reading("small")) if r["n_seeds"]]
    assert row["claim"] == "no-final-ln-helps-euclip" and row["paper_effect"] == pytest.approx(6.75)
    assert row["seeds_for_80pct_power"] == stats.seeds_needed(4.0, 6.75, 0.95) == 5  # a family of one claim
    text = T.to_markdown(study, {"rows": [], "claims": [row], "noise": [], "seeds": [0, 1, 2],
                                 "regime": V.regime(study, {})})
    assert "| 5 |" in text and "read against the paper's small scale" in text


def test_an_unusable_study_folder_is_refused_before_any_world_is_generated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the noise study's worlds would go to ./data/world-mismatch-P
    (tmp_path / "file").write_text("x")
    result = runner.invoke(app, ["study", "--recipe", "study-temperature-noise", "--out", str(tmp_path / "file")])
    assert result.exit_code == 2 and "is a file where a folder is needed" in " ".join(result.output.split())
    assert not (tmp_path / "data").exists()


def test_a_bad_study_recipe_lists_every_problem(tmp_path):
    path = tmp_path / "study-bad.toml"
    path.write_text('[study]\nseeds = 0\nbaseline = "nope"\ninterval = "z"\ntasks = "world/colr"\n'
                    'primary = ["euclip-beats-clip", "no-such-claim", "euclip-beats-clip"]\n[configs.a]\nrecipe = "tiny-clip"\n'
                    'overrides = ["optim.lr=fast"]\n[configs.b]\nrecipe = "tiny-clip"\n')
    result = runner.invoke(app, ["study", "--recipe", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    for text in ("seeds must be an integer in [1, 10,000], not 0", "baseline 'nope'", "interval 'z'", "optim.lr", "world/colr",
                 "study.primary: 'no-such-claim' is not a claim of euclip_cli/study/claims.toml",
                 "study.primary: claim 'euclip-beats-clip' compares euclip, clip, but the study has no configuration "
                 "euclip, clip", "study.primary: a claim is named more than once"):
        assert text in " ".join(result.output.split()), text
    path.write_text('[study]\nprimary = "euclip-beats-clip"\n[configs.a]\nrecipe = "tiny-clip"\n[configs.b]\nrecipe = "tiny-clip"\n')
    result = runner.invoke(app, ["study", "--recipe", str(path)])
    assert result.exit_code == 2 and "study.primary: must be a list of claim ids" in result.output


def test_the_study_figures_legend_hides_no_configuration():
    from euclip_cli.figures import study_canvas

    configs = [f"config-{i}" for i in range(10)]
    # The last configuration's intervals reach the axes' corners, where a legend inside would sit.
    rows = [{"config": c, "metric": m, "mean": 5.0 + 5 * i, "ci_low": 0.0, "ci_high": 60.0, "diff_mean": 0.0,
             "diff_low": -30.0, "diff_high": 15.0} for i, c in enumerate(configs) for m in ("main", "average")]
    fig = study_canvas(rows, configs, "config-0", {"main": "Shapes", "average": "Average"})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    box = legend.get_window_extent(renderer)
    assert [t.get_text() for t in legend.get_texts()] == ["Shapes", "Average"]
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_the_temperature_figure_draws_each_configurations_mean_and_seed_range_in_its_geometrys_panel():
    from euclip_cli.figures import temperature_canvas

    curves = {"a": {0: [(8, 1.0), (16, 2.0), (24, 4.0)], 1: [(8, 3.0), (16, 4.0), (24, 8.0)]},
              "b": {0: [(8, 10.0), (16, 10.0)], 1: [(8, 20.0), (16, 30.0), (24, 40.0)]},  # seed 0 stopped early
              "c": {0: [(8, 5.0), (16, 6.0)]}}
    fig = temperature_canvas({"curves": curves, "panels": {"clip (cos)": ["a", "b"], "euclidean (d)": ["c"]}})
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["clip (cos)", "euclidean (d)"]
    (a, b), (c,) = (ax.get_lines() for ax in shown)
    assert list(a.get_xdata()) == [8, 16, 24] and list(a.get_ydata()) == [2.0, 3.0, 6.0]
    assert list(b.get_xdata()) == [8, 16] and list(b.get_ydata()) == [15.0, 20.0]  # only the steps every seed logged
    assert list(c.get_ydata()) == [5.0, 6.0] and a.get_label() == "a (2 seeds)"
    band = shown[0].collections[0].get_paths()[0].vertices  # a's shaded range: from the lowest seed to the highest
    assert {tuple(v) for v in band} >= {(8.0, 1.0), (24.0, 4.0), (8.0, 3.0), (24.0, 8.0)}


def test_the_temperature_converges_where_it_stays_within_two_percent_of_its_final_value():
    steps = [8, 16, 24, 32, 40, 48]

    def converged(values, **kw):
        return R.converged_step(zip(steps, values), values[-1], **kw)

    assert converged([1.0, 2.0, 3.0, 3.9, 4.05, 4.0]) == 40  # 3.9 is 2.5% off
    assert converged([1.0, 2.0, 3.0, 3.95, 4.05, 4.0]) == 32
    assert converged([1.0, 2.0, 3.0, 3.9, 4.05, 4.0], within=0.01) == 48  # 4.05 is 1.25% off
    assert converged([4.0] * 6) == 8  # never moved (a frozen temperature)
    assert converged([4.0, 4.0, 1.0, 4.0, 4.0, 4.0]) == 32  # a later excursion counts


def test_a_configuration_naming_an_unknown_published_row_is_refused(tmp_path):
    path = tmp_path / "study-bad.toml"
    path.write_text('[configs.a]\nrecipe = "tiny-clip"\npaper = "sphere-init3"\n[configs.b]\nrecipe = "tiny-clip"\n')
    with pytest.raises(Exception, match="sphere-init3"):
        load_study(str(path))


def test_a_study_varied_from_the_command_line_keeps_the_configurations_asked_for(tmp_path):
    study = load_study("study-geometries", overrides=["optim.samples=131072"], only=["clip", "euclip"])
    assert list(study.configs) == ["clip", "euclip"]
    assert study.primary == ("euclip-beats-clip",)  # the primary claims these configurations still test
    assert study.overrides("euclip", 1)[-3:] == ["optim.samples=131072", "train.seed=1", "eval.tasks=world"]
    assert V.regime(study, {})["steps"] == 1024
    result = runner.invoke(app, ["study", "--recipe", "study-geometries", "--configs", "clip,nope",
                                 "optim.samples=1", "optim.samples=2", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--configs: nope not in study-geometries.toml" in result.output
    assert "override 'optim.samples' is given more than once" in result.output


def test_a_published_command_names_the_same_study_again():
    given = StudyOptions("study-geometries", 3, ("optim.samples=65536", "data.train_dir=a dir/train"), "clip,euclip")
    text = given.command()
    assert text == ("euclip study --recipe study-geometries --seeds 3 --configs clip,euclip optim.samples=65536 "
                    "'data.train_dir=a dir/train'")
    assert StudyOptions.from_command(text) == given
    # The commands of the studies published before the quoting: plain words, read the same way.
    old = StudyOptions.from_command("euclip study --recipe study-geometries --configs clip,euclip,euclip-ln,"
                                    "euclidean-d2-l0 optim.samples=131072")
    assert (old.seeds, old.configs, old.overrides) == (None, "clip,euclip,euclip-ln,euclidean-d2-l0",
                                                       ("optim.samples=131072",))
    for bad in ("euclip train --recipe x", "euclip study --recipe x --seeds three", "euclip study --recipe x --jobs 2"):
        with pytest.raises(UsageError, match="not"):
            StudyOptions.from_command(bad)


def test_a_study_started_again_from_elsewhere_finds_the_steps_its_runs_finished(tmp_path, monkeypatch):
    """The marker records what each step did to its run, not the interpreter or the spelling of --out: run
    again by another Python, or with the folder given relative, absolute or moved, no finished step reruns
    (they would rewrite its analyses); a changed configuration still reruns everything."""
    study, claims = load_study("study-geometries", only=["clip", "euclip"]), load_claims()
    monkeypatch.setattr("sys.executable", "/opt/another/python3.12")
    first = J.plan(study, tmp_path / "studies" / "g", claims)
    for p in first:
        p.run_dir.mkdir(parents=True)
        (p.run_dir / J.DONE).write_text(json.dumps([list(c) for c in p.commands]))  # as euclip before keys wrote it
    monkeypatch.setattr("sys.executable", "/work/.venv/bin/python3.11")
    monkeypatch.chdir(tmp_path)
    again = J.plan(study, Path("studies/g"), claims)
    assert [str(p.run_dir) for p in again][0] == "studies/g/runs/clip-seed0"
    assert all(J.is_done(p) for p in again)
    assert J.step_key(again[0].commands[1], again[0].run_dir) == ["eval", "<run>", "--tasks", "world"]
    (tmp_path / "studies").rename(tmp_path / "moved")
    assert all(J.is_done(p) for p in J.plan(study, tmp_path / "moved" / "g", claims))
    changed = J.plan(load_study("study-geometries", overrides=["optim.samples=65536"], only=["clip", "euclip"]),
                     tmp_path / "moved" / "g", claims)
    assert not any(J.is_done(p) for p in changed) and all(J.done_commands(p) == [] for p in changed)


def test_a_bootstrap_study_of_three_seeds_is_refused(tmp_path):
    path = tmp_path / "study-boot.toml"
    path.write_text('[study]\nseeds = 3\ninterval = "bootstrap"\n[configs.a]\nrecipe = "tiny-clip"\n'
                    '[configs.b]\nrecipe = "tiny-clip"\n')
    result = runner.invoke(app, ["study", "--recipe", str(path)])
    assert result.exit_code == 2 and "needs at least 8 seeds, not 3" in " ".join(result.output.split())
    assert load_study(str(path), seeds=8).interval == "bootstrap"


def test_an_effect_too_small_to_resolve_says_so_rather_than_nothing():
    study = load_study("study-geometries")
    shapes = {"euclip": {0: 30.0, 1: 40.0, 2: 25.0}, "meru": {0: 20.0, 1: 26.0, 2: 21.0}}
    by_config = {c: {seed: {"main": v} for seed, v in values.items()} for c, values in shapes.items()}
    (row,) = [r for r in V.evaluate_claims(study, load_claims(), by_config, reading("small")) if r["n_seeds"]]
    assert row["paper_effect"] == pytest.approx(3.476 - 3.214) and row["seeds_for_80pct_power"] == math.inf
    assert stats.claim_cells(row)[-1] == "more than 1,000"


def test_a_temperature_that_barely_moved_is_reported_frozen_not_converged():
    study = load_study("study-geometries")
    by_config = {"clip": {0: {"temperature_init": 14.29, "temperature_final": 14.35}},
                 "meru": {0: {"temperature_init": 14.29, "temperature_final": 20.0}}}
    rows = [{"config": c, "metric": m, "n_seeds": 1, "mean": v, "sd": None}
            for c, m, v in (("clip", "temperature_final", 14.35), ("clip", "temperature_converged_step", 1.0),
                            ("meru", "temperature_final", 20.0), ("meru", "temperature_converged_step", 200.0))]
    text = T.to_markdown(study, {"rows": rows, "claims": [], "noise": [], "seeds": [0],
                                 "regime": V.regime(study, by_config)})
    table = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "| frozen |" in table["clip"] and "| 200 |" in table["meru"]


def test_a_thinned_curve_is_evenly_spaced_bounded_and_keeps_the_last_record():
    from euclip_cli.rundir import thinned

    for n in (1, 5, 1000, 4097):
        kept = thinned(({"step": i} for i in range(n)), 100)
        steps = [r["step"] for r in kept]
        assert steps[0] == 0 and steps[-1] == n - 1 and len(kept) <= 101 + 1
        gaps = {b - a for a, b in zip(steps[:-2], steps[1:-1])}
        assert len(gaps) <= 1  # one stride between the kept records, whatever the length
        assert n <= 100 or len(kept) > 50  # and not thinned more than needed


def test_reading_a_runs_curve_takes_memory_that_does_not_grow_with_its_length(tmp_path):
    """A metrics.jsonl ten times longer costs the curve reader no more memory (tracemalloc's peak),
    where reading every record would cost ten times as much."""
    import tracemalloc

    from euclip_cli.rundir import RunDir

    def peak(lines: int, read) -> int:
        run = RunDir(tmp_path / f"run{lines}")
        run.path.mkdir()
        run.metrics_file.write_text("".join(f'{{"step": {i}, "loss": 1.5, "logit_scale": 10.0}}\n'
                                            for i in range(1, lines + 1)))
        tracemalloc.start()
        read(run)
        found = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return found

    def curve(run):
        return run.training_records(500), run.last_training_record()

    assert peak(200_000, curve) < 1.5 * peak(20_000, curve)
    assert peak(200_001, lambda run: run.training_records()) > 5 * peak(20_001, lambda run: run.training_records())


def test_a_world_study_places_every_runs_mistakes_in_the_class_tree(tmp_path):
    """Each run of a world study gets ``analyze hierarchy``; its Shapes numbers become study measures, and
    study.md tables them beside uniform guessing."""
    from euclip_cli.rundir import RunDir
    from euclip_cli.study.tables import hierarchy_section

    study = load_study("study-geometries")
    plans = J.plan(study, tmp_path, load_claims())
    assert all(any(c[3:5] == ("analyze", "hierarchy") for c in p.commands) for p in plans)
    run = RunDir(plans[0].run_dir)
    run.analysis_dir.mkdir(parents=True)
    run.hierarchy_file.write_text(json.dumps({"tasks": {"world/shapes": {"tie": 2.5, "jaccard": 0.45,
                                                                         "h_precision": 0.55, "mistake_tie": 3.1,
                                                                         "random_mistake_tie": 3.45}},
                                              "entailment": {"text-image": {"similarity": {"roc_auc": 0.6}}},
                                              "order": {"root_order": {"roc_auc": 0.7}}}))
    values = R.run_values(plans[0], [])
    assert (values["shapes_tie"], values["shapes_jaccard"], values["shapes_h_precision"]) == (2.5, 0.45, 0.55)
    assert (values["shapes_mistake_tie"], values["shapes_random_mistake_tie"]) == (3.1, 3.45)
    assert values["family_similarity_auc"] == 0.6 and "family_cone_auc" not in values
    assert values["caption_root_order_auc"] == 0.7 and "caption_cone_order_auc" not in values
    rows = {(plans[0].config, "shapes_tie"): {"mean": 2.5, "sd": 0.1},
            (plans[0].config, "shapes_mistake_tie"): {"mean": 3.1, "sd": 0.2},
            (plans[0].config, "shapes_random_mistake_tie"): {"mean": 3.45, "sd": 0.01}}
    section = "\n".join(hierarchy_section(study, rows))
    assert f"| {plans[0].config} | – | 2.50 ± 0.10 | 3.10 ± 0.20 (3.45) | – | – | – | – | – | – |" in section
    # (72 + 384) / 144 edges over 12 x 12 guesses; HyCoCLIP's ancestor sets: a guess in the family (4 of 12)
    # scores Jaccard and precision 1, one outside 1/3 and 1/2.
    assert "Uniform guessing scores 3.17, 0.56 and 0.67" in section
    assert hierarchy_section(study, {}) == []


def test_the_last_record_read_from_a_files_end_is_the_last_a_full_read_finds(tmp_path):
    """Against reading every line: files cut short mid-line, blank lines, any block size."""
    import random

    from euclip_cli.rundir import last_jsonl, read_jsonl

    rng = random.Random(0)
    path = tmp_path / "metrics.jsonl"
    assert last_jsonl(path) is None
    for _ in range(100):
        text = "".join(json.dumps({"step": i, "pad": "x" * rng.randint(0, 50)}) + "\n" for i in range(rng.randint(0, 30)))
        text += rng.choice(["", '{"step": 99, "cut', "\n\n"])
        path.write_text(text)
        expected = (read_jsonl(path) or [None])[-1]
        assert all(last_jsonl(path, block) == expected for block in (1, 7, 64, 1 << 16))


def test_every_claims_metric_is_one_a_runs_values_can_hold():
    """A claim on a metric no run reports would stay undetermined for ever, silently."""
    from euclip_cli.protocol.tasks import TASKS
    from euclip_cli.study.summaries import RUN_MEASURES
    from euclip_cli.study.tables import GROUP_METRICS

    for claim in load_claims():
        metric = claim.metric if claim.kind == "compare" else claim.measure
        assert metric in (*GROUP_METRICS, *TASKS, *RUN_MEASURES, "curvature_fall"), (claim.id, metric)


def test_a_hierarchy_claim_is_the_paired_difference_of_the_runs_tree_errors():
    """Lower is better for the tree-induced error: the claim's ``higher`` is the control (no entailment)."""
    claim = next(c for c in load_claims() if c.id == "entailment-nearer-mistakes-euclidean")
    by_config = {"euclidean-d2-l0": {0: {"shapes_mistake_tie": 2.5}, 1: {"shapes_mistake_tie": 2.0},
                                     2: {"shapes_mistake_tie": 2.2}},
                 "euclip": {0: {"shapes_mistake_tie": 2.1}, 1: {"shapes_mistake_tie": 1.9}, 2: {"shapes_mistake_tie": 1.7}}}
    per_seed, _ = V.claim_values(claim, by_config)
    assert per_seed == pytest.approx({0: 0.4, 1: 0.1, 2: 0.5})
    study = load_study("study-geometries")
    row = next(r for r in V.evaluate_claims(study, [claim], by_config, reading("small")) if r["claim"] == claim.id)
    assert row["effect"] == pytest.approx(1 / 3) and row["paper_effect"] is None and row["family_size"] == 1
    assert row["verdict"] == stats.verdict(stats.estimate([0.4, 0.1, 0.5], "t")) == "undetermined"
    # euclip's own measure: with no published counterpart it holds, beside no published value.
    clear = {"euclidean-d2-l0": {s: {"shapes_mistake_tie": 2.5 + 0.1 * s} for s in range(3)},
             "euclip": {s: {"shapes_mistake_tie": 1.5 + 0.05 * s} for s in range(3)}}
    row = next(r for r in V.evaluate_claims(study, [claim], clear, reading("small")) if r["claim"] == claim.id)
    assert row["verdict"] == "holds" and row["paper"] == "no published value"
    assert stats.claim_cells(row)[5] == "none: euclip's own measure"


def test_the_hierarchy_figure_draws_every_configuration_beside_guessing_and_chance():
    from euclip_cli.figures import hierarchy_canvas

    configs = ["clip", "meru", "euclip"]
    rows = [{"config": c, "metric": m, "mean": v + i / 10, "ci_low": v, "ci_high": v + 0.3}
            for i, c in enumerate(configs) for m, v in (("shapes_tie", 2.0), ("family_cone_auc", 0.6))
            if not (c == "clip" and m == "family_cone_auc")]  # CLIP has no cone
    fig = hierarchy_canvas(rows, configs, 3.17)
    tree, auc = fig.axes
    (tie,) = [c for c in tree.containers]
    assert list(tie.lines[0].get_xdata()) == pytest.approx([2.0, 2.1, 2.2])
    (cone,) = [c for c in auc.containers]
    assert list(cone.lines[0].get_xdata()) == pytest.approx([0.7, 0.8]) and len(cone.lines[0].get_ydata()) == 2
    assert [l.get_xdata()[0] for l in tree.lines if l.get_linestyle() == "--"] == [3.17]
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["ROC AUC, cone", "chance",
                                                                         "tree-induced error", "uniform guessing"]


def test_the_beta0_study_gives_every_configuration_of_the_geometry_study_the_same_starts():
    """Equal effort: each of study-geometries' configurations, unchanged but for the temperature's start, at
    the same four starts (the paper's e^-1 and 1 among them), whatever its geometry."""
    from euclip_cli import config as C

    geometries, search = load_study("study-geometries"), load_study("study-beta0")
    starts = {}
    for name, spec in search.configs.items():
        base, _, label = name.rpartition("-init")
        cfg = C.load_config(spec.recipe, search.overrides(name, 0))
        same = C.load_config(geometries.configs[base].recipe, geometries.overrides(base, 0))
        same.geometry.logit_scale_init = cfg.geometry.logit_scale_init
        assert C.to_dict(cfg) == C.to_dict(same), name
        starts.setdefault(base, set()).add(round(math.exp(cfg.geometry.logit_scale_init), 2))
    assert set(starts) == set(geometries.configs)
    assert all(s == {0.37, 1.0, 10.0, 14.29} for s in starts.values()), starts


def test_the_scalar_study_gives_the_scalars_the_papers_small_scale_travel():
    from euclip_cli import config as C
    from euclip_cli.optim import summed_lr

    study = load_study("study-scalars")
    small = C.load_config("small-euclip")
    paper = summed_lr(small.optim.lr, small.optim.warmup_steps, C.total_steps(small))
    for name in ("clip-scalars", "euclip-scalars", "euclip-paper-beta0-scalars"):
        cfg = C.load_config(study.configs[name].recipe, study.overrides(name, 0))
        ours = summed_lr(cfg.optim.lr, cfg.optim.warmup_steps, C.total_steps(cfg))
        assert C.total_steps(cfg) == 2048 and cfg.optim.scalar_lr_scale * ours == pytest.approx(paper, rel=0.01)
    default = C.load_config(study.configs["euclip"].recipe, study.overrides("euclip", 0))
    assert default.optim.scalar_lr_scale == 1.0
    assert C.load_config(study.configs["euclip-paper-beta0"].recipe,
                         study.overrides("euclip-paper-beta0", 0)).geometry.logit_scale_init == -1.0


@pytest.mark.parametrize("omp, expected", [("3", 3), (None, "share"), ("0", "share"), ("4,2", "share")])
def test_a_studys_runs_get_the_threads_omp_names_else_the_cores_this_process_may_use_shared_out(
        tmp_path, monkeypatch, omp, expected):
    """Each run's command starts with OMP_NUM_THREADS and MKL_NUM_THREADS set: the user's OMP_NUM_THREADS where it is
    a positive whole number, else the cores of this process's affinity shared among the jobs. Under two workers of
    one thread each, a run given two threads spun for cores the other worker held (a test's 4 s became 41 s)."""
    import os
    import sys

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    probe = (sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'], os.environ['MKL_NUM_THREADS'])")
    plan = J.RunPlan("probe", 0, tmp_path / "run", (probe,))
    (tmp_path / "run").mkdir()
    assert J.execute(plan, J.threads_each(2), tmp_path) is None
    want = 5 // 2 if expected == "share" else expected
    assert J.run_log(tmp_path, plan).read_text().splitlines()[-1] == f"{want} {want}"


def test_the_usable_cores_are_this_process_affinity_not_the_machines_cores():
    import subprocess
    import sys

    if len(__import__("os").sched_getaffinity(0)) < 2:
        pytest.skip("one core: an affinity of one core is what this process has")
    code = ("import os; from euclip_cli.workers import usable_cores; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "print(usable_cores(), os.cpu_count())")
    cores, machine = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                             check=True).stdout.split())
    assert cores == 1 and machine >= 2
