"""The GPU checklist's tables, appended to its summary: every run's figures, the matrix, the benches'
ratios against OpenCLIP's trainer, and each memory row's peak beside its plan.

    python examples/gpu/summarize.py RUNS SUMMARY OUT      (examples/gpu/checklist.sh runs it)
"""

import json
import re
import statistics
import sys
from pathlib import Path


def median(values):
    return statistics.median(values) if values else None


def described(run: Path) -> dict:
    """A run's figures after its first two (warm-up) records."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [r for r in records if r["step"] > 2] or records
    loader = [r for r in timed if "loader_samples_per_s" in r]
    return {"steps": records[-1]["step"], "loss": records[-1]["loss"], "scale": records[-1].get("loss_scale", "-"),
            "median": median([r["samples_per_s"] for r in timed]),
            # the timed steps' samples over their time: batches come in clumps, one per worker
            "overall": statistics.harmonic_mean([r["samples_per_s"] for r in timed]),
            "wait": median([r["data_wait_share"] for r in timed]),
            "could": median([r["loader_samples_per_s"] for r in loader]),
            "cpu": median([r["loader_cpu_share"] for r in loader]),
            "gpu": max(r.get("gpu_peak_mib", 0) for r in records)}


PLAN_LINE = re.compile(r"one GPU at batch (\d+): ([\d.]+) GiB without checkpointing, ([\d.]+) GiB with")


def planned_gib(log: Path, checkpointed: bool):
    """The GiB ``euclip train --plan`` gave one GPU for a run (its log), or None."""
    found = PLAN_LINE.search(" ".join(log.read_text().split())) if log.exists() else None
    return float(found.group(3 if checkpointed else 2)) if found else None


def main(runs: Path, summary: Path, out: Path) -> None:
    lines = ["", "| run | steps | last loss | samples/s (median step) | waiting for data (median) "
             "| loaders could give, samples/s (their CPU share) | peak GPU MiB | loss scale |",
             "|---|---|---|---|---|---|---|---|"]
    matrix, memory = {}, []
    for run in sorted(p for p in (runs.iterdir() if runs.exists() else ()) if (p / "metrics.jsonl").exists()):
        d = described(run)
        if run.name.startswith("matrix-"):
            matrix[run.name.removeprefix("matrix-")] = d
            continue
        if run.name.startswith("memory-"):
            name = run.name.removeprefix("memory-")
            memory.append((name, d["gpu"], planned_gib(out / "logs" / f"plan-{name}.log", name.endswith("-checkpointed"))))
        could = f"{d['could']:.0f} ({d['cpu']:.0%})" if d["could"] else "-"
        lines.append(f"| {run.name} | {d['steps']} | {d['loss']:.3f} | {d['median']:.0f} | {d['wait']:.0%} | {could} | "
                     f"{d['gpu']:.0f} | {d['scale']} |")
    # OpenCLIP's trainer, from the benches' results (the same shards, workers and precision).
    for name, folder in (("openclip-trainer", "bench"), ("openclip-trainer-jpeg-vit-b32", "bench-jpeg")):
        found = sorted((out / folder).glob("train-*.json"))
        if found:
            m = json.loads(found[-1].read_text())["measurements"]["openclip"]
            matrix[name] = {"median": m["samples_per_s"], "overall": m.get("overall_samples_per_s"),
                            "wait": m.get("data_wait_share"), "could": None, "cpu": None, "gpu": None}
    lines += ["", "The matrix (bench-vit or ViT-B/32 as named, bf16): samples/s over the timed steps", "",
              "| row | samples/s (all timed steps) | median step | x as is | waiting for data | loaders could give "
              "(CPU) | peak GPU MiB |", "|---|---|---|---|---|---|---|"]
    base = matrix.get("as-is", {}).get("overall")
    for name, d in matrix.items():
        ratio = f"{d['overall'] / base:.2f}" if base and d.get("overall") else "-"
        could = f"{d['could']:.0f} ({d['cpu']:.0%})" if d.get("could") else "-"
        wait = f"{d['wait']:.0%}" if d.get("wait") is not None else "-"
        overall = f"{d['overall']:.0f}" if d.get("overall") else "-"
        gpu = f"{d['gpu']:.0f}" if d.get("gpu") else "-"
        lines.append(f"| {name} | {overall} | {d['median']:.0f} | {ratio} | {wait} | {could} | {gpu} |")
    benches = []
    for folder in ("bench-jpeg", "bench"):
        found = sorted((out / folder).glob("train-*.json"))
        if found:
            result = json.loads(found[-1].read_text())
            speed = result.get("speedup_vs_openclip")
            benches.append(f"| {folder} | {result['settings']['arch']} | "
                           f"{result['measurements']['euclip']['samples_per_s']:.0f} | "
                           + (f"{result['measurements']['openclip']['samples_per_s']:.0f} | {speed['median']:.2f} "
                              f"({speed['min']:.2f}-{speed['max']:.2f}) |" if speed else "- | - |"))
    if benches:
        lines += ["", "euclip bench train: both trainers on the same shards in interleaved rounds", "",
                  "| bench | arch | euclip samples/s | OpenCLIP samples/s | euclip / OpenCLIP (rounds) |",
                  "|---|---|---|---|---|", *benches]
    if memory:
        lines += ["", "Peak GPU memory against the plan (euclip train --plan, one GPU; the CUDA context is in "
                  "neither)", "", "| row | measured GiB | planned GiB | measured / planned |", "|---|---|---|---|"]
        for name, peak_mib, plan in memory:
            measured = peak_mib / 1024
            lines.append(f"| {name} | {measured:.2f} | {plan if plan is not None else '-'} | "
                         + (f"{measured / plan:.2f} |" if plan and measured else "- |"))
    with summary.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
