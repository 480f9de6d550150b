"""A study's claims decided: each read against the published table of the study's own regime, with
controls for measured properties and a family-wise adjustment (Holm's) within the primary claims
and within the rest.

Pure functions of the runs' values (``runner.run_values``): no training, no files written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from euclip_cli import config as C
from euclip_cli import stats
from euclip_cli.data.datacomp import BATCH, SCALES, scale_for_steps
from euclip_cli.optim import summed_lr
from euclip_cli.study.spec import Claim, Study

LEVEL = 0.95
# The suffix of a measure's value on the untrained model, in a run's values.
AT_INIT = "_init"
SUN_LI = "Sun and Li (YFCC-15M)"
HYCOCLIP = "HyCoCLIP (GRIT, 384M samples)"
LAION_GRID = "LAION's grid (DataComp-1.4B)"


@dataclass(frozen=True)
class PaperEffect:
    """A published difference a claim is read against: ``effect`` None where the source gives a
    direction only."""

    scale: str  # small | medium (EuCLIP's DataComp scales), SUN_LI, HYCOCLIP or LAION_GRID
    table: str  # e.g. "Table 8 (small)"
    effect: Optional[float]
    source: str


def paper_effects(claim: Claim) -> list[PaperEffect]:
    """Every published result the claim names, in the claims file's order."""
    from euclip_cli.published import euclip_imagenet, euclip_tables

    out = []
    for ref in claim.paper:
        if ref.get("source") == "sun-li":
            out.append(_sun_li_effect(claim, ref))
            continue
        if ref.get("source") == "hycoclip":
            out.append(_hycoclip_effect(ref))
            continue
        if ref.get("source") == "laion-grid":
            out.append(_laion_grid_effect(ref))
            continue
        table, model = ref["table"], ref["model"]
        high, low = (euclip_imagenet(table, model, ref[k]) for k in ("higher", "lower"))
        rows = euclip_tables()
        scale = str(rows.loc[rows["table"] == table, "scale"].iloc[0])
        out.append(PaperEffect(scale, f"Table {table} ({scale})", high - low,
                               f"Table {table} {model}: {ref['higher']} {high:.2f} vs {ref['lower']} {low:.2f} ImageNet"))
    return out


def _sun_li_effect(claim: Claim, ref: dict) -> PaperEffect:
    from euclip_cli.published import sun_li_temperature

    if "higher" not in ref:  # a claim of the text, with no published row
        return PaperEffect(SUN_LI, "Sun and Li", None, f"Sun and Li, {ref['where']}: a direction, no value")
    rows = sun_li_temperature()
    high, low = rows.loc[ref["higher"]], rows.loc[ref["lower"]]
    table = f"Sun and Li Table {high['table']}"
    if claim.metric == "temperature_final":
        # The paper's temperatures are printed in units it leaves ambiguous (the CSV's source line):
        # they give the direction, not an effect in our β.
        return PaperEffect(SUN_LI, table, None, f"{table}: {ref['higher']} {high['temp_final']:.3f} vs {ref['lower']} "
                                                f"{low['temp_final']:.3f}, final temperature as printed")
    return PaperEffect(SUN_LI, table, high["zero_shot"] - low["zero_shot"],
                       f"{table}: {ref['higher']} {high['zero_shot']:.2f} vs {ref['lower']} {low['zero_shot']:.2f} "
                       f"ImageNet zero-shot")


def _hycoclip_effect(ref: dict) -> PaperEffect:
    """A difference between two of HyCoCLIP's released models of one arch ({source = "hycoclip", arch, higher,
    lower}), in zero-shot ImageNet accuracy as its model zoo states it."""
    from euclip_cli.published import hycoclip_imagenet

    high, low = (hycoclip_imagenet(ref["arch"], ref[k]) for k in ("higher", "lower"))
    table = f"HyCoCLIP model zoo {ref['arch']}"
    return PaperEffect(HYCOCLIP, table, high - low,
                       f"{table}: {ref['higher']} {high:.1f} vs {ref['lower']} {low:.1f} ImageNet zero-shot")


def _laion_grid_effect(ref: dict) -> PaperEffect:
    """A difference between two cells of LAION's grid at one image tower and samples seen ({source =
    "laion-grid", arch, samples_seen, higher, lower}), in zero-shot ImageNet accuracy. A cell at a DataComp
    scale's samples seen is that scale's published result, so a study reads the one of its own regime."""
    from euclip_cli.published import grid_samples, laion_grid_imagenet

    samples = ref["samples_seen"]
    high, low = (laion_grid_imagenet(ref["arch"], ref[k], samples) for k in ("higher", "lower"))
    scale = next((name for name, s in SCALES.items() if s.pool == grid_samples(samples)), LAION_GRID)
    table = f"LAION grid {ref['arch']} {samples}"
    return PaperEffect(scale, table, high - low,
                       f"{table}: {ref['higher']} {high:.1f} vs {ref['lower']} {low:.1f} ImageNet, best of a sweep")


def read_against(effects: list[PaperEffect], scale: str) -> tuple[Optional[PaperEffect], list[PaperEffect]]:
    """``(the result of the study's regime, the others)``: the one at ``scale``, else the first
    (Sun and Li's, or a table the paper gives at one scale only)."""
    if not effects:
        return None, []
    primary = next((e for e in effects if e.scale == scale), effects[0])
    return primary, [e for e in effects if e is not primary]


# ------------------------------------------------------------------ the regime

def regime(study: Study, by_config: dict[str, dict[int, dict[str, float]]]) -> dict:
    """The study's budget (from the baseline's config) and the published scale it is read against,
    beside that scale's own budget (its recipe, ``{scale}-clip``), with how far each configuration's
    learnable scalars moved (mean over seeds). ``paper_regime``: whether the study ran the paper's own
    regime (its data and samples seen), the only place a claim can be "reproduced"."""
    cfg = C.load_config(study.configs[study.baseline].recipe, study.overrides(study.baseline, 0))
    steps = C.total_steps(cfg)
    scale = scale_for_steps(steps)
    paper = C.load_config(f"{scale}-clip")
    paper_steps = C.total_steps(paper)
    budgets = {name: C.total_steps(C.load_config(spec.recipe, study.overrides(name, 0)))
               for name, spec in study.configs.items()}
    scalars = []
    for config, seeds in by_config.items():
        for scalar, label in (("temperature", "β"), ("curvature", "curvature")):
            init = [v[f"{scalar}_init"] for v in seeds.values() if f"{scalar}_init" in v and f"{scalar}_final" in v]
            final = [v[f"{scalar}_final"] for v in seeds.values() if f"{scalar}_init" in v and f"{scalar}_final" in v]
            if not init:
                continue
            start, end = sum(init) / len(init), sum(final) / len(final)
            moved = abs(end - start) / abs(start) if start else math.inf
            scalars.append({"config": config, "scalar": label, "init": start, "final": end, "relative_change": moved,
                            "frozen": moved < stats.FROZEN_BELOW})
    samples = steps * cfg.data.batch_size
    return {"steps": steps, "batch_size": cfg.data.batch_size, "samples": samples,
            "summed_lr": summed_lr(cfg.optim.lr, cfg.optim.warmup_steps, steps), "scalar_lr_scale": cfg.optim.scalar_lr_scale,
            "scale": scale, "scale_steps": SCALES[scale].steps, "scale_batch": BATCH,
            "paper_samples": paper_steps * paper.data.batch_size,
            "paper_summed_lr": summed_lr(paper.optim.lr, paper.optim.warmup_steps, paper_steps),
            "paper_regime": cfg.data.dataset == paper.data.dataset and samples == paper_steps * paper.data.batch_size,
            "other_budgets": {n: s for n, s in budgets.items() if s != steps}, "scalars": scalars}


# ------------------------------------------------------------------ did it learn

def learning(scores: dict[int, float], chance: float, images: Optional[int]) -> dict:
    """Whether a configuration learned: its main score's excess over ``chance`` (points) over its seeds
    with a 95% interval that counts the evaluation set's sampling error (``stats.above_chance``), and how
    many of its runs score above chance on their own (Clopper and Pearson's 95% interval of the run's
    accuracy on its ``images`` excludes chance; None where the count is unknown). ``learned``: where the
    seeds' interval excludes 0 above, or every run's own interval excludes chance (few seeds give a wide
    interval to runs that each plainly learned); None where neither test can be made."""
    excess = stats.above_chance(list(scores.values()), chance, images)
    above = None
    if images:
        # A run's score is its share right of the evaluation images, in points, so it rounds back to a count.
        above = sum(1 for s in scores.values()
                    if 100 * stats.proportion_interval(round(s * images / 100), images)[0] > chance)
    if excess.low is None and above is None:
        learned = None
    else:
        learned = (excess.low is not None and excess.low > 0) or above == len(scores)
    return {"chance": chance, "above_chance": excess.mean, "above_chance_low": excess.low,
            "above_chance_high": excess.high, "learned": learned, "runs_above_chance": above, "images": images}


# ------------------------------------------------------------------ the claims

def claim_values(claim: Claim, by_config: dict[str, dict[int, dict[str, float]]]) -> tuple[dict[int, float], dict]:
    """``(per-seed effect, what it is made of)``. A comparison: ``higher - lower`` paired by seed. A
    measure: the change training made in ``config`` minus the change it made in ``control``, each
    change the trained value minus the untrained one, paired by seed."""
    if claim.kind == "compare":
        a = {s: v[claim.metric] for s, v in by_config.get(claim.higher, {}).items() if claim.metric in v}
        b = {s: v[claim.metric] for s, v in by_config.get(claim.lower, {}).items() if claim.metric in v}
        return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}, {}
    m, m0 = claim.measure, claim.measure + AT_INIT

    def measured(config: str) -> dict[int, tuple[float, float]]:
        return {s: (v[m], v[m0]) for s, v in by_config.get(config, {}).items() if m in v and m0 in v}

    cause, control = measured(claim.config), measured(claim.control)
    seeds = sorted(set(cause) & set(control))
    parts = {}
    for name, values in (("config", cause), ("control", control)):
        if seeds:
            parts[f"{name}_trained"] = sum(values[s][0] for s in seeds) / len(seeds)
            parts[f"{name}_init"] = sum(values[s][1] for s in seeds) / len(seeds)
    return {s: (cause[s][0] - cause[s][1]) - (control[s][0] - control[s][1]) for s in seeds}, parts


def families(study: Study, tested: list[Claim]) -> dict[str, str]:
    """Each tested claim's family: ``primary`` (declared in the study recipe before it ran) or
    ``secondary``; ``all`` where the study declares none."""
    if not study.primary:
        return {c.id: stats.ALL for c in tested}
    return {c.id: stats.PRIMARY if c.id in study.primary else stats.SECONDARY for c in tested}


def evaluate_claims(study: Study, claims: list[Claim], by_config: dict[str, dict[int, dict[str, float]]],
                    reading: dict, did_not_learn: frozenset[str] = frozenset()) -> list[dict]:
    """One row per claim the study tests (its configurations are the study's, and its metric one some run
    recorded): the effect with its raw 95% interval and its interval at
    Holm's level within its family (``families``: the claims with an interval, primary and secondary
    apart); read from the latter, the verdict on the claim's statement (``stats.verdict``; "not
    testable" where a configuration it involves is in ``did_not_learn``) and, apart from it, how the
    effect sits beside the published result of the study's scale (``reading``: ``regime``'s), with the
    seeds 80% power needs if the true effect were the paper's, and if it were the one measured here
    (each at the Bonferroni level of its family: Holm's level for the claim decided first, and a bound
    on the others')."""
    measured = {metric for seeds in by_config.values() for values in seeds.values() for metric in values}
    tested = [c for c in claims if all(name in study.configs for name in c.configs)
              and (c.metric if c.kind == "compare" else c.measure) in measured]
    values = {c.id: claim_values(c, by_config) for c in tested}
    family_of = families(study, tested)
    p_of = {c.id: stats.t_test_p(list(values[c.id][0].values())) for c in tested}
    levels, sizes = {}, {}
    for family in dict.fromkeys(family_of.values()):
        p_values = {c.id: p_of[c.id] for c in tested if family_of[c.id] == family and p_of[c.id] is not None}
        levels.update(stats.holm_levels(p_values, LEVEL))
        sizes[family] = len(p_values)
    out = []
    for claim in tested:
        per_seed, parts = values[claim.id]
        family = family_of[claim.id]
        adjusted = levels.get(claim.id, stats.family_level(LEVEL, sizes[family]))
        raw = stats.estimate(list(per_seed.values()), study.interval, LEVEL) if per_seed else None
        wide = stats.estimate(list(per_seed.values()), study.interval, adjusted) if per_seed else None
        primary, beside = read_against(paper_effects(claim), reading["scale"])
        published = primary.effect if primary else None
        # A source that gives a direction only gives the statement's (the claim is the paper's).
        paper_sign = None if primary is None else -1 if published is not None and published < 0 else +1
        metric = claim.metric if claim.kind == "compare" else claim.measure
        resolution = 10.0 ** -stats.claim_digits(metric)
        idle = [name for name in claim.configs if name in did_not_learn]
        planning = stats.family_level(LEVEL, sizes[family])
        seeds = stats.seeds_needed(raw.sd if raw else None, published, planning) if published else None
        if seeds is None and published and raw and raw.sd:
            seeds = math.inf  # more than stats.seeds_needed looks at
        # The same at the effect measured here: what a rerun with more seeds would need to settle it.
        here = stats.seeds_needed(raw.sd, raw.mean, planning) if raw and raw.sd is not None else None
        if here is None and raw and raw.sd:
            here = math.inf
        out.append({"claim": claim.id, "statement": claim.statement, "metric": metric,
                    "configs": " vs ".join(claim.configs) if claim.kind == "compare" else
                    f"{claim.config} (control {claim.control})",
                    "n_seeds": len(per_seed), "effect": raw.mean if raw else None,
                    "ci_low": raw.low if raw else None, "ci_high": raw.high if raw else None,
                    "p_value": p_of[claim.id], "family": family,
                    "family_size": sizes[family], "family_level": adjusted, "fw_low": wide.low if wide else None,
                    "fw_high": wide.high if wide else None, "margin": claim.margin,
                    "verdict": stats.NOT_TESTABLE if idle else stats.verdict(wide, claim.margin, published, resolution),
                    "not_learned": ", ".join(idle),
                    # A difference at the chance floor says no more of the paper's result than of the statement.
                    "paper": stats.NOT_TESTABLE if idle else
                    stats.beside_paper(wide, paper_sign, reading["paper_regime"], resolution),
                    "own": claim.own,
                    "read_against": primary.table if primary else "", "paper_effect": published,
                    "paper_source": primary.source if primary else "",
                    "beside": "; ".join(stats.paper_cell(e.effect, e.source) for e in beside),
                    "seeds_for_80pct_power": seeds, "seeds_for_80pct_power_here": here,
                    "interval": study.interval, **parts})
    # The primary family first, as declared; then the rest in the claims file's order.
    rank = {c: i for i, c in enumerate(study.primary)}
    return sorted(out, key=lambda r: rank.get(r["claim"], len(rank)))


# ------------------------------------------------------------------ how the claims read

def regime_lines(reading: dict, did_not_learn: frozenset[str] = frozenset()) -> list[str]:
    """The study's regime as study.md states it, beside the regime of the paper's scale it is read
    against, in numbers: samples seen, the summed learning rate (how far a log-parameterised scalar can
    travel) and how far each scalar did; a configuration that did not learn has its scalars marked, as
    no mechanism is read from them."""
    scaled = '' if reading['scalar_lr_scale'] == 1 else f", times the scalars' rate multiple {reading['scalar_lr_scale']:g}"
    lines = [f"{reading['steps']:,} steps of {reading['batch_size']} ({reading['samples']:,} samples seen); the "
             f"learning rates sum to {reading['summed_lr']:.3g} (a log-parameterised scalar moves at most about that "
             f"far{scaled}). The claims are read against the paper's {reading['scale']} scale "
             f"({reading['scale_steps']:,} steps of {reading['scale_batch']:,}): the largest published scale whose "
             f"steps the study reaches, else the smallest.", "",
             "| regime | samples seen | learning rates' sum |", "|---|---|---|",
             f"| this study | {reading['samples']:,} | {reading['summed_lr']:.3g} |",
             f"| the paper's {reading['scale']} scale | {reading['paper_samples']:,} | {reading['paper_summed_lr']:.3g} |",
             "", f"The paper's regime sees {reading['paper_samples'] / reading['samples']:,.0f} times the samples, "
                 f"with {reading['paper_summed_lr'] / reading['summed_lr']:.1f} times the learning rates' sum"
                 + (" (the same regime)." if reading["paper_regime"] else
                    ": no claim here is \"reproduced\", a word kept for the statement holding at a regime the paper ran.")]
    if reading["other_budgets"]:
        lines.append("Configurations with another budget: " + ", ".join(f"{n} {s:,} steps" for n, s in
                                                                         reading["other_budgets"].items()) + ".")
    if reading["scalars"]:
        lines += ["", "| config | scalar | initial | final | moved | |", "|---|---|---|---|---|---|"]
        for r in reading["scalars"]:
            notes = (["frozen"] if r["frozen"] else []) + (["did not learn"] if r["config"] in did_not_learn else [])
            lines.append(f"| {r['config']} | {r['scalar']} | {r['init']:.3g} | {r['final']:.3g} | "
                         f"{100 * r['relative_change']:.1f}% | {', '.join(notes)} |")
        lines += ["", f"\"frozen\": moved less than {stats.FROZEN_BELOW:.0%} of its initial value; the study says nothing "
                      f"about where it would settle. \"did not learn\": its runs stayed at chance, and its scalars are "
                      f"not read as a mechanism."]
    return lines
