"""The README's results are the committed study tables, rendered: a test holds them equal."""

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from euclip_cli.cli import app
from euclip_cli.errors import UsageError
from euclip_cli.report.readme import BLOCK, block_folders, update_readme

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


# Pages whose results blocks are rendered from committed study tables.
PAGES = [README, *(ROOT / "docs" / "results" / name for name in ("budget.md", "beta0.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_quotes_its_committed_results_exactly(page, tmp_path):
    if not page.exists():
        pytest.fail(f"{page} is gone: drop it from PAGES")
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
    claims.write_text(claims.read_text().replace("reproduced", "opposite", 1).replace("inconclusive", "opposite", 1))
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
    claims.loc[claims["claim"] == "euclip-beats-meru", "verdict"] = "reproduced"
    claims.to_csv(folder / "claims.csv", index=False)
    page = tmp_path / "README.md"
    page.write_text("<!-- results study -->\n<!-- /results -->\n")
    update_readme(page)
    text = page.read_text()
    assert "- **EuCLIP matches or beats CLIP**: undetermined: the interval includes 0;" in text
    assert "- **Removing the final LayerNorm helps Euclidean d2 with entailment**: undetermined" in text
    assert "12 secondary claims, adjusted among themselves, are in [study/study.md](study/study.md): 2 decided " \
           "(euclip-beats-meru, euclip-text-nearer-root)." in text
    assert "| EuCLIP beats MERU" not in text  # no claims table: the secondary claims are linked


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
