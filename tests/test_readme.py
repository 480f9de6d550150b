"""The README's results are the committed study tables, rendered: a test holds them equal."""

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from euclip_cli.cli import app
from euclip_cli.errors import UsageError
from euclip_cli.report.readme import BLOCK, update_readme

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


# Pages whose results blocks are rendered from committed study tables.
PAGES = [README, ROOT / "docs" / "results" / "budget.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_quotes_its_committed_results_exactly(page, tmp_path):
    if not page.exists():
        pytest.fail(f"{page} is gone: drop it from PAGES")
    blocks = list(BLOCK.finditer(page.read_text()))
    assert blocks, f"{page} has no results block"
    copy = tmp_path / page.name
    copy.write_text(page.read_text())
    for block in blocks:  # the folders, beside the copy as beside the page
        assert (page.parent / block["folder"] / "provenance.json").exists(), block["folder"]
        shutil.copytree(page.parent / block["folder"], tmp_path / block["folder"])
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


def test_a_readme_without_a_block_or_files_is_refused_in_one_line(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("# nothing here\n")
    result = CliRunner().invoke(app, ["report", "--readme", str(page)])
    assert result.exit_code == 2 and "has no '<!-- results FOLDER -->'" in result.output
    page.write_text("<!-- results nowhere -->\nx\n<!-- /results -->\n")
    result = CliRunner().invoke(app, ["report", "--readme", str(page)])
    assert result.exit_code == 2 and "publish the study first" in " ".join(result.output.split())
    assert "Traceback" not in result.output
