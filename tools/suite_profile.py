"""Where the test suite's seconds go, from one whole run: each test's setup, call and teardown (pytest's
``--durations=0`` report), summed per file, and how many of the suite's trainings were the same recipe on the
same world (the run folders its tests left, as --record-trainings wrote them down).

    python -m pytest -n 2 --dist loadfile --durations=0 --record-trainings TRAININGS --record-cpu CPU > LOG
    python tools/suite_profile.py LOG TRAININGS --cpu CPU > table.md

A training is counted by its run folder (config.json beside metrics.jsonl) left in a test's temporary folders;
two are "the same" when their configs agree in everything but how they log and the world's path. Runs written
elsewhere are not seen; a copy of a run (the same meta.json) counts once.

With --cpu (what --record-cpu wrote): the CPU seconds of each file and test (its worker's and those of the child
processes it waited for), which the other worker crowding the cores does not stretch as it stretches their wall
seconds, and for the longest tests what the other worker ran beside them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

# "12.34s call     tests/test_x.py::test_y[param]"
DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*)$")
# Keys that say how a run logs, not what it trains.
LOGGING = {("train", "checkpoints"), ("train", "log_every"), ("train", "tensorboard")}


def durations(log: Path) -> dict[str, dict[str, float]]:
    """{test id: {"setup"|"call"|"teardown": seconds}} from pytest's --durations=0 lines."""
    tests: dict[str, dict[str, float]] = defaultdict(dict)
    for line in log.read_text(errors="replace").splitlines():
        match = DURATION.match(line.strip())
        if match:
            seconds, when, test = match.groups()
            tests[test][when] = tests[test].get(when, 0.0) + float(seconds)
    return dict(tests)


def trainings(record: Path) -> list[tuple[str, str, int, str]]:
    """(geometry/arch, key of what was trained, steps, test) for each run ``--record-trainings`` wrote down, each
    run once (its copies and the lines of several workers share its meta.json's digest)."""
    found, seen = [], set()
    for line in record.read_text().splitlines():
        entry = json.loads(line)
        if entry["run"] in seen:
            continue
        seen.add(entry["run"])
        config = entry["config"]
        what = {section: {k: v for k, v in values.items() if (section, k) not in LOGGING}
                for section, values in config.items() if isinstance(values, dict)}
        what.get("data", {}).pop("train_dir", None)  # the world: the suite's shared one, or a test's own
        key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:10]
        label = f"{config.get('geometry', {}).get('name', '?')}/{config.get('model', {}).get('arch', '?')}"
        found.append((label, key, entry["steps"] or 0, entry["test"].split("[")[0]))
    return found


def cpu_records(record: Path) -> list[dict]:
    """One dict per test as --record-cpu wrote it (test, worker, start, stop, cpu_self, cpu_children)."""
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def beside(test: dict, records: list[dict]) -> str:
    """The test of another worker that overlapped ``test`` longest, with the seconds they overlapped."""
    best, seconds = "", 0.0
    for other in records:
        if other["worker"] != test["worker"]:
            overlap = min(test["stop"], other["stop"]) - max(test["start"], other["start"])
            if overlap > seconds:
                best, seconds = other["test"], overlap
    return f"{best} ({seconds:.0f} s)" if best else "nothing"


def print_cpu(records: list[dict], top: int) -> None:
    span = max(r["stop"] for r in records) - min(r["start"] for r in records)
    cpu = sum(r["cpu_self"] + r["cpu_children"] for r in records)
    workers = sorted({r["worker"] for r in records})
    busy = {w: sum(r["stop"] - r["start"] for r in records if r["worker"] == w) for w in workers}
    print(f"\nCPU: {cpu:,.0f} s over {span:,.0f} s of wall from the first test's start to the last one's end "
          f"({cpu / span:.0%} of one core); each worker busy in tests for " +
          ", ".join(f"{w} {busy[w]:,.0f} s" for w in workers) + " (the rest: between tests, and idle at the end)\n")
    per_file: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        name = r["test"].split("::")[0]
        per_file[name]["wall"] += r["stop"] - r["start"]
        per_file[name]["self"] += r["cpu_self"]
        per_file[name]["children"] += r["cpu_children"]
    print("| file | wall s | CPU s (worker) | CPU s (children) | CPU s | CPU / wall |\n|---|---:|---:|---:|---:|---:|")
    for name, c in sorted(per_file.items(), key=lambda kv: -(kv[1]["self"] + kv[1]["children"])):
        total = c["self"] + c["children"]
        if total >= 5:
            print(f"| {name} | {c['wall']:.0f} | {c['self']:.0f} | {c['children']:.0f} | {total:.0f} | "
                  f"{total / max(c['wall'], 1e-9):.2f} |")
    print(f"\nThe {top} tests of most CPU, and the other worker's test that ran beside each longest:\n")
    print("| test | wall s | CPU s | beside it |\n|---|---:|---:|---|")
    for r in sorted(records, key=lambda r: -(r["cpu_self"] + r["cpu_children"]))[:top]:
        print(f"| {r['test']} | {r['stop'] - r['start']:.1f} | {r['cpu_self'] + r['cpu_children']:.1f} | "
              f"{beside(r, records)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="pytest's output with --durations=0")
    parser.add_argument("trainings", type=Path, nargs="?", help="the file --record-trainings wrote")
    parser.add_argument("--top", type=int, default=40, help="tests listed by their seconds")
    parser.add_argument("--cpu", type=Path, help="the file --record-cpu wrote")
    args = parser.parse_args()

    tests = durations(args.log)
    per_file: dict[str, Counter] = defaultdict(Counter)
    for test, parts in tests.items():
        for when, seconds in parts.items():
            per_file[test.split("::")[0]][when] += seconds
    total = sum(sum(c.values()) for c in per_file.values())
    print(f"{len(tests)} tests, {total:,.0f} s summed over setup, call and teardown\n")
    print("| file | setup s | call s | teardown s | total s |\n|---|---:|---:|---:|---:|")
    for name, c in sorted(per_file.items(), key=lambda kv: -sum(kv[1].values())):
        if sum(c.values()) >= 5:
            print(f"| {name} | {c['setup']:.0f} | {c['call']:.0f} | {c['teardown']:.0f} | {sum(c.values()):.0f} |")
    print(f"\nThe {args.top} longest tests (setup + call + teardown):\n")
    print("| test | setup s | call s | total s |\n|---|---:|---:|---:|")
    for test, parts in sorted(tests.items(), key=lambda kv: -sum(kv[1].values()))[:args.top]:
        print(f"| {test} | {parts.get('setup', 0):.1f} | {parts.get('call', 0):.1f} | {sum(parts.values()):.1f} |")
    if args.cpu:
        print_cpu(cpu_records(args.cpu), args.top)
    if args.trainings:
        runs = trainings(args.trainings)
        same = Counter(key for _, key, _, _ in runs)
        repeated = {key: n for key, n in same.items() if n > 1}
        print(f"\n{len(runs)} trainings left run folders; {len(same)} distinct configs; "
              f"{sum(repeated.values())} of them in {len(repeated)} groups trained the same thing more than once:\n")
        print("| what | trainings | steps | tests |\n|---|---:|---:|---|")
        for key, n in sorted(repeated.items(), key=lambda kv: -kv[1]):
            rows = [r for r in runs if r[1] == key]
            steps = sorted({r[2] for r in rows})
            folders = sorted({r[3] for r in rows})
            print(f"| {rows[0][0]} ({key}) | {n} | {', '.join(map(str, steps))} | {', '.join(folders)} |")


if __name__ == "__main__":
    main()
