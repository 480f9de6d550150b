"""How long, and in how much memory, the study summary and ``euclip report`` read a large study.

Builds a study folder of study-geometries at --seeds seeds (10: 100 runs, each a config.json, an eval.jsonl
over the world's tasks and a metrics.jsonl of --steps records; one run's metrics.jsonl has
--long-steps records), then, each in a fresh process, times and measures the peak resident memory
of (1) the study summary (``study.summaries.summarize`` and ``study.tables.write_tables``, what
``euclip study`` does once its runs are finished) and (2) ``euclip report`` over the study's runs.
Every number is made up (uniform noise): only the bookkeeping is measured.

    python examples/bookkeeping/scale.py --out /tmp/scale          (100 runs, one of 1,000,000 records)
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

# Each measured in a fresh process, which prints its seconds and its own peak resident memory in KiB
# (VmHWM: the high-water mark of the process's own memory map; ru_maxrss would carry the parent's
# across fork and exec).
PEAK = "[int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0]"
SUMMARY = """
import sys, time
from pathlib import Path
from euclip_cli.study.jobs import plan
from euclip_cli.study.summaries import summarize
from euclip_cli.study.spec import load_claims, load_study
from euclip_cli.study.tables import write_tables
out = Path(sys.argv[1])
study = load_study("study-geometries", int(sys.argv[2]))
began = time.perf_counter()
summary = summarize(study, plan(study, out, load_claims()), load_claims())
write_tables(study, summary, out)
print(time.perf_counter() - began, PEAK)
"""
REPORT = """
import sys, time
from euclip_cli.cli.main import app
began = time.perf_counter()
try:
    app(["report", "--runs-dir", sys.argv[1] + "/runs", "--studies-dir", sys.argv[1] + "/none", "--out",
         sys.argv[1] + "/tables"])
except SystemExit as done:
    assert not done.code, done.code
print(time.perf_counter() - began, PEAK)
"""


def build(out: Path, seeds: int, steps: int, long_steps: int) -> int:
    from euclip_cli import config as C
    from euclip_cli.evaluate.runner import PROTOCOL
    from euclip_cli.protocol.tasks import select
    from euclip_cli.rundir import RunDir
    from euclip_cli.study.jobs import plan
    from euclip_cli.study.spec import load_claims, load_study

    study = load_study("study-geometries", seeds)
    plans = plan(study, out, load_claims())
    tasks = [t.key for t in select(study.tasks)]
    rng = random.Random(0)
    for i, p in enumerate(plans):
        run = RunDir(p.run_dir)
        run.claim(p.resolved, {"recipe": C.from_dict(p.resolved).recipe})
        with run.eval_file.open("w") as f:
            for key in tasks:
                value = rng.random()
                metrics = {"main_metric": value, "image_retrieval_recall@1": value, "text_retrieval_recall@1": value}
                f.write(json.dumps({"key": key, "dataset": key, "checkpoint": "checkpoints/step_1.pt", "step": 1,
                                    "protocol": PROTOCOL, "metrics": metrics}) + "\n")
        with run.metrics_file.open("w") as f:
            for step in range(1, (long_steps if i == 0 else steps) + 1):
                f.write(json.dumps({"step": step, "loss": rng.random(), "contrastive": rng.random(),
                                    "logit_scale": 10 + rng.random(), "samples_per_s": 300.0,
                                    "data_wait_share": 0.0}) + "\n")
    return len(plans)


def measure(code: str, out: Path, seeds: int) -> tuple[float, float]:
    """``(seconds, peak resident MiB)`` of ``code`` in a fresh interpreter (imports not counted in the time)."""
    code = code.replace("PEAK", PEAK)
    found = subprocess.run([sys.executable, "-c", code, str(out), str(seeds)], check=True, capture_output=True,
                           text=True)
    seconds, peak_kib = map(float, found.stdout.split()[-2:])
    return seconds, peak_kib / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=10, help="seeds of each of the study's ten configurations")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--long-steps", type=int, default=1_000_000)
    args = parser.parse_args()
    runs = build(args.out, args.seeds, args.steps, args.long_steps)
    size = sum(f.stat().st_size for f in (args.out / "runs").rglob("*.jsonl"))
    print(f"{runs} runs, {size / 2**20:.0f} MiB of JSON lines")
    for name, code in (("study summary", SUMMARY), ("euclip report", REPORT)):
        seconds, peak = measure(code, args.out, args.seeds)
        print(f"{name}: {seconds:.1f} s, peak resident memory {peak:.0f} MiB")


if __name__ == "__main__":
    main()
