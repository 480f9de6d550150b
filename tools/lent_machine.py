"""Make a stand-in for a lent GPU machine's Python, to rehearse the GPU checklist on a CPU.

    python tools/lent_machine.py --target examples/gpu/target-packages.txt --wheelhouse WH --out DIR

The lent machine has its own Python with torch and some two hundred packages preinstalled, and no
package index. This makes ``DIR``, a fresh virtual environment of the target's Python version (3.12
for the lent machines) holding the packages of euclip's dependency tree that the target file says
the machine has: at the target's version where the file gives one, else at the newest version the
index serves (what a machine imaged from the newest packages holds; pandas and opencv are the
cases that matter). The tree is the wheelhouse's own resolution (``WH/requirements.txt``), so what
the stand-in holds and what the wheelhouse carries are complementary, as on the machine. euclip
itself is not installed: the checklist installs it from the wheelhouse, with no index.

Writes ``DIR/machine.txt`` (the installed packages, as ``pip list --format=freeze`` gives them).
Exit status 2 for a bad option or target file, 1 when the install fails.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wheelhouse import canonical, pinned, read_target  # noqa: E402


def preinstalled(target_file: Path, wheelhouse: Path) -> list[str]:
    """pip requirements for what the target holds of the wheelhouse's resolution (``name==version`` where
    the target file gives the version, the bare name where it does not)."""
    target, _ = read_target(target_file)
    resolved = pinned((wheelhouse / "requirements.txt").read_text())
    carried = pinned((wheelhouse / "lacking.txt").read_text())
    return [f"{name}=={target[name]}" if target[name] else name
            for name in sorted(resolved) if name in target and name not in carried]


def interpreter(version: str) -> str:
    """A ``pythonX.Y`` that runs: the one on PATH, else one of pyenv's installed versions (whose shim on
    PATH refuses to run a version that is installed but not selected)."""
    candidates = [shutil.which(f"python{version}")]
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True) if shutil.which("pyenv") else None
    if root is not None and root.returncode == 0:
        candidates += sorted(map(str, Path(root.stdout.strip()).glob(f"versions/{version}*/bin/python{version}")))
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    raise SystemExit(f"error: no python{version} runs here: install it (pyenv install {version}) and rerun")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="What the lent machine has (examples/gpu/target-packages.txt).")
    parser.add_argument("--wheelhouse", type=Path, required=True, help="The wheelhouse made for it (make wheelhouse).")
    parser.add_argument("--out", type=Path, required=True, help="A new folder for the environment.")
    args = parser.parse_args(argv)
    if not (args.wheelhouse / "requirements.txt").is_file() or not (args.wheelhouse / "lacking.txt").is_file():
        print(f"error: {args.wheelhouse} is not a wheelhouse (no requirements.txt and lacking.txt): make one with "
              f"make wheelhouse WHEELHOUSE={args.wheelhouse}", file=sys.stderr)
        return 2
    if args.out.exists():
        print(f"error: {args.out} exists: give a new folder (nothing in it was changed)", file=sys.stderr)
        return 2
    try:
        _, settings = read_target(args.target)
        wanted = preinstalled(args.target, args.wheelhouse)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        print(f"error: cannot read the target file {args.target}: {err}", file=sys.stderr)
        return 2
    python = interpreter(settings.get("python", "3.12"))
    made = subprocess.run([python, "-m", "venv", str(args.out)], capture_output=True, text=True)
    if made.returncode != 0:
        print(f"error: the environment did not build: {made.stderr.strip()[-400:]}", file=sys.stderr)
        return 1
    pip = [str(args.out / "bin" / "python"), "-m", "pip"]
    done = subprocess.run([*pip, "install", "--quiet", *wanted], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"error: the target's packages did not install:\n{done.stderr.strip()[-1500:]}", file=sys.stderr)
        return 1
    frozen = subprocess.run([*pip, "list", "--format=freeze"], capture_output=True, text=True, check=True).stdout
    (args.out / "machine.txt").write_text(frozen)
    versions = {canonical(name): version for name, version in (line.split("==", 1) for line in frozen.splitlines() if "==" in line)}
    unknown = [w for w in wanted if "==" not in w]
    print(f"{args.out}: Python {settings.get('python', '3.12')}, {len(wanted)} of the target's packages; "
          f"where the target names no version, the newest: "
          + ", ".join(f"{n} {versions.get(canonical(n), '?')}" for n in unknown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
