"""A finished study's numbers: each run's metrics and measures, their estimates over seeds, the paired
differences, the claims' verdicts, the noise floor and the temperature curves.

Every number comes from the runs' own files (``eval.jsonl``, ``metrics.jsonl``,
``analysis/*.json``) through ``euclip_cli.stats``.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Callable, Iterable, Optional

from euclip_cli import config as C
from euclip_cli import stats
from euclip_cli.protocol.aggregate import aggregate
from euclip_cli.protocol.tasks import HARD_NEGATIVES, TASKS, averaged, select
from euclip_cli.rundir import TRAINING_RECORD, RunDir, iter_jsonl, read_json
from euclip_cli.study.jobs import RunPlan
from euclip_cli.study.spec import Claim, Study
from euclip_cli.study.tables import COMPOSITION_MEASURES, CONVERGED_WITHIN, GROUP_METRICS
from euclip_cli.study.verdicts import AT_INIT, evaluate_claims, learning, regime
from euclip_cli.worlddir import WorldDir


def run_values(p: RunPlan, tasks: list[str]) -> dict[str, float]:
    """Every metric of one run, in points (eval) or as measured: tasks, groups, average, measures."""
    run = RunDir(p.run_dir)
    results = run.latest_results()
    values = {}
    for line in results:
        if line["key"] in tasks and line["metrics"].get("main_metric") is not None:
            values[line["key"]] = 100 * line["metrics"]["main_metric"]
        if line["key"] == HARD_NEGATIVES and line["key"] in tasks:
            values.update({metric: 100 * line["metrics"][key] for metric, key in COMPOSITION_MEASURES.items()
                           if line["metrics"].get(key) is not None})
    agg = aggregate(results, "world")
    for group in GROUP_METRICS:
        if agg.get(group) is not None:
            values[group] = 100 * agg[group]
    for at_init, key in ((False, "text_nearer_root"), (True, "text_nearer_root" + AT_INIT)):
        if run.distances_file(at_init=at_init).exists():
            values[key] = read_json(run.distances_file(at_init=at_init))["auc_text_closer"]
    if run.hierarchy_file.exists():
        found = read_json(run.hierarchy_file)
        shapes = found["tasks"].get(HIERARCHY_TASK)
        if shapes is not None:
            # A run without a mistake has no mistake TIE; an analysis older than the measure, none either.
            values.update({metric: shapes[key] for metric, key in HIERARCHY_MEASURES.items()
                           if shapes.get(key) is not None})
        scores = found.get("entailment", {}).get("text-image", {})
        values.update({metric: scores[s]["roc_auc"] for metric, s in ENTAILMENT_MEASURES.items() if s in scores})
        pool = found.get("entailment", {}).get("caption-image", {})
        values.update({metric: pool[s]["roc_auc"] for metric, s in POOL_MEASURES.items() if s in pool})
        order = found.get("order", {})
        values.update({metric: order[s]["roc_auc"] for metric, s in ORDER_MEASURES.items() if s in order})
    last = run.last_training_record()
    cfg = C.run_config(run) if last else None
    if last and "logit_scale" in last:
        # β starts at exp(t0), capped at logit_scale_max after the first step.
        values["temperature_init"] = min(math.exp(C.initial_logit_scale(cfg)), cfg.geometry.logit_scale_max)
        values["temperature_final"] = last["logit_scale"]
        values["temperature_converged_step"] = converged_step(
            ((r["step"], r["logit_scale"]) for r in iter_jsonl(run.metrics_file, TRAINING_RECORD) if "logit_scale" in r),
            last["logit_scale"])
    if last and "curvature" in last:
        values["curvature_init"] = cfg.geometry.curvature_init
        values["curvature_final"] = last["curvature"]
        values["curvature_fall"] = cfg.geometry.curvature_init - last["curvature"]
        values["curvature_fall" + AT_INIT] = 0.0  # by definition: the curvature has not moved yet
    return values


def seed_rows(p: RunPlan, values: dict[str, float], tasks: list[str]) -> list[dict]:
    """One run's values as seeds.csv rows (config, seed, metric, value), every number the study's
    tables are computed from; a task's row carries a digest of its per-example outcomes as the eval
    line keeps them (``protocol.hits``), so that a rerun can be checked against the same images' answers."""
    hits = {line["key"]: line["hits"] for line in RunDir(p.run_dir).latest_results()
            if line["key"] in tasks and "hits" in line}
    return [{"config": p.config, "seed": p.seed, "metric": metric, "value": value,
             "outcomes_sha256": hashlib.sha256(json.dumps(hits[metric], sort_keys=True).encode()).hexdigest()[:16]
             if metric in hits else ""} for metric, value in sorted(values.items())]


def converged_step(points: Iterable[tuple[int, float]], final: float, within: float = CONVERGED_WITHIN) -> int:
    """The first logged step from which the values of ``(step, value)`` ``points`` stay within ``within``
    (relative) of ``final``, the value they end at; read once, in constant memory.

    Sun and Li's Table 7 counts the step from which the temperature "changes less than 2% for an
    epoch"; the world's runs draw samples with replacement and have no epochs, so this asks that it
    stay within 2% of where it ends.
    """
    step, off = None, True  # off: the latest value seen lies farther than ``within`` (or none seen yet)
    for s, v in points:
        if abs(v - final) > within * abs(final):
            off = True
        elif off:
            step, off = s, False
    return step


# Points a training curve keeps for a figure (evenly spaced over a metrics.jsonl of any length).
CURVE_POINTS = 1000
# The hierarchy metrics a study reads from each run's ``analyze hierarchy`` (hierarchy), on the
# world's main shapes task: study metric -> the analysis's name.
HIERARCHY_TASK = "world/shapes"
HIERARCHY_MEASURES = {"shapes_tie": "tie", "shapes_jaccard": "jaccard", "shapes_h_precision": "h_precision",
                      "shapes_mistake_tie": "mistake_tie", "shapes_random_mistake_tie": "random_mistake_tie"}
# Entailment as a score, family captions over the Shapes images (ROC AUC): study metric -> score.
ENTAILMENT_MEASURES = {"family_similarity_auc": "similarity", "family_cone_auc": "cone"}
# The world's caption pool over the retrieval images, each pair related where the caption is true (ROC AUC).
POOL_MEASURES = {"pool_similarity_auc": "similarity", "pool_cone_auc": "cone"}
# The world's caption pairs at every level against their reverses (ROC AUC): study metric -> score.
ORDER_MEASURES = {"caption_root_order_auc": "root_order", "caption_cone_order_auc": "cone"}
RUN_MEASURES = ("text_nearer_root", "text_nearer_root" + AT_INIT, "curvature_final", "temperature_final",
                "temperature_converged_step", *HIERARCHY_MEASURES, *ENTAILMENT_MEASURES, *POOL_MEASURES,
                *ORDER_MEASURES, *COMPOSITION_MEASURES)


def with_groups(values: dict[str, float], combine: Callable[[list[float]], float]) -> dict[str, float]:
    """Per-task values of the world's tasks with those of the group means and the average built from
    them (as ``aggregate`` groups them), ``combine(members' values)``, added where every member has one."""
    world_tasks = averaged("world")
    for group in GROUP_METRICS:
        members = [t.key for t in world_tasks if group == "average" or t.group == group]
        if members and all(k in values for k in members):
            values[group] = combine([values[k] for k in members])
    return values


def with_group_errors(errors: dict[str, float]) -> dict[str, float]:
    """Sampling errors, grouped: a mean of k tasks, each on its own evaluation set, has the root sum of
    their squared errors over k."""
    return with_groups(errors, lambda members: sum(e ** 2 for e in members) ** 0.5 / len(members))


def ceilings(plans: list[RunPlan], tasks: list[str], world: Optional[Path] = None) -> dict[str, float]:
    """The best score (points) any model can expect on each world task the study evaluates
    (``world_files.task_ceiling``), and on the group means and the average built from them (the mean
    of their members'); empty where the tasks are not the world's or no run names a generated world."""
    from euclip_cli.data.world_files import task_ceiling

    if world is None:
        run = next((RunDir(p.run_dir) for p in plans if RunDir(p.run_dir).config_file.exists()), None)
        world = C.world_dir(C.run_config(run)) if run else None
    if world is None or not WorldDir(world).manifest_file.exists():
        return {}
    values = {key: 100 * task_ceiling(WorldDir(world).eval, key.split("/", 1)[1])
              for key in tasks if TASKS[key].suite == "world" and TASKS[key].main_metric is not None}
    return with_groups(values, statistics.mean)


def sampling_errors(p: RunPlan, tasks: list[str], world: Optional[Path] = None) -> dict[str, float]:
    """The evaluation sampling error (points) of each world task's main metric in one run, and of
    the group means and the average built from them; empty where the run's tasks are not the
    world's or its world has no manifest.

    Accuracy is a proportion of the world's ``eval_size`` images (``stats.binomial_se``). Retrieval's
    mean R@1 averages text-to-image R@1 over the captions (``RETRIEVAL_LEVELS`` per image) and
    image-to-text R@1 over the images; the two directions are treated as independent. A mean of k
    tasks, each on its own evaluation set, has the root sum of their squared errors over k.
    """
    from euclip_cli.data.world_tasks import RETRIEVAL_LEVELS

    run = RunDir(p.run_dir)
    if world is None and not run.config_file.exists():
        return {}
    found = WorldDir(world or C.world_dir(C.run_config(run))).manifest()
    if found is None:
        return {}
    images = int(found["eval_size"])
    errors: dict[str, float] = {}
    for line in run.latest_results():
        key, m = line["key"], line["metrics"]
        if key not in tasks or TASKS[key].suite != "world" or m.get("main_metric") is None:
            continue
        if TASKS[key].kind == "retrieval":
            t2i = stats.binomial_se(m["image_retrieval_recall@1"], images * len(RETRIEVAL_LEVELS))
            i2t = stats.binomial_se(m["text_retrieval_recall@1"], images)
            errors[key] = 100 * (t2i ** 2 + i2t ** 2) ** 0.5 / 2
        else:
            errors[key] = 100 * stats.binomial_se(m["main_metric"], images)
    return with_group_errors(errors)


def paired_sampling_errors(p: RunPlan, base: RunPlan, tasks: list[str]) -> dict[str, float]:
    """The evaluation sampling error (points) of run ``p``'s score minus run ``base``'s, both scored on the
    same examples, for each world task both have per-example outcomes of (``protocol.hits``), and for the
    group means and the average built from them: ``stats.paired_proportion_se`` per direction, retrieval's
    mean R@1 as half the root sum of its two directions' squares, a mean of k tasks as the root sum of
    their squares over k (each task its own examples)."""
    from euclip_cli.protocol.hits import unpack_hits

    lines = [{line["key"]: line for line in RunDir(plan.run_dir).latest_results()} for plan in (p, base)]
    errors: dict[str, float] = {}
    for key in tasks:
        if TASKS[key].suite != "world" or not all("hits" in by_key.get(key, {}) for by_key in lines):
            continue
        ours, theirs = (by_key[key]["hits"] for by_key in lines)
        names = {"retrieval": ("image_retrieval_recall@1", "text_retrieval_recall@1"),
                 "selection": ("acc",)}.get(TASKS[key].kind, ("acc1",))
        if not all(name in ours and name in theirs and ours[name]["n"] == theirs[name]["n"] for name in names):
            continue
        per_name = [stats.paired_proportion_se(unpack_hits(ours[name]), unpack_hits(theirs[name])) for name in names]
        errors[key] = 100 * math.sqrt(sum(se ** 2 for se in per_name)) / len(names)
    return with_group_errors(errors)


# The evaluation-size curve: Shapes scored on the whole evaluation set and on its first half, quarter and
# eighth (the world writes its images in random order, so each is a random subset), down to no fewer images
# than this: below it a 12-class task has a handful of images per class.
EVAL_SIZE_TASK = "world/shapes"
EVAL_SIZE_FRACTIONS = (1, 2, 4, 8)
EVAL_SIZE_MIN = 60


def evaluation_size_curve(study: Study, plans: list[RunPlan]) -> list[dict]:
    """How a verdict's precision depends on the evaluation set's size, measured rather than modelled: for
    each size, each configuration's difference to its seed's baseline run on the same first images, its
    standard deviation over seeds (median over configurations, of those with two seeds or more) and its
    evaluation sampling error (``stats.paired_proportion_se``, median over pairs), in points, read from
    the runs' per-image outcomes on ``EVAL_SIZE_TASK``; empty where the runs have none (``euclip eval --again``
    writes them for runs evaluated by an older euclip)."""
    from euclip_cli.protocol.hits import unpack_hits

    right: dict[tuple[str, int], list[bool]] = {}
    for p in plans:
        line = next((line for line in RunDir(p.run_dir).latest_results() if line["key"] == EVAL_SIZE_TASK),
                    None) if p.run_dir.exists() else None
        if line and "acc1" in line.get("hits", {}):
            right[(p.config, p.seed)] = unpack_hits(line["hits"]["acc1"])
    base = {seed: hits for (config, seed), hits in right.items() if config == study.baseline}
    pairs = {config: [(hits, base[seed]) for (c, seed), hits in right.items() if c == config and seed in base]
             for config in study.configs if config != study.baseline}
    if not base or not any(pairs.values()) or len({len(h) for h in right.values()}) != 1:
        return []
    images = len(next(iter(right.values())))
    rows = []
    for fraction in EVAL_SIZE_FRACTIONS:
        size = images // fraction
        if size < EVAL_SIZE_MIN:
            break
        sds, errors = [], []
        for config_pairs in pairs.values():
            deltas = [100 * (sum(a[:size]) - sum(b[:size])) / size for a, b in config_pairs]
            if len(deltas) >= 2:
                sds.append(statistics.stdev(deltas))
            errors += [100 * stats.paired_proportion_se(a[:size], b[:size]) for a, b in config_pairs]
        rows.append({"metric": EVAL_SIZE_TASK, "images": size, "configs": len(sds),
                     "paired_sd_median": statistics.median(sds) if sds else None,
                     "paired_sampling_se_median": statistics.median(errors)})
    return rows


def summarize(study: Study, plans: list[RunPlan], claims: list[Claim], world: Optional[Path] = None) -> dict:
    """``{"rows": study.csv rows, "claims": claims.csv rows, "noise": noise.csv rows, "seeds": [...],
    "per_seed": seeds.csv rows,
    "temperature": temperature_curves(...)}``."""
    tasks = [t.key for t in select(study.tasks)]
    by_config: dict[str, dict[int, dict[str, float]]] = {}
    errors: dict[str, list[float]] = {}
    paired_errors: dict[str, list[float]] = {}
    baseline = {p.seed: p for p in plans if p.config == study.baseline and p.run_dir.exists()}
    per_seed = []
    for p in plans:
        if p.run_dir.exists():
            by_config.setdefault(p.config, {})[p.seed] = run_values(p, tasks)
            per_seed += seed_rows(p, by_config[p.config][p.seed], tasks)
            for metric, se in sampling_errors(p, tasks, world).items():
                errors.setdefault(metric, []).append(se)
            if p.config != study.baseline and p.seed in baseline:
                for metric, se in paired_sampling_errors(p, baseline[p.seed], tasks).items():
                    paired_errors.setdefault(metric, []).append(se)
    eval_size = evaluation_size_curve(study, plans)
    rows, reading, claims_read = tabulate(study, claims, by_config, eval_size)
    return {"rows": rows, "claims": claims_read, "seeds": list(study.seeds), "per_seed": per_seed, "regime": reading,
            "noise": noise_floor(rows, [*GROUP_METRICS, *tasks], errors, paired_errors, ceilings(plans, tasks, world)),
            "eval_size": eval_size,
            "temperature": temperature_curves(study, plans)}


def tabulate(study: Study, claims: list[Claim], by_config: dict[str, dict[int, dict[str, float]]],
             eval_size: list[dict]) -> tuple[list[dict], dict, list[dict]]:
    """``(study.csv rows, regime.json, claims.csv rows)`` from the runs' values (``by_config``: config ->
    seed -> metric -> value, as seeds.csv holds them) and the evaluation-size curve (its full size is the
    images a run's main score was counted on): each configuration's metrics over seeds with the paired
    difference to the baseline, its main row with whether it learned (``verdicts.learning``), the regime,
    and the claims, those involving a configuration that did not learn set aside."""
    tasks = [t.key for t in select(study.tasks)]
    metrics = [*GROUP_METRICS, *tasks]
    chance = main_chance(tasks)
    main_tasks = [k for k in tasks if TASKS[k].group == "main"]
    images = max((r["images"] for r in eval_size if main_tasks == [r["metric"]]), default=None)
    rows = []
    for config in study.configs:
        seeds = by_config.get(config, {})
        for metric in metrics + list(RUN_MEASURES):
            values = {s: v[metric] for s, v in seeds.items() if metric in v}
            if not values:
                continue
            est = stats.estimate(list(values.values()), study.interval)
            row = {"config": config, "metric": metric, "n_seeds": est.n, "mean": est.mean, "sd": est.sd,
                   "ci_low": est.low, "ci_high": est.high, "interval": study.interval,
                   "paper": study.configs[config].paper or ""}
            if config != study.baseline and metric in metrics:
                base = {s: v[metric] for s, v in by_config.get(study.baseline, {}).items() if metric in v}
                diff = stats.paired_difference(values, base, study.interval)
                if diff is not None:
                    row.update(diff_mean=diff.mean, diff_sd=diff.sd, diff_low=diff.low, diff_high=diff.high,
                               diff_n=diff.n)
            if metric == "main" and chance is not None:
                row.update(learning(values, chance, images))
            rows.append(row)
    reading = regime(study, by_config)
    return rows, reading, evaluate_claims(study, claims, by_config, reading, stats.did_not_learn(rows))


def main_chance(tasks: list[str]) -> Optional[float]:
    """Uniform guessing's score on the main group (points): the mean over its tasks of 100 / classes;
    None where one of them is not a world classification task (whose classes the world states)."""
    from euclip_cli.data.world_tasks import WORLD_TASKS

    classes = {f"world/{t.name}": t.classes for t in WORLD_TASKS}
    main = [k for k in tasks if TASKS[k].group == "main"]
    if not main or not all(classes.get(k) for k in main):
        return None
    return statistics.fmean(100 / len(classes[k]) for k in main)


def temperature_curves(study: Study, plans: list[RunPlan]) -> dict:
    """The learned temperature over training, for Sun and Li's Figure 3: ``{"curves": {config:
    {seed: [(step, beta), ...]}}, "panels": {geometry: [config, ...]}}``, one panel per geometry
    and logit (configurations differing in initialisation, noise or structure share one)."""
    curves: dict[str, dict[int, list[tuple[int, float]]]] = {}
    for p in plans:
        records = RunDir(p.run_dir).training_records(CURVE_POINTS) if p.run_dir.exists() else []
        points = [(r["step"], r["logit_scale"]) for r in records if "logit_scale" in r]
        if points:
            curves.setdefault(p.config, {})[p.seed] = points
    panels: dict[str, list[str]] = {}
    for name, spec in study.configs.items():
        if name in curves:
            cfg = C.load_config(spec.recipe, study.overrides(name, 0))
            panels.setdefault(f"{cfg.geometry.name} ({C.resolved_logit(cfg)})", []).append(name)
    return {"curves": curves, "panels": panels}


def noise_floor(rows: list[dict], metrics: list[str], errors: dict[str, list[float]],
                paired_errors: Optional[dict[str, list[float]]] = None,
                ceiling: Optional[dict[str, float]] = None) -> list[dict]:
    """Per metric: the seed standard deviation (median and range over configurations), the standard
    deviation of the paired differences to the baseline (median over configurations), the evaluation
    sampling error of one run's score (median over runs) and of one run's difference to its seed's
    baseline run on the same examples (median over those pairs), all in points. The last, squared over
    the paired sd squared, is the share of a verdict's spread that more evaluation examples would remove.
    Beside them, the metric's ``ceiling`` where known (points): a score near it has little room to differ.
    A task that is its group's only member (Shapes is the world's main group) appears once, under the
    group's name."""
    paired_errors = paired_errors or {}
    alone = {}
    for task in TASKS.values():
        alone.setdefault((task.suite, task.group), []).append(task.key)
    out = []
    for metric in metrics:
        task = TASKS.get(metric)
        if task is not None and task.group and len(alone[(task.suite, task.group)]) == 1:
            continue
        sds = sorted(r["sd"] for r in rows if r["metric"] == metric and r["sd"] is not None)
        paired = [r["diff_sd"] for r in rows if r["metric"] == metric and r.get("diff_sd") is not None]
        if not sds:
            continue
        out.append({"metric": metric, "seed_sd_median": statistics.median(sds), "seed_sd_min": sds[0],
                    "seed_sd_max": sds[-1], "configs": len(sds),
                    "paired_sd_median": statistics.median(paired) if paired else None,
                    "sampling_se_median": statistics.median(errors[metric]) if errors.get(metric) else None,
                    "paired_sampling_se_median": (statistics.median(paired_errors[metric])
                                                  if paired_errors.get(metric) else None),
                    "ceiling": (ceiling or {}).get(metric)})
    return out
