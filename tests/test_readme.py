"""The README's results are the committed study tables, rendered: a test holds them equal."""

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.errors import UsageError
from euclip_cli.report.readme import BLOCK, block_folders, update_readme

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


# Pages whose results blocks are rendered from committed study tables: the README and every results page
# with a block (a page added under docs/results is held to its tables without being listed here).
PAGES = [README, *sorted(p for p in (ROOT / "docs" / "results").glob("*.md") if BLOCK.search(p.read_text()))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_quotes_its_committed_results_exactly(page, tmp_path):
    blocks = list(BLOCK.finditer(page.read_text()))
    assert blocks, f"{page} has no results block"
    copy = tmp_path / page.name
    copy.write_text(page.read_text())
    folders = {name for block in blocks for name in block_folders(block)}
    for name in folders:  # the folders, beside the copy as beside the page
        assert (page.parent / name / "provenance.json").exists(), name
        shutil.copytree(page.parent / name, tmp_path / name)
    update_readme(copy, check=True)  # raises where a number differs from its file


def test_a_readme_edited_by_hand_or_a_changed_table_fails_the_check(tmp_path):
    (block,) = [b for b in BLOCK.finditer(README.read_text())][:1]
    folder = tmp_path / block["folder"]
    shutil.copytree(ROOT / block["folder"], folder)
    page = tmp_path / "README.md"
    page.write_text(f"# x\n\n<!-- results {block['folder']} -->\nold numbers\n<!-- /results -->\n\nthe rest\n")
    with pytest.raises(UsageError, match="differ from its files"):
        update_readme(page, check=True)
    result = CliRunner().invoke(app, ["report", "--readme", str(page)])
    assert result.exit_code == 0, result.output
    rendered = page.read_text()
    assert "old numbers" not in rendered and rendered.endswith("<!-- /results -->\n\nthe rest\n")
    update_readme(page, check=True)  # now equal
    claims = folder / "claims.csv"
    claims.write_text(claims.read_text().replace(",opposite,", ",holds,", 1).replace(",undetermined,", ",opposite,", 1))
    with pytest.raises(UsageError, match="differ from its files"):
        update_readme(page, check=True)


def test_a_study_with_primary_claims_shows_them_in_words_and_counts_the_rest(tmp_path):
    import pandas as pd

    (block,) = [b for b in BLOCK.finditer(README.read_text())][:1]
    folder = tmp_path / "study"
    shutil.copytree(ROOT / block["folder"], folder)
    claims = pd.read_csv(folder / "claims.csv")
    claims["family"] = ["primary" if c in ("euclip-beats-clip", "no-final-ln-helps-euclip") else "secondary"
                        for c in claims["claim"]]
    # Verdicts set here, so that the rendering is checked whatever the published study decided.
    claims["verdict"] = ["holds" if c in ("euclip-beats-meru", "euclip-text-nearer-root") else "undetermined"
                         for c in claims["claim"]]
    claims.to_csv(folder / "claims.csv", index=False)
    page = tmp_path / "README.md"
    page.write_text("<!-- summary study -->\n<!-- /summary -->\n<!-- results study -->\n<!-- /results -->\n")
    update_readme(page)
    text, full = page.read_text().split("<!-- results study -->")
    assert "- **EuCLIP matches or beats CLIP**: undetermined: the interval includes 0;" in text
    assert "- **Removing the final LayerNorm helps Euclidean d2 with entailment**: undetermined" in text
    assert f"{len(claims) - 2} secondary claims, adjusted among themselves, are in [study/study.md](study/study.md): " \
           "2 decided (euclip-beats-meru, euclip-text-nearer-root)." in text
    assert "| EuCLIP beats MERU" not in text and "β final" not in text  # the front page's short form
    # The full form (a results page): every column, the primary claims in words, then every claim's row.
    assert "β final" in full and "- **EuCLIP matches or beats CLIP**: undetermined" in full
    assert "| EuCLIP beats MERU (main)" in full


def test_a_readme_without_a_block_or_files_is_refused_in_one_line(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("# nothing here\n")
    result = CliRunner().invoke(app, ["report", "--readme", str(page)])
    assert result.exit_code == 2 and "has no '<!-- results FOLDER -->'" in result.output
    page.write_text("<!-- results nowhere -->\nx\n<!-- /results -->\n")
    result = CliRunner().invoke(app, ["report", "--readme", str(page)])
    assert result.exit_code == 2 and "publish the study first" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def _budget(folder: Path, steps: int, rows: dict, noise: dict) -> None:
    """A published study of ``steps`` steps with the given (config, metric) -> (mean, diff, low, high) rows."""
    folder.mkdir()
    lines = ["config,metric,n_seeds,mean,sd,diff_mean,diff_low,diff_high"]
    lines += [f"{c},{m},3,{mean},1.0,{'' if d is None else d},{'' if lo is None else lo},{'' if hi is None else hi}"
              for (c, m), (mean, d, lo, hi) in rows.items()]
    (folder / "study.csv").write_text("\n".join(lines) + "\n")
    (folder / "noise.csv").write_text("metric,paired_sd_median,paired_sampling_se_median,ceiling\n"
                                      + "".join(f"{m},{sd},{se},{70 if m == 'retrieval' else 100}\n"
                                                for m, (sd, se) in noise.items()))
    (folder / "regime.json").write_text(f'{{"steps": {steps}}}')
    (folder / "provenance.json").write_text("{}")


def test_a_trend_block_names_a_change_only_where_its_interval_excludes_0(tmp_path):
    """Each difference's change from the first budget to the last, with Welch's interval from the two
    studies' paired sds (scipy's, from the summaries): a gain, a loss, and a change too noisy to name."""
    from scipy.stats import ttest_ind_from_stats

    metrics = ("main", "shifts", "retrieval", "average")
    # (config, metric) -> (mean, diff mean, diff sd, diff n); the baseline has no difference.
    early = {("base", m): (50.0, None, None, None) for m in metrics}
    early.update({("a", m): (40.0, -10.0, 1.0, 3) for m in metrics})
    early.update({("b", m): (52.0, 2.0, 1.0, 3) for m in metrics})
    early.update({("c", m): (45.0, -5.0, 6.0, 3) for m in metrics})
    late = {("base", m): (90.0, None, None, None) for m in metrics}
    late.update({("a", m): (88.0, -2.0, 2.0, 6) for m in metrics})
    late.update({("b", m): (82.0, -8.0, 1.5, 6) for m in metrics})
    late.update({("c", m): (88.0, -2.0, 6.0, 6) for m in metrics})
    for name, steps, rows in (("short", 256, early), ("long", 2048, late)):
        folder = tmp_path / name
        folder.mkdir()
        lines = ["config,metric,n_seeds,mean,sd,diff_mean,diff_sd,diff_n,diff_low,diff_high"]
        lines += [f"{c},{m},{n or 6},{mean},1.0,{'' if d is None else d},{'' if sd is None else sd},"
                  f"{'' if n is None else n},," for (c, m), (mean, d, sd, n) in rows.items()]
        (folder / "study.csv").write_text("\n".join(lines) + "\n")
        (folder / "noise.csv").write_text("metric,paired_sd_median,paired_sampling_se_median,ceiling\n"
                                          + "".join(f"{m},1,1,{70 if m == 'retrieval' else 100}\n" for m in metrics))
        (folder / "regime.json").write_text(f'{{"steps": {steps}}}')
        (folder / "provenance.json").write_text("{}")
    page = tmp_path / "trend.md"
    page.write_text("<!-- trend long,short -->\n<!-- /trend -->\n")
    update_readme(page)
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in page.read_text().splitlines()
            if line.startswith("|")]
    assert rows[0] == ["config", "group", "Δ at 256 steps", "Δ at 2,048 steps", "change [95%, Welch]", "reading",
                       "base below its ceiling at 2,048 steps"]
    shapes = {row[0]: row for row in rows[2:] if row[1] == "Shapes"}
    for config, reading in (("a", "gains on base"), ("b", "loses ground to base"), ("c", "undetermined")):
        (_, d_late, sd_late, n_late), (_, d_early, sd_early, n_early) = late[(config, "main")], early[(config, "main")]
        test = ttest_ind_from_stats(d_late, sd_late, n_late, d_early, sd_early, n_early, equal_var=False)
        assert shapes[config][4].startswith(f"{d_late - d_early:+.1f} [")
        assert shapes[config][5] == reading
        assert (test.pvalue < 0.05) == (reading != "undetermined")
    assert shapes["a"][6] == "10.0"
    assert [row[6] for row in rows[2:] if row[0] == "a"][2] == "-20.0"  # retrieval: the baseline over its ceiling
    update_readme(page, check=True)


def test_a_budget_curve_block_sets_each_budget_against_the_baseline_by_hand(tmp_path):
    metrics = ("main", "shifts", "retrieval", "average")
    noise = {m: (1.5, 0.5) for m in metrics}
    # Budget 2: the baseline at 90 and 'a' at 80 on every group: a -10 difference, and twice the errors.
    _budget(tmp_path / "long", 512, {**{("base", m): (90.0, None, None, None) for m in metrics},
                                     **{("a", m): (80.0, -10.0, -12.0, -8.0) for m in metrics},
                                     **{("b", m): (85.0, -5.0, -6.0, -4.0) for m in metrics}}, noise)
    # Budget 1 (listed second, shown first): 'a' at 40 against 50, errors 60/50; 'c' only here.
    _budget(tmp_path / "short", 256, {**{("base", m): (50.0, None, None, None) for m in metrics},
                                      **{("a", m): (40.0, -10.0, -20.0, 0.5) for m in metrics},
                                      **{("c", m): (45.0, -5.0, -9.0, -1.0) for m in metrics}},
                    {m: (4.0, 2.25) for m in metrics})
    page = tmp_path / "curve.md"
    page.write_text("<!-- curve long,short -->\n<!-- /curve -->\n")
    update_readme(page)
    rows = [line.split("|")[1:-1] for line in page.read_text().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0]]
    assert header == ["steps", "seeds", "group", "ceiling", "base", "Δ a [95%]", "a's shortfall ÷ base's",
                      "paired Δ sd", "paired sampling error"]  # 'b' and 'c' are not at every budget
    body = [[cell.strip() for cell in row] for row in rows[2:]]
    assert [row[:3] for row in body[:4]] == [["256", "3", g] for g in ("Shapes", "Shape shifts", "Retrieval",
                                                                        "Average over 10 tasks")]
    # Shortfalls from the ceiling: (100 - 40) / (100 - 50) for Shapes; retrieval's ceiling is 70: 30 / 20.
    assert body[0][3:] == ["100.0", "50.0", "-10.0 [-20.0, 0.5]", "1.20", "4.00", "2.25"]
    assert body[2][3:] == ["70.0", "50.0", "-10.0 [-20.0, 0.5]", "1.50", "4.00", "2.25"]
    # At 512 steps the baseline reaches retrieval's ceiling: no ratio.
    assert body[4][:1] + body[4][3:] == ["512", "100.0", "90.0", "-10.0 [-12.0, -8.0]", "2.00", "1.50", "0.50"]
    assert body[6][3:6] + body[6][6:7] == ["70.0", "90.0", "-10.0 [-12.0, -8.0]", "–"]
    update_readme(page, check=True)
    (tmp_path / "long" / "study.csv").write_text((tmp_path / "long" / "study.csv").read_text().replace("80.0", "70.0"))
    with pytest.raises(UsageError, match="differ from its files"):
        update_readme(page, check=True)


def test_a_curve_over_budgets_with_different_baselines_is_refused(tmp_path):
    metrics = ("main", "shifts", "retrieval", "average")
    noise = {m: (1.0, 0.5) for m in metrics}
    _budget(tmp_path / "one", 256, {("x", m): (50.0, None, None, None) for m in metrics}, noise)
    _budget(tmp_path / "two", 512, {("y", m): (50.0, None, None, None) for m in metrics}, noise)
    page = tmp_path / "curve.md"
    page.write_text("<!-- curve one,two -->\n<!-- /curve -->\n")
    result = CliRunner().invoke(app, ["report", "--readme", str(page)])
    assert result.exit_code == 2 and "different baselines (x, y)" in result.output


def test_a_trend_or_a_fit_over_one_budget_is_refused_in_one_line(tmp_path):
    """Two folders of the same budget are one budget: there is no change to measure nor a curve to fit."""
    metrics = ("main", "shifts", "retrieval", "average")
    noise = {m: (1.0, 0.5) for m in metrics}
    for name in ("one", "again"):
        _budget(tmp_path / name, 256, {**{("base", m): (50.0, None, None, None) for m in metrics},
                                       **{("a", m): (40.0, -10.0, -12.0, -8.0) for m in metrics}}, noise)
        (tmp_path / name / "regime.json").write_text('{"steps": 256, "samples": 32768, "batch_size": 128}')
        (tmp_path / name / "seeds.csv").write_text("config,seed,metric,value,outcomes_sha256\n" + "".join(
            f"{c},{s},main,{v + s},\n" for c, v in (("base", 50.0), ("a", 40.0)) for s in range(3)))
    for kind, words in (("trend", "a trend needs the study at two budgets or more"),
                        ("fit", "a curve fit needs the study at two budgets or more")):
        page = tmp_path / f"{kind}.md"
        page.write_text(f"<!-- {kind} one,again -->\n<!-- /{kind} -->\n")
        result = CliRunner().invoke(app, ["report", "--readme", str(page)])
        assert result.exit_code == 2 and words in result.output, result.output
        assert page.read_text() == f"<!-- {kind} one,again -->\n<!-- /{kind} -->\n"  # nothing written


def test_a_contrast_block_pairs_two_configurations_seed_by_seed(tmp_path):
    """Known per-seed values: 'fast' is 'slow' plus 2, 3 and 7 points on the main task, seed by seed (mean 4,
    sd sqrt(7), Student's t with 2 degrees of freedom), and equal on retrieval; 'other' has seeds 0 and 5
    only, so it shares one seed with 'slow' and has no interval."""
    from scipy import stats as sps

    folder = tmp_path / "study"
    _budget(folder, 2048, {("base", "main"): (50.0, None, None, None)}, {"main": (1.0, 0.5)})
    slow = {0: 40.0, 1: 45.0, 2: 50.0}
    fast = {s: v + d for (s, v), d in zip(slow.items(), (2.0, 3.0, 7.0))}
    lines = ["config,seed,metric,value,outcomes_sha256"]
    for config, by_seed in (("slow", slow), ("fast", fast), ("other", {0: 60.0, 5: 61.0})):
        lines += [f"{config},{s},{m},{v if m == 'main' else 30.0},x" for s, v in by_seed.items()
                  for m in ("main", "retrieval")]
    (folder / "seeds.csv").write_text("\n".join(lines) + "\n")
    (folder / "regime.json").write_text('{"steps": 2048, "scalars": [{"config": "fast", "scalar": "β", "init": 10.0, '
                                        '"final": 31.25}, {"config": "slow", "scalar": "β", "init": 10.0, "final": 10.2}]}')
    page = tmp_path / "page.md"
    page.write_text("<!-- contrast study:fast/slow,other/slow -->\n<!-- /contrast -->\n")
    result = CliRunner().invoke(app, ["report", "--readme", str(page)])
    assert result.exit_code == 0, result.output
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in page.read_text().splitlines() if line.startswith("|")]
    header, body = rows[0], {r[0]: dict(zip(rows[0], r)) for r in rows[2:]}
    assert header[:4] == ["config", "against", "its scalars (initial → final)", "against's scalars"]
    half = sps.t.ppf(0.975, 2) * (7 ** 0.5) / 3 ** 0.5
    assert body["fast"]["Δ Shapes [95%]"] == f"+4.0 [{4 - half:.1f}, {4 + half:.1f}]"
    assert body["fast"]["Δ Retrieval [95%]"] == "+0.0 [0.0, 0.0]" and body["fast"]["seeds"] == "3"
    assert body["fast"]["its scalars (initial → final)"] == "β 10 → 31.2"
    assert body["fast"]["against's scalars"] == "β 10 → 10.2"
    assert body["other"]["Δ Shapes [95%]"] == "+20.0" and body["other"]["seeds"] == "1"
    update_readme(page, check=True)
    for spec, words in (("study:fast/nothere", "has no configuration 'nothere' (it has slow, fast, other)"),
                        ("study:fast", "names no pairs"), ("study", "names no pairs")):
        page.write_text(f"<!-- contrast {spec} -->\n<!-- /contrast -->\n")
        result = CliRunner().invoke(app, ["report", "--readme", str(page)])
        assert result.exit_code == 2 and words in " ".join(result.output.split()), result.output


def test_a_power_law_is_recovered_exactly_and_two_cross_where_their_shortfalls_meet():
    from euclip_cli import stats

    samples = [32_768, 65_536, 131_072, 262_144]
    fit = stats.fit_power_law(samples, [40.0 * s ** -0.7 for s in samples], [0.01, 0.02, 0.03, 0.5])
    assert (fit.law.scale, fit.law.exponent) == pytest.approx((40.0, 0.7)) and fit.chi2 == pytest.approx(0, abs=1e-18)
    assert fit.p_value == pytest.approx(1.0)
    a, b = stats.PowerLaw(100.0, 0.5), stats.PowerLaw(50.0, 0.3)
    # 100 s^-0.5 = 50 s^-0.3 where s^0.2 = 2: s = 32.
    assert stats.crossing(a, b) == pytest.approx(32.0) and a.at(32.0) == pytest.approx(b.at(32.0))
    assert stats.crossing(a, stats.PowerLaw(7.0, 0.5)) is None
    with pytest.raises(ValueError):
        stats.fit_power_law([1.0, 1.0], [2.0, 3.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        stats.fit_power_law([1.0, 2.0], [2.0, 0.0], [1.0, 1.0])
    assert stats.fit_power_law([1.0, 2.0], [2.0, 1.0], [1.0, 1.0]).p_value is None  # two points fit any line


def test_a_weighted_power_law_fit_is_numpys_weighted_line_with_its_chi_squared_tail():
    """Against numpy's weighted polyfit (weights 1/sigma, its unscaled covariance) and scipy's chi-squared."""
    import numpy as np
    from scipy.stats import chi2

    from euclip_cli import stats

    samples = np.array([32_768.0, 65_536.0, 131_072.0, 262_144.0, 524_288.0])
    short = np.array([50.0, 31.0, 22.0, 11.0, 8.5])
    variances = np.array([0.004, 0.01, 0.002, 0.02, 0.008])
    fit = stats.fit_power_law(list(samples), list(short), list(variances))
    (slope, intercept), cov = np.polyfit(np.log(samples), np.log(short), 1, w=1 / np.sqrt(variances), cov="unscaled")
    assert fit.law.exponent == pytest.approx(-slope) and fit.law.scale == pytest.approx(np.exp(intercept))
    assert fit.exponent_se == pytest.approx(np.sqrt(cov[0, 0]))
    residuals = np.log(short) - (intercept + slope * np.log(samples))
    assert fit.chi2 == pytest.approx(np.sum(residuals ** 2 / variances)) and fit.df == 3
    assert fit.p_value == pytest.approx(chi2.sf(fit.chi2, 3))


def _fitted_budget(folder: Path, steps: int, scores: dict) -> None:
    """A study at ``steps`` steps of 128 whose runs scored ``scores[config][seed]`` on the main group."""
    folder.mkdir()
    (folder / "seeds.csv").write_text("config,seed,metric,value,outcomes_sha256\n" + "".join(
        f"{c},{s},main,{v},\n" for c, by_seed in scores.items() for s, v in by_seed.items()))
    (folder / "study.csv").write_text("config,metric,n_seeds,mean,sd,diff_mean\nclip,main,3,0,0,\n"
                                      + "".join(f"{c},main,3,0,0,1.0\n" for c in scores if c != "clip"))
    (folder / "noise.csv").write_text("metric,ceiling\nmain,100\n")
    (folder / "regime.json").write_text(f'{{"steps": {steps}, "samples": {steps * 128}, "batch_size": 128}}')
    (folder / "provenance.json").write_text("{}")


def test_the_budget_fit_shows_only_curves_that_fit_and_crossings_it_measured(tmp_path):
    """Known truth, the same small seed noise at every budget: CLIP's shortfall 40 (s/s0)^-0.5 and EuCLIP's
    60 (s/s0)^-1.0 meet at s = 2.25 s0, within the budgets 1-8 s0; one parallel to CLIP never meets it; one
    steeper from further below meets it beyond 8 s0 (an extrapolation, not given); one whose shortfall goes
    up and down fits no power law, and nothing is read from it."""
    steps = [256, 512, 1024, 2048]
    folders = []
    jitter = {0: -0.2, 1: 0.0, 2: 0.2}
    bent = {256: 50.0, 512: 20.0, 1024: 40.0, 2048: 10.0}
    for k in steps:
        ratio = k / 256
        scores = {"clip": {s: 100 - 40 * ratio ** -0.5 + j for s, j in jitter.items()},
                  "euclip": {s: 100 - 60 * ratio ** -1.0 + j for s, j in jitter.items()},
                  "parallel": {s: 100 - 50 * ratio ** -0.5 + j for s, j in jitter.items()},
                  "late": {s: 100 - 90 * ratio ** -0.7 + j for s, j in jitter.items()},
                  "bent": {s: 100 - bent[k] + j for s, j in jitter.items()}}
        _fitted_budget(tmp_path / f"b{k}", k, scores)
        folders.append(f"b{k}")
    page = tmp_path / "budget.md"
    page.write_text(f"<!-- fit {','.join(folders)} -->\n<!-- /fit -->\n")
    update_readme(page)
    lines = [line for line in page.read_text().splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    rows = {cells[0]: dict(zip(header, cells)) for cells in ([c.strip() for c in line.split("|")[1:-1]]
                                                            for line in lines[1:])}
    clip, euclip, parallel, late, bent_row = (rows[c] for c in ("clip", "euclip", "parallel", "late", "bent"))
    assert clip["fit (χ², df, p)"].endswith(": fits") and clip["exponent [main] ± se"].startswith("0.500 ± ")
    assert clip["fitted shortfall at 256 / 2,048 steps"] == "40.0 / 14.1"  # 40 x 8^-0.5 at 2,048 steps
    assert euclip["exponent − clip's [95%, t]"].startswith("+0.500 [") and euclip["exponent − clip's [95%, t]"].endswith(
        "falls faster")
    assert euclip["fitted curves cross"] == "at 576 steps, within the budgets measured"  # 2.25 x 256
    # Parallel but for the seeds' jitter: the exponents cannot be told apart, and the fitted curves meet far
    # outside the budgets, which is not given.
    assert parallel["exponent − clip's [95%, t]"].endswith("undetermined")
    assert parallel["fitted curves cross"] == late["fitted curves cross"] == (
        "outside the budgets measured (an extrapolation: not given)")
    assert late["exponent − clip's [95%, t]"].endswith("falls faster")
    assert bent_row["fit (χ², df, p)"].endswith("does not fit") and bent_row["exponent [main] ± se"] == "not shown"
    assert (bent_row["exponent − clip's [95%, t]"], bent_row["fitted curves cross"]) == ("–: its curve does not fit", "–")
    (tmp_path / "b512" / "seeds.csv").unlink()
    result = CliRunner().invoke(app, ["report", "--readme", str(page)])
    assert result.exit_code == 2 and "b512/seeds.csv is missing" in " ".join(result.output.split())




def _measured_budget(folder: Path, steps: int, means: dict) -> None:
    """A study at ``steps`` steps of 128 whose study.csv gives each config's main ``(mean, low, high)``."""
    folder.mkdir()
    (folder / "study.csv").write_text("config,metric,n_seeds,mean,sd,ci_low,ci_high,diff_mean\n" + "".join(
        f"{c},main,3,{m},1,{lo},{hi},{'' if c == 'clip' else 1.0}\n" for c, (m, lo, hi) in means.items()))
    (folder / "noise.csv").write_text("metric,ceiling\nmain,100\n")
    (folder / "regime.json").write_text(f'{{"steps": {steps}, "samples": {steps * 128}, "batch_size": 128}}')
    (folder / "provenance.json").write_text("{}")


def test_a_score_is_worth_the_baselines_steps_read_off_its_measured_curve_and_nowhere_beyond(tmp_path):
    """CLIP at 20, 40, 60 and 80 over 256 to 2,048 steps: 50 lies halfway between 512 and 1,024 in log steps,
    724; a score below CLIP's first point or above its last is written so, never extrapolated."""
    clip = {256: 20.0, 512: 40.0, 1024: 60.0, 2048: 80.0}
    euclip = {256: (10.0, 5.0, 25.0), 512: (50.0, 40.0, 60.0), 1024: (70.0, 65.0, 75.0), 2048: (90.0, 85.0, 95.0)}
    for steps in clip:
        _measured_budget(tmp_path / f"b{steps}", steps, {"clip": (clip[steps], clip[steps] - 1, clip[steps] + 1),
                                                         "euclip": euclip[steps]})
    page = tmp_path / "budget.md"
    page.write_text("<!-- worth b256,b512,b1024,b2048 -->\n<!-- /worth -->\n")
    update_readme(page)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in page.read_text().splitlines()[3:-1]]
    # 25 is a quarter of the way from 20 to 40: 256 x 2^0.25; 70 [65, 75] from 60 to 80: 1,024 x 2^(1/2, 1/4, 3/4).
    assert [r[3] for r in rows] == ["< 256 [< 256, 304]", "724 [512, 1,024]", "1,448 [1,218, 1,722]",
                                    "> 2,048 [> 2,048, > 2,048]"]
    assert rows[1][:3] == ["euclip", "512", "50.0 [40.0, 60.0]"]
    _measured_budget(tmp_path / "flat", 4096, {"clip": (75.0, 74.0, 76.0), "euclip": (90.0, 89.0, 91.0)})
    page.write_text("<!-- worth b256,b512,b1024,b2048,flat -->\n<!-- /worth -->\n")
    result = CliRunner().invoke(app, ["report", "--readme", str(page)])
    assert result.exit_code == 2 and "does not rise with the budget" in result.output, result.output


def test_a_fit_or_worth_block_reads_the_group_it_names_and_refuses_one_no_curve_shows(tmp_path):
    """Each budget's Shapes (main) goes up and down, which no power law fits, while its Shape shifts follow CLIP's
    shortfall 40 (s/s0)^-0.5 exactly but for the seeds' jitter: a block naming "shifts" fits and reads those
    seeds and that ceiling, the same block without a group reads Shapes; a group no curve shows is refused."""
    jitter = {0: -0.2, 1: 0.0, 2: 0.2}
    bent = {256: 50.0, 512: 20.0, 1024: 40.0, 2048: 10.0}
    folders = []
    for k, main in bent.items():
        shifts = 100 - 40 * (k / 256) ** -0.5
        folder = tmp_path / f"b{k}"
        folder.mkdir()
        (folder / "seeds.csv").write_text("config,seed,metric,value,outcomes_sha256\n" + "".join(
            f"{c},{s},{m},{v + j},\n" for c in ("clip", "euclip") for s, j in jitter.items()
            for m, v in (("main", 100 - main), ("shifts", shifts + (c == "euclip")))))
        (folder / "study.csv").write_text(
            "config,metric,n_seeds,mean,sd,ci_low,ci_high,diff_mean\n"
            f"clip,main,3,{100 - main},0.2,{99 - main},{101 - main},\nclip,shifts,3,{shifts},0.2,{shifts - 1},{shifts + 1},\n"
            f"euclip,main,3,{100 - main},0.2,{99 - main},{101 - main},0\n"
            f"euclip,shifts,3,{shifts + 1},0.2,{shifts},{shifts + 2},1\n")
        (folder / "noise.csv").write_text("metric,ceiling\nmain,100\nshifts,100\n")
        (folder / "regime.json").write_text(f'{{"steps": {k}, "samples": {k * 128}, "batch_size": 128}}')
        (folder / "provenance.json").write_text("{}")
        folders.append(folder.name)
    page = tmp_path / "budget.md"

    def rendered(block: str) -> list[dict]:
        page.write_text(f"<!-- {block} -->\n<!-- /{block.split()[0]} -->\n")
        result = CliRunner().invoke(app, ["report", "--readme", str(page)])
        assert result.exit_code == 0, result.output
        lines = [line for line in page.read_text().splitlines() if line.startswith("| ")]
        header = [c.strip() for c in lines[0].split("|")[1:-1]]
        return [dict(zip(header, [c.strip() for c in line.split("|")[1:-1]])) for line in lines[1:]]

    shifts = {r["config"]: r for r in rendered(f"fit {','.join(folders)} shifts")}
    assert shifts["clip"]["fit (χ², df, p)"].endswith(": fits") and shifts["clip"]["exponent [shifts] ± se"].startswith(
        "0.500 ± ")
    assert shifts["clip"]["fitted shortfall at 256 / 2,048 steps"] == "40.0 / 14.1"
    main = {r["config"]: r for r in rendered(f"fit {','.join(folders)}")}
    assert main["clip"]["fit (χ², df, p)"].endswith("does not fit") and main["clip"]["exponent [main] ± se"] == "not shown"
    # CLIP's Shape shifts at 256 and 512 steps are 60 and 71.7: EuCLIP's 61 at 256 steps is worth 256 x 2^(1/11.7), 272.
    worth = rendered(f"worth {','.join(folders)} shifts")
    assert worth[0]["Shape shifts [95%]"] == "61.0 [60.0, 62.0]" and worth[0]["worth clip's steps [95%]"].startswith("272 [")
    for block, words in ((f"fit {','.join(folders)} colour", "name one of main, shifts, retrieval, average"),
                         (f"curve {','.join(folders)} shifts", "only fit and worth blocks take")):
        page.write_text(f"<!-- {block} -->\n<!-- /{block.split()[0]} -->\n")
        result = CliRunner().invoke(app, ["report", "--readme", str(page)])
        assert result.exit_code == 2 and words in " ".join(result.output.split()), result.output
