"""The HTML report as a person opens it: in a real headless Chromium, in laptop-sized windows.

The study is the shipped ``study-geometries`` (ten configurations, three seeds) with invented
per-run results in place of training, so the page has a study's real shape and width; no run of
ours exists, so every published row belongs in the compact published-numbers table.
"""

import random

import pytest
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.protocol.tasks import SUITE_COLUMNS
from euclip_cli.figures import study_figure
from euclip_cli.study import jobs as J
from euclip_cli.study import summaries as R
from euclip_cli.study import tables as T
from euclip_cli.study.spec import load_claims, load_study
from tests import browser

pytestmark = pytest.mark.skipif(browser.CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page")
    study, claims = load_study("study-geometries"), load_claims()
    folder = tmp / "studies" / study.name
    plans = J.plan(study, folder, claims)

    def invented(p, keys):
        rng = random.Random(f"{p.config}-{p.seed}")
        return {**{k: rng.uniform(10, 90) for k in [*keys, *T.GROUP_METRICS]}, "text_nearer_root": rng.uniform(0.3, 0.7),
                "curvature_fall": rng.uniform(-0.1, 0.5)}

    for p in plans:
        p.run_dir.mkdir(parents=True)
    mp = pytest.MonkeyPatch()
    mp.setattr(R, "run_values", invented)
    summary = R.summarize(study, plans, claims)
    mp.undo()
    T.write_tables(study, summary, folder)
    study_figure(summary["rows"], list(study.configs), study.baseline, {**SUITE_COLUMNS["world"]}, folder / "study")
    result = CliRunner().invoke(app, ["report", "--format", "html", "--studies-dir", str(tmp / "studies"),
                                      "--runs-dir", str(tmp / "no-runs"), "--out", str(tmp / "tables")])
    assert result.exit_code == 0, result.output
    return tmp / "tables" / "report.html", tmp


# Two laptop windows, and one at half a small laptop's screen, where the study tables are wider than
# the window and must scroll inside their own box.
@pytest.mark.parametrize("width", [1366, 1024, 500])
def test_the_page_fits_a_laptop_window_and_shows_figures_at_a_readable_size(report_page, width):
    page, work = report_page
    seen = browser.layout(page, width, 768, work)
    assert seen["document"] <= seen["window"], seen  # nothing overflows sideways: wide tables scroll in their box
    assert seen["images"]
    for image in seen["images"]:
        # Each figure as wide as the text column allows, up to its own size: never a thumbnail.
        assert image["rendered"] >= min(image["natural"], 0.9 * seen["body"]) - 1, seen


def test_the_page_leads_with_the_study_and_folds_published_rows_into_one_table(report_page):
    page, work = report_page
    headings = browser.layout(page, 1366, 768, work)["headings"]
    assert headings[:3] == ["Study geometries: zero-shot (%), mean ± sd over seeds",
                            "Study geometries: the paper's claims", "Study geometries: the noise floor (points)"], headings
    assert not any(h.startswith("Paper Table") for h in headings), headings
    assert "Published numbers without a run of ours (the EuCLIP paper, %)" in headings
    text = page.read_text()
    assert text.index("means and paired differences") < text.index("Published numbers without")
    assert "missing" not in text
