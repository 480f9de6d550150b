"""Group means of per-task main metrics, as DataComp's ``aggregate_scores.py`` computes them."""

from __future__ import annotations

from statistics import mean
from typing import Optional

from euclip_cli.protocol.tasks import GROUPS, TASKS, averaged


def aggregate(results: list[dict], suite: str) -> dict[str, Optional[float]]:
    """``{main, shifts, attributes, retrieval, average}`` from eval.jsonl lines (fractions in [0, 1]).

    Lines whose ``main_metric`` is null are dropped, as DataComp drops FairFace and UTKFace, and so are the
    tasks outside the average (``averaged``). A group (or the average) with any task missing is None: a
    partial mean would mislead.
    """
    scores = {r["key"]: r["metrics"].get("main_metric") for r in results if r["key"] in TASKS}
    scores = {k: v for k, v in scores.items() if v is not None}
    tasks = averaged(suite)
    out: dict[str, Optional[float]] = {}
    for group in GROUPS:
        members = [t.key for t in tasks if t.group == group]
        out[group] = mean(scores[k] for k in members) if members and all(k in scores for k in members) else None
    everything = [t.key for t in tasks]
    out["average"] = mean(scores[k] for k in everything) if all(k in scores for k in everything) else None
    out["tasks_done"] = sum(k in scores for k in everything)
    out["tasks_total"] = len(everything)
    return out


def suite_line(results: list[dict], suite: str) -> Optional[str]:
    """``suite``'s groups and average in one line ("world (10/10 tasks): main 0.4321, ..."), None when no task of
    it is scored: what ``euclip eval`` prints and a model card lists."""
    agg = aggregate(results, suite)
    if not agg["tasks_done"]:
        return None
    parts = [f"{k} {'missing' if v is None else f'{v:.4f}'}" for k, v in agg.items()
             if k in ("main", "shifts", "attributes", "retrieval", "average")]
    return f"{suite} ({agg['tasks_done']}/{agg['tasks_total']} tasks): " + ", ".join(parts)
