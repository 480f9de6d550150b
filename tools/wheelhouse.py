"""Build a wheelhouse: everything a machine with its own Python and torch lacks to install euclip
offline.

    python tools/wheelhouse.py --target examples/gpu/target-packages.txt --out dist/wheelhouse
    # on the target, with no network (pip install --no-deps of every wheel, then a check of the tree):
    sh WHEELHOUSE/install.sh

The target file lists what the machine already has, one package a line, as ``pip freeze`` writes
it (``name==version``), or a bare name where the version is not known; ``# python: 3.12`` and
``# platform: x86_64-manylinux_2_28`` lines state its interpreter and platform (``--python`` and
``--platform`` override them).

What it does, in order:
1. euclip's own wheel, built from this checkout.
2. euclip's dependencies resolved for the target (``uv pip compile`` for its Python version and
   platform), with the target's packages held at the versions it has and, for the rest, the versions
   of the project's lock (requirements/lock.txt) wherever the target allows them.
3. What the target lacks, downloaded as binary wheels for its interpreter and platform
   (``pip download --no-deps``); a package that ships only a source archive is built here and kept
   only if its wheel is pure Python (``py3-none-any``), which installs anywhere. A package the target
   has at a version its file does not give is carried too where its wheel is small (``--carry-small``,
   1 MiB): installed ahead of the machine's own, its version is the resolution's; a larger one is left
   to the machine, and ``check.py`` reports its version, where euclip's range does not admit it, as
   unverified instead of unmet (the GPU checklist's smoke test, a tiny run of euclip, decides).
4. ``requirements.txt`` (the resolution), ``lacking.txt`` (what the wheelhouse carries),
   ``install.sh`` and ``check.py`` (which verifies the installed tree) beside the wheels, and a summary
   of their sizes. Packages named by ``--leave-out`` (ones the target's work never imports) are
   neither carried nor checked: the install is ``--no-deps`` so that pip does not ask for them.

Exit status 2 for a bad target file or option, 1 when a package cannot be had for the target.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from the checkout, with euclip's environment
from euclip_cli.readers import UnreadableFile, read_text  # noqa: E402  (the one reader of a named file)
LOCK = ROOT / "requirements" / "lock.txt"
OVERRIDES = ROOT / "requirements" / "overrides.txt"

# pip matches a manylinux tag exactly: a wheel built for an older glibc is named by its own tag, so
# every tag a manylinux_2_28 machine accepts is listed (the newest first).
def pip_platform_tags(platform: str) -> list[str]:
    """pip's ``--platform`` tags for a uv-style platform name (``x86_64-manylinux_2_28``)."""
    match = re.fullmatch(r"(x86_64|aarch64)-manylinux_2_(\d+)", platform)
    if not match:
        raise ValueError(f"platform {platform!r} is not of the form x86_64-manylinux_2_NN or aarch64-manylinux_2_NN")
    arch, glibc = match.group(1), int(match.group(2))
    tags = [f"manylinux_2_{n}_{arch}" for n in range(glibc, 16, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]


def canonical(name: str) -> str:
    """A distribution name as PEP 503 normalises it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_target(path: Path) -> tuple[dict[str, str | None], dict[str, str]]:
    """The target's packages (canonical name -> version or None) and its ``# key: value`` settings."""
    packages: dict[str, str | None] = {}
    settings: dict[str, str] = {}
    for number, raw in enumerate(read_text(path, "--target").splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            setting = re.fullmatch(r"#\s*(python|platform|leave-out):\s*(\S+)", line)
            if setting:
                settings[setting.group(1)] = setting.group(2)
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:==([A-Za-z0-9.+!_-]+))?", line)
        if not match:
            raise ValueError(f"{path}:{number}: {line!r} is neither 'name==version' nor a bare package name")
        packages[canonical(match.group(1))] = match.group(2)
    return packages, settings


def overrides() -> dict[str, str]:
    """The requirements requirements/overrides.txt restates, by canonical name."""
    found = {}
    for line in OVERRIDES.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            found[canonical(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line).group(0))] = line
    return found


def pinned(requirements: str) -> dict[str, str]:
    """``name==version`` lines of a compiled requirements file (markers and comments dropped)."""
    found = {}
    for line in requirements.splitlines():
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match:
            found[canonical(match.group(1))] = match.group(2)
    return found


def said(output: str, most: int = 600) -> str:
    """A tool's error output as the tail of one line: an error is one line, whatever uv or pip printed."""
    return " ".join(output.split())[-most:]


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=False, capture_output=True, text=True, **kwargs)


def uv() -> list[str]:
    """The uv command: on PATH, or the module beside this interpreter."""
    if shutil.which("uv"):
        return ["uv"]
    if run([sys.executable, "-m", "uv", "--version"]).returncode == 0:
        return [sys.executable, "-m", "uv"]
    raise SystemExit("error: uv is not installed: pip install uv (make install does), then rerun")


def resolve(target: dict[str, str | None], python: str, platform: str, work: Path) -> dict[str, str]:
    """euclip's dependency tree for the target, as ``name -> version``."""
    constraints = work / "target-constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(target.items()) if version))
    output = work / "requirements.txt"
    # uv prefers the versions an existing output file pins: starting from the lock keeps every package
    # the target leaves free at the version the project's results were produced with.
    shutil.copyfile(LOCK, output)
    spec = str(ROOT / "pyproject.toml")
    result = run([*uv(), "pip", "compile", spec, "--python-version", python, "--python-platform", platform,
                  "-c", str(constraints), "--override", str(OVERRIDES), "-o", str(output), "--no-header", "--no-annotate", "--quiet"])
    if result.returncode != 0:
        raise SystemExit(f"error: euclip's dependencies cannot be resolved for this target (uv: {said(result.stderr)})")
    return pinned(output.read_text())


def fetch(name: str, version: str, python: str, tags: list[str], out: Path) -> str:
    """One package's wheel for the target into ``out``; returns how it was had."""
    platform_args = [arg for tag in tags for arg in ("--platform", tag)]
    got = run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", python, "--implementation", "cp", *platform_args, "-d", str(out),
               f"{name}=={version}"])
    if got.returncode == 0:
        return "downloaded"
    with tempfile.TemporaryDirectory() as build:
        built = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-binary", name,
                     "-w", build, f"{name}=={version}"])
        wheels = list(Path(build).glob("*.whl"))
        if built.returncode != 0 or not wheels:
            raise SystemExit(f"error: {name}=={version} has no wheel for Python {python} on {tags[0]} and did not "
                             f"build here (pip: {said(built.stderr or got.stderr)})")
        if not wheels[0].name.endswith("-none-any.whl"):
            raise SystemExit(f"error: {name}=={version} ships no wheel for Python {python} on {tags[0]}, and its "
                             f"source builds to a compiled wheel ({wheels[0].name}) that fits only this machine")
        shutil.move(str(wheels[0]), out / wheels[0].name)
    return "built here (pure Python)"


INSTALL_SH = """#!/bin/sh
# Install euclip from this wheelhouse with no network, beside the packages the machine has, then
# check that every requirement of euclip's tree is met (check.py). PYTHON: the interpreter (python3
# by default); further arguments go to pip. With --target DIR the check reads DIR first, as a
# PYTHONPATH=DIR run of euclip will.
set -e
here=$(cd "$(dirname "$0")" && pwd)
target=
previous=
for argument in "$@"; do
    [ "$previous" = --target ] && target=$argument
    case $argument in --target=*) target=${argument#--target=} ;; esac
    previous=$argument
done
"${PYTHON:-python3}" -m pip install --no-index --no-deps --no-cache-dir "$@" "$here"/*.whl
if [ -n "$target" ]; then
    PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" "$here/check.py"
else
    "${PYTHON:-python3}" "$here/check.py"
fi
"""

CHECK_PY = """\"\"\"Check that euclip's installed dependency tree is whole: every requirement of euclip and of the
packages it needs is installed at a version it admits, except those the wheelhouse left out by
choice (LEFT_OUT), and with the requirements the project restates (OVERRIDES, from
requirements/overrides.txt) read as restated. Exit 1 naming each unmet requirement. A package the
machine had at a version its target file did not know (UNKNOWN), and too large to carry, is not
unmet but unverified: a line says so, and euclip's own run decides (the GPU checklist's smoke test).\"\"\"
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
except ImportError:  # pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement

LEFT_OUT = {left_out!r}
OVERRIDES = {overrides!r}
UNKNOWN = {unknown!r}


def canonical(name):
    return name.lower().replace("_", "-").replace(".", "-")


unmet, unverified, seen, queue = [], [], set(), ["euclip"]
while queue:
    name = queue.pop()
    if canonical(name) in seen:
        continue
    seen.add(canonical(name))
    for line in metadata.requires(name) or []:
        req = Requirement(line)
        req = Requirement(OVERRIDES[canonical(req.name)]) if canonical(req.name) in OVERRIDES else req
        if req.marker is not None and not req.marker.evaluate({{"extra": ""}}):
            continue
        if canonical(req.name) in LEFT_OUT:
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{{name}} needs {{req}}, which is not installed")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            line = f"{{name}} needs {{req}}, and {{req.name}} {{version}} is installed"
            (unverified if canonical(req.name) in UNKNOWN else unmet).append(line)
        queue.append(req.name)
for line in unmet:
    print("unmet:", line)
for line in unverified:
    print("unverified:", line, "(the machine's own version, which the target file did not know: euclip's own run decides)")
print(f"euclip {{metadata.version('euclip')}}: {{len(seen)}} packages checked, "
      f"{{len(unmet)}} unmet requirements, {{len(unverified)}} unverified"
      + (f"; left out by choice: {{', '.join(sorted(LEFT_OUT))}}" if LEFT_OUT else ""))
sys.exit(1 if unmet else 0)
"""


def carry_small(candidates: dict[str, str], python: str, tags: list[str], out: Path, most_mib: float) -> set[str]:
    """Of the target's packages whose version it does not know (``name -> the resolution's version``), put
    the wheel of each that is at most ``most_mib`` MiB into ``out``: installed ahead of the machine's own,
    it holds the version euclip's range admits, with no luck needed. Returns the rest, left to the
    machine (one whose wheel cannot be had is left too)."""
    left = set()
    for name, version in sorted(candidates.items()):
        with tempfile.TemporaryDirectory() as scratch:
            try:
                fetch(name, version, python, tags, Path(scratch))
            except SystemExit:
                left.add(name)
                continue
            wheel, = Path(scratch).glob("*.whl")
            if wheel.stat().st_size > most_mib * 2 ** 20:
                left.add(name)
            else:
                shutil.move(str(wheel), out / wheel.name)
    return left


def build(target_file: Path, out: Path, python: str | None, platform: str | None, left_out: set[str],
          carry_mib: float = 1.0) -> int:
    try:
        target, settings = read_target(target_file)
    except (UnreadableFile, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    left_out = left_out | {canonical(n) for n in settings.get("leave-out", "").split(",") if n}
    python = python or settings.get("python")
    platform = platform or settings.get("platform", "x86_64-manylinux_2_28")
    if not python or not re.fullmatch(r"3\.\d+", python):
        print(f"error: the target's Python version {python!r} is not of the form 3.N: give --python or a "
              f"'# python: 3.N' line in {target_file}", file=sys.stderr)
        return 2
    try:
        tags = pip_platform_tags(platform)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if out.exists() and not out.is_dir():
        print(f"error: --out {out} is a file: give a new folder for the wheelhouse", file=sys.stderr)
        return 2
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} exists and is not empty: give a new folder (nothing in it was changed)", file=sys.stderr)
        return 2
    staging = Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=out.parent if out.parent.exists() else None))
    try:
        resolved = resolve(target, python, platform, staging)
        lacking = {name: version for name, version in resolved.items() if name not in target and name not in left_out}
        built = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
                     str(staging), str(ROOT)])
        if built.returncode != 0:
            raise SystemExit(f"error: euclip's own wheel did not build (pip: {said(built.stderr)})")
        how = {name: fetch(name, version, python, tags, staging) for name, version in sorted(lacking.items())}
        unknown = carry_small({name: version for name, version in resolved.items() if name in target
                               and target[name] is None and name not in left_out}, python, tags, staging, carry_mib)
        carried = {name: resolved[name] for name in resolved if name in target and target[name] is None
                   and name not in left_out and name not in unknown}
        how |= {name: "carried: small, and the target's version is not known" for name in carried}
        lacking |= carried
        (staging / "lacking.txt").write_text("".join(f"{n}=={v}  # {how[n]}\n" for n, v in sorted(lacking.items())))
        (staging / "install.sh").write_text(INSTALL_SH)
        (staging / "check.py").write_text(CHECK_PY.format(left_out=set(sorted(left_out)), overrides=overrides(),
                                                          unknown=set(sorted(unknown))))
        (staging / "target-constraints.txt").unlink()
        out.mkdir(parents=True, exist_ok=True)
        for item in staging.iterdir():
            shutil.move(str(item), out / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    wheels = sorted(out.glob("*.whl"), key=lambda p: p.stat().st_size, reverse=True)
    total = sum(p.stat().st_size for p in wheels)
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB, for Python {python} on {platform}, in {out}")
    for wheel in wheels[:5]:
        print(f"  {wheel.stat().st_size / 2**20:6.1f} MiB  {wheel.name}")
    present = sorted(n for n in resolved if n in target and n not in lacking)
    print(f"left to the target ({len(present)}): {', '.join(present)}")
    if left_out:
        print(f"left out by choice: {', '.join(sorted(left_out))}")
    unknown = sorted(n for n in present if target[n] is None and n not in lacking)
    if unknown:
        print(f"the target's own version, not known here, decided by euclip's run there ({len(unknown)}): "
              f"{', '.join(unknown)}")
    print(f"install there: sh {out.name}/install.sh")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="What the target machine already has.")
    parser.add_argument("--out", type=Path, required=True, help="A new folder for the wheelhouse.")
    parser.add_argument("--python", help="The target's Python version (3.N); default: the target file's.")
    parser.add_argument("--platform", help="The target's platform (x86_64-manylinux_2_28 by default).")
    parser.add_argument("--leave-out", action="append", default=[], metavar="NAME[,NAME]",
                        help="Packages euclip's tree names but the target's work never imports, left out of the "
                             "wheelhouse (and of the install's check); also '# leave-out: NAME' lines in the target file.")
    parser.add_argument("--carry-small", type=float, default=1.0, metavar="MIB",
                        help="Carry a package the target has at an unknown version when its wheel is at most this "
                             "many MiB (default 1); larger ones are left to the target, and its version to euclip's run.")
    args = parser.parse_args(argv)
    if not args.carry_small >= 0:  # NaN fails too
        print(f"error: --carry-small {args.carry_small} is not a size in MiB (0 or more)", file=sys.stderr)
        return 2
    left_out = {canonical(n) for arg in args.leave_out for n in arg.split(",") if n.strip()}
    return build(args.target, args.out, args.python, args.platform, left_out, args.carry_small)


if __name__ == "__main__":
    sys.exit(main())
