"""The command line: help, version, and one-line errors with exit code 2 for user mistakes."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from euclip_cli.cli.main import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def test_help_lists_the_commands_and_does_not_import_torch():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("download", "train", "eval", "report", "recipes"):
        assert command in result.output
    code = "import sys; from euclip_cli.cli.main import app; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_error_funnel_imports_nothing_heavy():
    # errors() resolves exception classes from modules already imported: a mistake caught before
    # any work (an unknown recipe here) answers without loading torch and open_clip.
    code = ("import sys; from typer.testing import CliRunner; from euclip_cli.cli.main import app; "
            "r = CliRunner().invoke(app, ['train', '--recipe', 'no-such-recipe']); "
            "print(r.exit_code, 'torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == ["2", "False"]


def test_version():
    from euclip_cli import __version__

    result = invoke("--version")
    assert result.exit_code == 0 and __version__ in result.output


@pytest.mark.parametrize("command", ["train", "eval", "report", "download", "recipes"])
def test_every_command_has_help_with_examples(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0
    if command in ("train", "eval", "report", "download"):
        assert "Example" in result.output


def test_unknown_override_names_the_key_and_exits_2():
    result = invoke("train", "--recipe", "tiny-clip", "optim.lrr=1", "geometry.name=poincare")
    assert result.exit_code == 2
    assert "optim.lrr" in result.output and "geometry.name" in result.output
    assert "keys in [optim]" in result.output  # bracketed text survives the console's markup
    assert "Traceback" not in result.output


def test_unknown_recipe_exits_2():
    result = invoke("train", "--recipe", "no-such-recipe")
    assert result.exit_code == 2 and "euclip recipes list" in result.output


def test_corrupt_recipe_exits_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim]\nlr = 'fast'\n[model\n")
    result = invoke("recipes", "validate", str(bad))
    assert result.exit_code == 2 and "not valid TOML" in result.output


def test_recipes_list_show_validate():
    listed = invoke("recipes", "list")
    assert listed.exit_code == 0 and "tiny-euclip" in listed.output and "medium-b16-meru" in listed.output
    shown = invoke("recipes", "show", "tiny-euclip", "--resolved")
    assert shown.exit_code == 0 and '"entail_weight": 0.1' in shown.output
    valid = invoke("recipes", "validate")
    assert valid.exit_code == 0 and "recipe(s) valid" in valid.output


def test_missing_training_data_names_the_download_command(tmp_path):
    result = invoke("train", "--recipe", "tiny-clip", f"data.train_dir={tmp_path / 'nothing'}",
                    "--runs-dir", str(tmp_path / "runs"))
    # The recipe's download, which writes the world with the recipe's settings where it trains:
    # `euclip download world` has other defaults (100,000 pairs), which the trainer would refuse.
    assert result.exit_code == 2 and "euclip download --recipe tiny-clip" in result.output


def test_missing_run_exits_2(tmp_path):
    result = invoke("eval", str(tmp_path / "no-run"))
    assert result.exit_code == 2 and "no run" in result.output
    result = invoke("eval", "--recipe", "tiny-clip", "--runs-dir", str(tmp_path))
    assert result.exit_code == 2 and "euclip train --recipe tiny-clip" in result.output


def test_bad_task_and_table_exit_2(tmp_path):
    table = invoke("report", "--table", "9")
    assert table.exit_code == 2 and "--table '9'" in table.output
    (tmp_path / "config.json").write_text("{}")  # a run that exists, so the task list is what is wrong
    result = invoke("eval", "--tasks", "imagenet2k", str(tmp_path))
    assert result.exit_code == 2 and "unknown task(s) imagenet2k" in result.output


def test_report_reads_results_without_importing_torch(tmp_path):
    (tmp_path / "runs").mkdir()
    code = ("import sys; from typer.testing import CliRunner; from euclip_cli.cli.main import app; "
            f"r = CliRunner().invoke(app, ['report', '--runs-dir', {str(tmp_path / 'runs')!r}, '--out', "
            f"{str(tmp_path / 'tables')!r}]); print(r.exit_code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
    assert out[-2:] == ["0", "False"]


def test_a_bug_keeps_its_traceback_while_euclip_errors_are_one_line():
    import typer

    from euclip_cli.cli.common import errors
    from euclip_cli.errors import Failure, UsageError

    for error, code in ((UsageError("bad key"), 2), (Failure("no network"), 1)):
        with pytest.raises(typer.Exit) as caught:
            with errors():
                raise error
        assert caught.value.exit_code == code
    with pytest.raises(KeyError):  # not euclip's: a bug, left to show its traceback
        with errors():
            raise KeyError("oops")
    with pytest.raises(ValueError):  # a library's ValueError is no longer taken for a user mistake
        with errors():
            raise ValueError("bad shape")


def test_download_world_refuses_a_folder_holding_something_else(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    result = invoke("download", "world", "--out", str(tmp_path), "--samples", "10", "--eval-size", "5")
    assert result.exit_code == 2 and "not an embedded world" in result.output
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_a_built_wheel_ships_every_recipe(tmp_path):
    """A non-editable install (pip install euclip) must find the recipes and every other data file the
    package reads: they are package data."""
    import shutil
    import zipfile
    from pathlib import Path

    from euclip_cli.config import list_recipes

    root = Path(__file__).resolve().parents[1]
    source = tmp_path / "src"
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(".venv", ".git", "data", "results", "build", "*.egg-info"),
                    symlinks=True)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source),
                            "-w", str(tmp_path / "wheel")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "wheel").glob("euclip-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).stem for n in names if n.startswith("euclip_cli/recipes/")}
    assert shipped == set(list_recipes()) and len(shipped) > 10
    # Every data file the package reads at run time (published tables, claims, MERU's prompts).
    package = root / "euclip_cli"
    data = {str(p.relative_to(root)) for p in package.rglob("*") if p.suffix in (".csv", ".toml")}
    assert data <= set(names), sorted(data - set(names))


def test_a_truncated_config_in_one_run_is_named_not_a_json_error(tmp_path):
    runs = tmp_path / "runs"
    (runs / "broken").mkdir(parents=True)
    (runs / "broken" / "config.json").write_text('{"model": {"arch": "ti')
    result = invoke("report", "--runs-dir", str(runs), "--out", str(tmp_path / "tables"))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "broken/config.json is not valid JSON" in result.output.replace("\n", "")


def test_a_failed_first_try_does_not_block_the_corrected_command(tmp_path, world):
    """A run directory is created only once the model and data check out: the typo'd arch leaves
    nothing behind, and the corrected command is not refused as 'another configuration'."""
    runs = tmp_path / "runs"
    bad = invoke("train", "--recipe", "tiny-clip", "model.arch=vit-typo", f"data.train_dir={world / 'train'}",
                 "--runs-dir", str(runs), "--name", "r")
    assert bad.exit_code == 2 and "model.arch 'vit-typo'" in bad.output
    missing = invoke("train", "--recipe", "tiny-clip", f"data.train_dir={tmp_path / 'none'}", "--runs-dir", str(runs),
                     "--name", "r")
    assert missing.exit_code == 2 and "does not exist" in missing.output
    assert not (runs / "r").exists()


def test_a_report_without_runs_leaves_filled_tables_as_they_were(tmp_path):
    """A mistyped --runs-dir (or a studies-only report) must not replace tables with empty ones."""
    out = tmp_path / "tables"
    out.mkdir()
    (out / "embedded.md").write_text("a filled table\n")
    result = invoke("report", "--runs-dir", str(tmp_path / "nothere"), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "embedded.md").read_text() == "a filled table\n"
    assert f"no runs in {tmp_path / 'nothere'}" in " ".join(result.output.split())
    assert (out / "table1.md").exists()  # a table that was not there is still written (published rows)
