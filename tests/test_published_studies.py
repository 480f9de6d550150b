"""The published studies (docs/results/NAME) say what their runs measured: each table is recomputed here
from the study's per-seed values (seeds.csv) and compared with what is committed, and their runs trace to
commits. Means, standard deviations and Student's t intervals are recomputed by hand (scipy's t quantile);
the paired differences from the seeds both configurations share."""

import csv
import json
import math
import re
import statistics
from pathlib import Path

import pytest
from scipy import stats as sps

from euclip_cli.study import verdicts as V
from euclip_cli.study.spec import StudyOptions, load_claims, load_study

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
# The studies published with their per-seed values.
WITH_SEEDS = sorted(p.parent for p in RESULTS.glob("*/seeds.csv"))


def read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def number(text: str):
    return None if text == "" else float(text)


def per_seed(folder: Path) -> dict[str, dict[int, dict[str, float]]]:
    by_config: dict[str, dict[int, dict[str, float]]] = {}
    for r in read(folder / "seeds.csv"):
        by_config.setdefault(r["config"], {}).setdefault(int(r["seed"]), {})[r["metric"]] = float(r["value"])
    return by_config


def study_of(folder: Path):
    """The study as its published command names it: the recipe, the seeds, the configurations kept and the
    overrides every configuration ran with."""
    given = StudyOptions.from_command(json.loads((folder / "provenance.json").read_text())["command"])
    return load_study(given.recipe, given.seeds, given.overrides, given.configs.split(",") if given.configs else None)


def t_interval(values: list[float]) -> tuple[float, float, float, float]:
    n, mean = len(values), statistics.fmean(values)
    sd = statistics.stdev(values)
    half = sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


@pytest.mark.parametrize("folder", WITH_SEEDS, ids=lambda p: p.name)
def test_a_published_studys_runs_trace_to_commits(folder):
    made = json.loads((folder / "provenance.json").read_text())
    assert made["runs_from_uncommitted_changes"] == 0
    assert made["euclip_commits"] and not any(c.endswith("+changes") for c in made["euclip_commits"])
    seeds = {(r["config"], r["seed"]) for r in read(folder / "seeds.csv")}
    assert len(seeds) == made["runs"]


@pytest.mark.parametrize("folder", WITH_SEEDS, ids=lambda p: p.name)
def test_a_published_studys_table_is_its_seeds_mean_spread_and_interval(folder):
    by_config, study = per_seed(folder), study_of(folder)
    assert study.interval == "t"  # the intervals recomputed here are Student's
    base = by_config[study.baseline]
    checked = 0
    for row in read(folder / "study.csv"):
        values = {s: v[row["metric"]] for s, v in by_config[row["config"]].items() if row["metric"] in v}
        assert int(row["n_seeds"]) == len(values)
        if len(values) < 2:
            continue
        mean, sd, low, high = t_interval(list(values.values()))
        assert [float(row[k]) for k in ("mean", "sd", "ci_low", "ci_high")] == pytest.approx([mean, sd, low, high])
        if number(row["diff_mean"]) is not None:
            shared = sorted(set(values) & {s for s, v in base.items() if row["metric"] in v})
            diffs = [values[s] - base[s][row["metric"]] for s in shared]
            d_mean, d_sd, d_low, d_high = t_interval(diffs)
            assert [float(row[k]) for k in ("diff_mean", "diff_sd", "diff_low", "diff_high")] == pytest.approx(
                [d_mean, d_sd, d_low, d_high])
        checked += 1
    assert checked >= len(study.configs)


@pytest.mark.parametrize("folder", WITH_SEEDS, ids=lambda p: p.name)
def test_a_published_studys_verdicts_are_what_its_seeds_give(folder):
    """The claims table as the study's code reads the committed per-seed values, with the configurations the
    committed table says did not learn: a table edited by hand, or left from other runs, differs."""
    by_config, study = per_seed(folder), study_of(folder)
    reading = json.loads((folder / "regime.json").read_text())
    idle = frozenset(r["config"] for r in read(folder / "study.csv") if r["metric"] == "main" and r["learned"] == "False")
    expected = {c["claim"]: c for c in V.evaluate_claims(study, load_claims(), by_config, reading, idle)}
    committed = read(folder / "claims.csv")
    assert [c["claim"] for c in committed] == list(expected)
    for row in committed:
        want = expected[row["claim"]]
        assert (row["verdict"], row["paper"], row["not_learned"]) == (want["verdict"], want["paper"],
                                                                       want["not_learned"]), row["claim"]
        for key in ("effect", "ci_low", "ci_high", "fw_low", "fw_high"):
            assert number(row[key]) == pytest.approx(want[key], nan_ok=True), (row["claim"], key)
        if row["not_learned"]:
            assert row["verdict"] == "not testable"


@pytest.mark.parametrize("folder", WITH_SEEDS, ids=lambda p: p.name)
def test_a_published_studys_learned_marks_are_its_seeds_excess_over_chance(folder):
    """Whether each configuration learned, recomputed by hand: Shapes is the world's main group, one of 12
    shapes, so chance is 100/12; the seeds' t interval of the excess over it with the shared evaluation
    images' binomial variance added; each run's exact interval from scipy's binomial test."""
    by_config = per_seed(folder)
    images = max(int(r["images"]) for r in read(folder / "eval_size.csv") if r["metric"] == "world/shapes")
    chance = 100 / 12
    mains = {r["config"]: r for r in read(folder / "study.csv") if r["metric"] == "main"}
    assert mains
    for config, row in mains.items():
        scores = [v["main"] for v in by_config[config].values()]
        n, mean = len(scores), statistics.fmean(scores)
        runs = sum(sps.binomtest(round(s * images / 100), images).proportion_ci(0.95, "exact").low * 100 > chance
                   for s in scores)
        assert int(row["runs_above_chance"]) == runs, config
        if n < 2:
            assert row["above_chance_low"] == "" and row["learned"] == str(runs == n)
            continue
        se = math.sqrt(statistics.variance(scores) / n + mean * (100 - mean) / images)
        low = mean - chance - sps.t.ppf(0.975, n - 1) * se
        assert float(row["above_chance_low"]) == pytest.approx(low), config
        assert row["learned"] == str(low > 0 or runs == n), config


def test_every_published_study_has_its_per_seed_values():
    """Every folder under docs/results with a study's tables has the seeds.csv the tests above recompute them
    from (issue #60): a study published without it could not be audited."""
    published = {p.parent.name for p in RESULTS.glob("*/study.csv")}
    assert published and {p.name for p in WITH_SEEDS} == published


def test_the_front_pages_study_is_published_with_its_seeds():
    readme = (RESULTS.parents[1] / "README.md").read_text()
    shown = set(re.findall(r"<!-- (?:summary|results) docs/results/(\S+) -->", readme))
    assert shown and shown <= {p.name for p in WITH_SEEDS}


def test_republishing_rewrites_a_published_studys_tables_from_its_seeds_alone(tmp_path):
    """`euclip study --republish` recomputes what the committed per-seed values give: tables edited by hand
    come back as committed, the measured files stay, and the provenance names the commit it recomputed at."""
    import shutil

    from typer.testing import CliRunner

    from euclip_cli.cli.main import app
    from euclip_cli.study.runner import RECOMPUTED

    folder = tmp_path / "hycoclip"
    shutil.copytree(RESULTS / "hycoclip", folder)
    for name in RECOMPUTED:
        (folder / name).write_text("edited by hand\n")
    kept = {name: (folder / name).read_text() for name in ("seeds.csv", "noise.csv", "eval_size.csv")}
    result = CliRunner().invoke(app, ["study", "--republish", str(folder)])
    assert result.exit_code == 0, result.output
    for name in RECOMPUTED:
        assert (folder / name).read_text() == (RESULTS / "hycoclip" / name).read_text(), name
    assert {name: (folder / name).read_text() for name in kept} == kept
    made = json.loads((folder / "provenance.json").read_text())
    assert re.fullmatch(r"([0-9a-f]{7}|unknown)(\+changes)?", made["tables_recomputed_at"])
    assert made["command"] == json.loads((RESULTS / "hycoclip" / "provenance.json").read_text())["command"]


def test_republishing_refuses_what_is_not_a_published_study(tmp_path):
    from typer.testing import CliRunner

    from euclip_cli.cli.main import app

    result = CliRunner().invoke(app, ["study", "--republish", str(tmp_path)])
    assert result.exit_code == 2 and "seeds.csv is missing" in result.output, result.output
    result = CliRunner().invoke(app, ["study", "--republish", str(RESULTS / "hycoclip"), "--recipe", "study-hycoclip"])
    assert result.exit_code == 2 and "give it alone" in result.output, result.output


# A verdict or reading a page's prose cites, in quotes or italics.
CITED = re.compile(r"""["*](holds|non-inferior|opposite|undetermined|excludes the paper's effect|no spread|not testable"""
                   r"""|same sign|other sign|sign undetermined|reproduced|inconclusive)(?=[":*])""")
PAGES = sorted(RESULTS.glob("*.md")) + [RESULTS.parents[1] / "README.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_pages_prose_cites_only_verdicts_its_studies_hold(page):
    """A word a page's prose quotes as a claim's verdict ("opposite", *undetermined*) must be one that a claim
    of a study the page renders holds today (its claims.csv), so that prose left from an older reading
    fails when the tables are recomputed."""
    from euclip_cli.report.readme import BLOCK, block_folders

    text = page.read_text()
    held = set()
    for match in BLOCK.finditer(text):
        for name in block_folders(match):
            claims = page.parent / name / "claims.csv"
            if claims.exists() and claims.stat().st_size:
                held |= {word for row in read(claims) for word in (row["verdict"], row.get("paper", ""))}
    prose = BLOCK.sub("", text)
    cited = set(CITED.findall(prose))
    assert cited <= held, f"{page.name} cites {sorted(cited - held)}, which no claim of its studies holds"


def test_a_cited_verdict_that_no_claim_holds_is_caught():
    assert CITED.findall('its verdict, "opposite" at −21.3, and *undetermined*: and "holds 0"') == ["opposite",
                                                                                                   "undetermined"]
