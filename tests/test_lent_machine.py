"""The GPU checklist on a stand-in for the lent GPU machine, up to the first row that needs a GPU.

The stand-in (tools/lent_machine.py) is a fresh Python 3.12 with the machine's torch 2.11.0 and the
rest of euclip's tree that the machine holds: at the target file's versions, or the newest the
index serves where the file names none (pandas 3.x and opencv 5 today, outside euclip's ranges).
The wheelhouse is built from this checkout as `make wheelhouse` builds it; the checklist then runs
exactly as documented for a bare machine (EUCLIP_WHEELHOUSE, python3 first on PATH, no index and no
pip configuration), with EUCLIP_NO_GPU=1.

It needs the package index and about 5 minutes (the wheelhouse 1 min 45 s, the stand-in 3 min, the
checklist 1 min 30 s on the 2-core Intel Xeon), so it runs as its own step of .ci/run
(EUCLIP_LENT_MACHINE=1), not in `make test`. The stand-in is kept between runs in
~/.cache/euclip/lent-machine-KEY, KEY the digest of what it was made from.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "examples" / "gpu" / "target-packages.txt"

pytestmark = pytest.mark.skipif(not os.environ.get("EUCLIP_LENT_MACHINE"),
                                reason="needs the package index and 5 minutes: .ci/run runs it (EUCLIP_LENT_MACHINE=1)")


def run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, (command, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    out = tmp_path_factory.mktemp("lent") / "wheelhouse"
    run([sys.executable, str(ROOT / "tools" / "wheelhouse.py"), "--target", str(TARGET), "--out", str(out)], timeout=1200)
    return out


@pytest.fixture(scope="module")
def machine(wheelhouse):
    sys.path.insert(0, str(ROOT / "tools"))
    from lent_machine import preinstalled

    key = hashlib.sha256("\n".join([TARGET.read_text(), *preinstalled(TARGET, wheelhouse)]).encode()).hexdigest()[:16]
    folder = Path.home() / ".cache" / "euclip" / f"lent-machine-{key}"
    if not (folder / "machine.txt").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        run([sys.executable, str(ROOT / "tools" / "lent_machine.py"), "--target", str(TARGET), "--wheelhouse",
             str(wheelhouse), "--out", str(folder)], timeout=1800)
    return folder


def test_the_checklist_runs_on_a_bare_lent_machine_up_to_the_first_row_that_needs_a_gpu(wheelhouse, machine, tmp_path):
    frozen = (machine / "machine.txt").read_text()
    assert "torch==2.11.0" in frozen and "euclip" not in frozen  # the machine's torch; euclip comes from the wheelhouse
    # The machine's interpreter is python3 alone: a `python` the script called would be another one here.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {machine / "bin" / "python3"} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "EUCLIP")}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
            "EUCLIP_WHEELHOUSE": str(wheelhouse), "EUCLIP_NO_GPU": "1", "EUCLIP_WORLD_SAMPLES": "600",
            "EUCLIP_JPEG_SAMPLES": "60"}
    out = tmp_path / "checklist"
    for part in ("1", "4"):  # one part per call, as on the device; the second keeps the first's install
        done = subprocess.run(["bash", str(ROOT / "examples" / "gpu" / "checklist.sh"), str(out), "--part", part],
                              capture_output=True, text=True, env=env, timeout=1200, cwd=ROOT)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "Traceback" not in done.stdout + done.stderr
    summary = (out / "summary.md").read_text()
    for row in ("smoke", "jpeg-shards", "world", "plan-medium-euclip", "memory-b256", "memory-b512-checkpointed"):
        assert re.search(rf"^\| {row} \| ok \|", summary, re.M), summary
    # euclip came from the wheelhouse into OUT/site, beside the machine's own packages, and its check passed.
    install = (out / "logs" / "install.log").read_text()
    assert "0 unmet requirements" in install and (out / "site" / "euclip_cli").is_dir()
    # A version the target file did not know and euclip's range does not admit is left to the smoke run.
    versions = dict(line.split("==", 1) for line in frozen.splitlines() if "==" in line)
    if int(versions["pandas"].split(".")[0]) >= 3:
        assert "unverified: euclip needs pandas<3" in install
    # The machine's record and the summary's head come from its own python3 (a bare machine has no `python`).
    assert "torch==2.11.0" in (out / "machine.txt").read_text()
    assert "torch 2.11.0" in summary and "no GPU (nvidia-smi)" in summary
