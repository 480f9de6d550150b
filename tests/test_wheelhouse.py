"""tools/wheelhouse.py: what a machine with its own torch and no network lacks, and the offline install."""

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import wheelhouse  # noqa: E402


def test_a_target_file_reads_versions_bare_names_and_settings(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("# python: 3.12\n# leave-out: pycocoevalcap\n# a comment\nTorch==2.11.0\nnumpy==2.5.2\n"
                      "Pillow\nhuggingface_hub==1.33.0\n\n")
    packages, settings = wheelhouse.read_target(target)
    assert packages == {"torch": "2.11.0", "numpy": "2.5.2", "pillow": None, "huggingface-hub": "1.33.0"}
    assert settings == {"python": "3.12", "leave-out": "pycocoevalcap"}


def test_the_gpu_machines_target_file_reads():
    packages, settings = wheelhouse.read_target(ROOT / "examples" / "gpu" / "target-packages.txt")
    assert settings["python"] == "3.12" and packages["torch"] == "2.11.0" and "pillow" in packages


def test_platform_tags_are_every_manylinux_tag_the_target_accepts():
    tags = wheelhouse.pip_platform_tags("x86_64-manylinux_2_28")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags
    with pytest.raises(ValueError, match="x86_64-manylinux_2_NN"):
        wheelhouse.pip_platform_tags("win_amd64")


def run_tool(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "wheelhouse.py"), *args], capture_output=True,
                          text=True, timeout=900)


@pytest.mark.parametrize("content, option, message", [
    ("torch>=2\n", [], "target.txt:1: 'torch>=2' is neither"),
    ("torch==2.11.0\n", [], "Python version None is not of the form 3.N"),
    ("# python: 3.12\n", ["--platform", "macosx_arm64"], "x86_64-manylinux_2_NN"),
])
def test_a_bad_target_is_one_line_and_exit_2(tmp_path, content, option, message):
    (tmp_path / "target.txt").write_text(content)
    result = run_tool("--target", str(tmp_path / "target.txt"), "--out", str(tmp_path / "wh"), *option)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "wh").exists()


def test_a_target_that_is_not_a_regular_file_or_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path):
    import os

    os.mkfifo(tmp_path / "target.fifo")
    (tmp_path / "target.txt").write_text("# python: 3.12\n")
    (tmp_path / "wh.txt").write_text("mine")
    for args, message in ((["--target", str(tmp_path / "target.fifo"), "--out", str(tmp_path / "wh")], "is a FIFO"),
                          (["--target", "/dev/zero", "--out", str(tmp_path / "wh")], "is a device"),
                          (["--target", str(tmp_path / "target.txt"), "--out", str(tmp_path / "wh.txt")], "is a file")):
        result = run_tool(*args)
        assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert (tmp_path / "wh.txt").read_text() == "mine" and not (tmp_path / "wh").exists()


def test_a_wheelhouse_is_never_written_over_a_folder_that_holds_files(tmp_path):
    (tmp_path / "target.txt").write_text("# python: 3.12\n")
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / "mine.whl").write_text("x")
    result = run_tool("--target", str(tmp_path / "target.txt"), "--out", str(tmp_path / "wh"))
    assert result.returncode == 2 and "is not empty" in result.stderr
    assert (tmp_path / "wh" / "mine.whl").read_text() == "x"


LACKING = ("wordsegment",)  # small, pure Python: what the simulated target lacks besides euclip
SMALL_UNKNOWN = "tabulate"  # listed without a version, its wheel small: carried all the same
LARGE_UNKNOWN = "pandas"  # listed without a version, its wheel over 1 MiB: left to the machine


@pytest.mark.slow
def test_an_offline_install_beside_a_machines_own_packages_has_euclips_whole_tree(tmp_path):
    """The target: this environment's packages (its torch among them) less euclip and a small one, two of
    them listed without a version, seen by a fresh virtual environment through a .pth file, as a GPU
    image's preinstalled packages are. The wheelhouse (resolved and downloaded from the package index)
    must carry exactly what it lacks and the small package of unknown version, and install.sh must
    install it with no index and check the tree."""
    present = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()}
    target = tmp_path / "target.txt"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    target.write_text(f"# python: {python}\n" + "".join(
        f"{name}\n" if wheelhouse.canonical(name) in (SMALL_UNKNOWN, LARGE_UNKNOWN) else f"{name}=={version}\n"
        for name, version in sorted(present.items()) if wheelhouse.canonical(name) not in {"euclip", *LACKING}))
    built = run_tool("--target", str(target), "--out", str(tmp_path / "wh"))
    assert built.returncode == 0, built.stderr
    carried = {line.split("==")[0] for line in (tmp_path / "wh" / "lacking.txt").read_text().splitlines()}
    assert carried == {*LACKING, SMALL_UNKNOWN}
    assert len(list((tmp_path / "wh").glob("*.whl"))) == len(LACKING) + 2  # and euclip's own
    assert f"decided by euclip's run there (1): {LARGE_UNKNOWN}" in built.stdout

    machine = tmp_path / "machine"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(machine)], check=True)
    site = Path(subprocess.run([machine / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {**os.environ, "PYTHON": str(machine / "bin" / "python"), "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": "", "PIP_CONSTRAINT": ""}
    # pip itself comes from the preinstalled packages, as on the GPU image; euclip lands in the machine's own.
    installed = subprocess.run(["sh", str(tmp_path / "wh" / "install.sh"), "--target", str(site), "--upgrade"],
                               capture_output=True, text=True, env=env, timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "0 unmet requirements" in installed.stdout
    assert {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")} == {"euclip", *LACKING, SMALL_UNKNOWN}
    help_text = subprocess.run([machine / "bin" / "python", "-m", "euclip_cli", "--help"], capture_output=True,
                               text=True, cwd=tmp_path, timeout=300)
    assert help_text.returncode == 0 and "train" in help_text.stdout

    # A version of the machine's own that the target file did not give and euclip's range does not admit is
    # unverified, not unmet (exit 0): here a requirement added to the installed euclip's metadata.
    metadata = next(site.glob("euclip-*.dist-info")) / "METADATA"
    metadata.write_text(metadata.read_text().replace("Requires-Dist:", f"Requires-Dist: {LARGE_UNKNOWN}>=99\n"
                                                     "Requires-Dist:", 1))
    check = subprocess.run([machine / "bin" / "python", str(tmp_path / "wh" / "check.py")], capture_output=True,
                           text=True, env=env)
    assert check.returncode == 0 and f"unverified: euclip needs {LARGE_UNKNOWN}>=99" in check.stdout, check.stdout
    # A requirement nothing installed satisfies is named by the check (exit 1), since the machine sees this
    # environment's packages (all of them).
    metadata.write_text(metadata.read_text().replace("Requires-Dist:", "Requires-Dist: no-such-package-euclip>=1\n"
                                                     "Requires-Dist:", 1))
    check = subprocess.run([machine / "bin" / "python", str(tmp_path / "wh" / "check.py")], capture_output=True,
                           text=True, env=env)
    assert check.returncode == 1 and "euclip needs no-such-package-euclip>=1, which is not installed" in check.stdout


def test_a_resolution_or_build_that_fails_is_one_line_with_the_tools_own_words(tmp_path, monkeypatch):
    """uv's and pip's explanations, many lines long, were printed under the error line: now its tail, folded."""
    explanation = "  × No solution found when resolving dependencies:\n  ╰─▶ Because torch==0.0.1 was not found\n"
    failed = subprocess.CompletedProcess([], 1, "", explanation)
    monkeypatch.setattr(wheelhouse, "uv", lambda: ["uv"])
    monkeypatch.setattr(wheelhouse, "run", lambda command, **kwargs: failed)
    for attempt in (lambda: wheelhouse.resolve({"torch": "0.0.1"}, "3.12", "x86_64-manylinux_2_28", tmp_path),
                    lambda: wheelhouse.fetch("torch", "0.0.1", "3.12", ["manylinux_2_28_x86_64"], tmp_path)):
        with pytest.raises(SystemExit) as stop:
            attempt()
        message = str(stop.value.code)
        assert message.startswith("error: ") and "\n" not in message and "torch==0.0.1 was not found" in message
