"""The HTML report as a person opens it: in a real headless Chromium, in laptop-sized windows.

The user's own work is one tiny run, trained and evaluated through the CLI, and the shipped
``study-geometries`` (ten configurations, three seeds) with invented per-run results in place of
training, so the page has a study's real shape and width; no run matches a published row, so every
published table belongs in the closed reference section.
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
from tests.trained import copy_run

pytestmark = pytest.mark.skipif(browser.CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def report_page(tmp_path_factory, world, tiny_clip):
    tmp = tmp_path_factory.mktemp("page")
    copy_run(tiny_clip, tmp / "runs", "my-clip")
    evaluated = CliRunner().invoke(app, ["eval", str(tmp / "runs" / "my-clip"), "--world", str(world)])
    assert evaluated.exit_code == 0, evaluated.output
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
                                      "--runs-dir", str(tmp / "runs"), "--out", str(tmp / "tables")])
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


def test_the_page_opens_on_the_users_runs_then_their_studies_with_published_tables_folded(report_page):
    page, work = report_page
    seen = browser.layout(page, 1366, 768, work)
    single = "(one seed per row: a difference between rows may be seed noise; euclip study compares configurations " \
             "over seeds, with intervals)"
    # The run scored the world's hard negatives too: the compositional table has its row.
    assert seen["headings"][:5] == [
        f"Embedded world: zero-shot results (%) {single}",
        f"Compositional tasks: Winoground's scores and SugarCrepe's accuracy per split, in each run's geometry (%) {single}",
        "Figures of your runs", "Study geometries: zero-shot (%), mean ± sd over seeds",
        "Study geometries: the paper's claims"], seen["headings"]
    shown = [item for item in seen["items"] if item["shown"]]
    first_table = next(item for item in shown if item["kind"] == "table")
    assert first_table["columns"][0] == ["my-clip"], first_table  # the run's name heads the first table
    first_figure = next(item for item in shown if item["kind"] == "figure")
    assert first_figure["caption"].startswith("Training curves"), first_figure
    # Every published table is on the page, whole, but folded away until opened.
    folded = [item for item in seen["items"] if item["kind"] == "table" and not item["shown"]]
    # The EuCLIP paper's four tables, its traversal counts, MERU's, HyCoCLIP's model zoo and LAION's grid.
    assert len(folded) == 8 and all(len(item["columns"][0]) >= 3 for item in folded), folded
    assert not any(item["shown"] and "(paper)" in " ".join(item["header"]) for item in seen["items"])


def test_no_table_on_the_page_has_a_column_without_a_value(report_page):
    page, work = report_page
    tables = [item for item in browser.layout(page, 1366, 768, work)["items"] if item["kind"] == "table"]
    assert len(tables) >= 10
    for table in tables:
        for name, cells in zip(table["header"], table["columns"]):
            assert name.strip(), table["header"]  # no header cell over nothing (MERU's pivot once had one)
            assert any(c.strip() not in ("", "missing") for c in cells), (name, table["header"])
