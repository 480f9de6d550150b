"""A study's tables as files: study.csv, claims.csv, noise.csv, regime.json and study.md (the one
renderer of study.md; ``euclip report`` shows the same rows through ``report.tables``)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Optional

from euclip_cli import config as C
from euclip_cli.data.world_tasks import NEGATIVE_KINDS
from euclip_cli.protocol.tasks import GROUPS, HARD_NEGATIVES, SUITE_COLUMNS, TASKS
from euclip_cli.rundir import write_text_atomic
from euclip_cli.stats import (ALL, CLAIMS_HEADER, PRIMARY, SECONDARY, claim_cells, claim_sentence, config_table,
                               did_not_learn, learned_cell)
from euclip_cli.study.spec import Study
from euclip_cli.study.verdicts import regime_lines

GROUP_METRICS = (*GROUPS, "average")
# The world's hard negatives (``world_tasks.hard_negative``), in points: each kind's accuracy, and what the
# text-only baseline scores on the same pairs (the world's, alike for every run on it): study metric -> the
# eval line's metric.
COMPOSITION_MEASURES = {**{f"hard_negatives_{kind}": f"acc_{kind}" for kind in NEGATIVE_KINDS},
                        "hard_negatives_text_only": "text_only_acc",
                        **{f"hard_negatives_text_only_{kind}": f"text_only_acc_{kind}" for kind in NEGATIVE_KINDS}}
# What a study writes, in the order it writes them; ``--publish`` copies them.
PUBLISHED = ("study.csv", "claims.csv", "seeds.csv", "noise.csv", "eval_size.csv", "regime.json", "study.md")
CONVERGED_WITHIN = 0.02


def to_csv(rows: list[dict]) -> str:
    if not rows:
        return ""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _markdown(table: list[dict[str, str]]) -> list[str]:
    header = list(table[0]) if table else ["config"]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row[h] for h in header) + " |" for row in table)]


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def to_markdown(study: Study, summary: dict) -> str:
    """The study table (groups and average, mean ± sd and the paired difference to the baseline),
    the claims with verdicts, and the noise floor."""
    names = SUITE_COLUMNS["world"]
    interval = "Student's t" if study.interval == "t" else "percentile bootstrap"
    lines = [f"# Study {study.name}", "",
             f"Seeds {', '.join(map(str, summary['seeds']))}; zero-shot {study.tasks} tasks in %, as mean ± "
             f"standard deviation over seeds; Δ is the difference to `{study.baseline}` paired by seed, with its raw "
             f"95% interval over seeds ({interval}); \"learned\": whether the main score's interval excludes chance "
             f"(below).", ""]
    rows = {(r["config"], r["metric"]): r for r in summary["rows"]}
    idle = did_not_learn(summary["rows"])
    table = config_table(summary["rows"], list(study.configs), study.baseline, {m: names[m] for m in GROUP_METRICS})
    lines += _markdown(table)
    lines += learning_section(study, rows)
    lines += ["", "## Regime", "", *regime_lines(summary["regime"], idle)]
    lines += ["", "## Claims", "",
              "Each claim gets two readings from its family-wise interval: Holm's procedure within the claims' "
              "family (the primary claims the study recipe declares before it runs, and the rest apart), so that "
              "the chance of any wrong verdict in a family stays at most 5%; the interval's level is in brackets, "
              "beside the raw 95% one. \"statement\": what the interval says of the claim as stated (holds, "
              "opposite, undetermined, excludes the paper's effect); \"not testable\" where a configuration it "
              "involves did not learn. \"beside the paper\": apart from that, whether the effect has the sign of "
              "the published result of the nearest regime (the Regime section's numbers say how far that regime "
              "is). A measured property is credited with the change training made relative to its control's. "
              "The last column: the seeds needed to exclude 0 with 80% chance at the family's Bonferroni level if "
              "the true effect were the paper's, at the paired spread measured here (a yardstick: the paper's "
              "effects are ImageNet points at DataComp scale)."]
    primary = [c for c in summary["claims"] if c.get("family") == PRIMARY]
    if primary:
        lines += ["", "### Decisions", "", *(f"- {claim_sentence(c)}" for c in primary)]
    for family, title in ((PRIMARY, "Primary claims"), (SECONDARY, "Secondary claims"), (ALL, None)):
        chosen = [c for c in summary["claims"] if c.get("family", ALL) == family]
        if not chosen:
            continue
        if title:
            lines += ["", f"### {title} ({len(chosen)}, Holm within them)"]
        lines += ["", "| " + " | ".join(CLAIMS_HEADER) + " |", "|" + "---|" * len(CLAIMS_HEADER)]
        lines += ["| " + " | ".join(claim_cells(c)) + " |" for c in chosen]
    lines += temperature_section(study, rows, summary["regime"])
    lines += hierarchy_section(study, rows)
    lines += composition_section(study, rows)
    if summary["noise"]:
        lines += ["", "## Noise floor", "",
                  "In points: the seed standard deviation of each configuration (median over configurations, and "
                  "its range), that of each configuration's difference to the baseline paired by seed (median), "
                  "the evaluation sampling error of one run's score (binomial, median over runs) and that of one "
                  "run's difference to its seed's baseline run on the same images (McNemar's, median over pairs; "
                  "its square over the paired sd's is the share of that spread more images would remove), and the "
                  "metric's ceiling: the best score any model can expect (100 for a classification task, whose label "
                  "the image shows; less for retrieval, whose captions are often true of several images).", "",
                  "| metric | seed sd, median (range) | paired Δ sd, median | sampling error | paired sampling error "
                  "| ceiling |", "|---|---|---|---|---|---|"]
        for r in summary["noise"]:
            label = names[r["metric"]] if r["metric"] in names else TASKS[r["metric"]].name
            lines.append(f"| {label} | {r['seed_sd_median']:.2f} "
                         f"({r['seed_sd_min']:.2f}–{r['seed_sd_max']:.2f}) | {_fmt(r['paired_sd_median'], 2)} | "
                         f"{_fmt(r['sampling_se_median'], 2)} | {_fmt(r.get('paired_sampling_se_median'), 2)} | "
                         f"{_fmt(r.get('ceiling'), 1)} |")
    if summary.get("eval_size"):
        lines += ["", "## Precision against the evaluation set's size", "",
                  "Shapes scored on the first images of its evaluation set only (a random subset; the world writes "
                  "them in random order), in points: the standard deviation over seeds of a configuration's "
                  "difference to its seed's baseline run (median over configurations with two seeds or more) and "
                  "its evaluation sampling error (McNemar's, median over pairs). Where the second is a small part of "
                  "the first, more images would not narrow the verdicts; more seeds or a longer budget would.", "",
                  "| images | paired Δ sd, median | paired sampling error | its share of the variance |",
                  "|---|---|---|---|"]
        for r in summary["eval_size"]:
            sd, se = r["paired_sd_median"], r["paired_sampling_se_median"]
            # Capped at all of it: an sd from two or three seeds can come out below the sampling error alone.
            share = "–" if not sd else f"{min(1.0, (se / sd) ** 2):.0%}"
            lines.append(f"| {r['images']} | {_fmt(sd, 2)} | {_fmt(se, 2)} | {share} |")
    return "\n".join(lines) + "\n"


def _label(config: str, idle: frozenset[str]) -> str:
    """A configuration's name in a table, marked where its runs did not learn."""
    return f"{config} (did not learn)" if config in idle else config


def learning_section(study: Study, rows: dict) -> list[str]:
    """Whether each configuration learned: its main score's excess over chance with its 95% interval over
    seeds, and how many of its runs score above chance on their own evaluation images; nothing where the
    main group has no chance level (``summaries.main_chance``)."""
    mains = [rows[(c, "main")] for c in study.configs if (c, "main") in rows and "learned" in rows[(c, "main")]]
    if not mains:
        return []
    images = mains[0].get("images")
    lines = ["", "## Did it learn", "",
             f"The main score less chance ({mains[0]['chance']:.1f}, uniform guessing), with its 95% interval over "
             f"seeds (Student's t, its standard error counting the evaluation images' sampling error too, since every "
             f"seed is scored on the same images), and the runs whose own score excludes chance "
             + (f"(Clopper and Pearson's 95% interval over {int(images):,} evaluation images)" if images == images and images
                else "(unknown here: the runs kept no per-image outcomes)")
             + ". A configuration learned where the first excludes 0 above, or where every run excludes chance. "
               "Claims that involve one that did not are not tested.", "",
             "| config | main | above chance [95%] | learned | runs above chance |", "|---|---|---|---|---|"]
    for r in mains:
        interval = "" if r["above_chance_low"] is None else f" [{r['above_chance_low']:.1f}, {r['above_chance_high']:.1f}]"
        runs = r.get("runs_above_chance")
        counted = "–" if runs is None else f"{int(runs)} of {int(r['n_seeds'])}"
        lines.append(f"| {r['config']} | {r['mean']:.1f} | {r['above_chance']:+.1f}{interval} | {learned_cell(r)} | "
                     f"{counted} |")
    return lines


def _mean_sd(row: Optional[dict], digits: int = 1) -> str:
    if row is None:
        return "–"
    return f"{row['mean']:.{digits}f}" + (f" ± {row['sd']:.{digits}f}" if row["sd"] is not None else "")


def hierarchy_section(study: Study, rows: dict) -> list[str]:
    """Each configuration's Shapes mistakes in the world's class tree (``euclip analyze hierarchy``), beside
    what uniform guessing scores, and the order of the world's caption pairs; nothing where the study's runs
    have no hierarchy analysis."""
    if not any(metric == "shapes_tie" for _, metric in rows):
        return []
    from euclip_cli.hierarchy import world_guessing

    guess = world_guessing()
    # Analyses older than the caption pool's score have none: their studies' tables stay as published.
    pooled = any(metric == "pool_similarity_auc" for _, metric in rows)
    measures = ("shapes_jaccard", "shapes_h_precision", "family_similarity_auc", "family_cone_auc",
                *(("pool_similarity_auc", "pool_cone_auc") if pooled else ()), "caption_root_order_auc",
                "caption_cone_order_auc")
    lines = ["", "## Hierarchy", "",
             "HyCoCLIP's hierarchical metrics of the Shapes predictions in the world generator's class tree "
             "(12 shapes, 3 families, one root), with its code's ancestor sets (a class's ancestors, not the "
             "class), mean ± sd over seeds: the tree-induced error (edges between the predicted and the true "
             "shape: 0 right, 2 another shape of its family, 4 one of another family), the same over the "
             "mistakes only beside uniform mistakes on the same images (a model whose mistakes stay in the "
             "family scores below them; one that is merely more often right scores the same), the Jaccard "
             "similarity and the hierarchical precision of the ancestor sets (a mistake within the family "
             f"scores 1 in both). Uniform guessing scores {guess['tie']:.2f}, {guess['jaccard']:.2f} and "
             f"{guess['h_precision']:.2f}. Entailment as a score: how well the family captions pick out the "
             "Shapes images of their family (ROC AUC; 0.5 is chance), by the geometry's similarity and, where "
             "it has cones, by the cone. Order: each (generic, specific) pair of the world's captions at "
             "every level against the same pair reversed (ROC AUC; a symmetric score gets 0.5), by the "
             "distance from [ROOT] and, where the geometry has cones, by the cone." + (
                 " Pool: the world's captions from the most generic to the most specific against the retrieval "
                 "images, a pair related where the caption is true of the image (ROC AUC)." if pooled else ""), "",
             "| config | Shapes | tree-induced error | mistakes' TIE (uniform) | Jaccard | hierarchical precision "
             "| AUC, similarity | AUC, cone | " + ("pool AUC, similarity | pool AUC, cone | " if pooled else "")
             + "order AUC, [ROOT] | order AUC, cone |", "|" + "---|" * (10 + 2 * pooled)]
    idle = did_not_learn(rows.values())
    for config in study.configs:
        mistakes = _mean_sd(rows.get((config, "shapes_mistake_tie")), 2)
        uniform = rows.get((config, "shapes_random_mistake_tie"))
        if uniform is not None:
            mistakes += f" ({uniform['mean']:.2f})"
        cells = [_mean_sd(rows.get((config, "world/shapes"))), _mean_sd(rows.get((config, "shapes_tie")), 2), mistakes,
                 *(_mean_sd(rows.get((config, m)), 3) for m in measures)]
        lines.append(f"| {_label(config, idle)} | " + " | ".join(cells) + " |")
    return lines


def composition_section(study: Study, rows: dict) -> list[str]:
    """Each configuration's accuracy on the world's hard negatives, overall and by kind of negative, beside
    what the text-only baseline and chance score on the same pairs; nothing where no run scored them."""
    if not any(metric == HARD_NEGATIVES for _, metric in rows):
        return []
    lines = ["", "## Compositional hard negatives", "",
             "The world's hard negatives (docs/embedded-world.md): each image's caption against a negative of one "
             "of SugarCrepe's seven kinds, in %, mean ± sd over seeds; Δ to the baseline paired by seed, with its "
             "raw 95% interval. The last two rows score the same pairs without any model: a bigram language model "
             "of the world's training captions (text alone) and chance. A kind where text alone is far from 50 is "
             "one a caption's wording gives away (or misleads on).", "",
             "| config | all kinds | Δ | " + " | ".join(k.replace("_", "-") for k in NEGATIVE_KINDS) + " |",
             "|---|" + "---|" * (len(NEGATIVE_KINDS) + 2)]
    idle = did_not_learn(rows.values())
    for config in study.configs:
        row = rows.get((config, HARD_NEGATIVES))
        delta = ("" if row is None or row.get("diff_mean") in (None, "") else
                 f"{row['diff_mean']:+.1f} [{row['diff_low']:+.1f}, {row['diff_high']:+.1f}]")
        cells = [_mean_sd(row), delta, *(_mean_sd(rows.get((config, f"hard_negatives_{k}"))) for k in NEGATIVE_KINDS)]
        lines.append(f"| {_label(config, idle)} | " + " | ".join(cells) + " |")
    # The world's, alike for every run on it: read from any configuration that has it.
    text = {metric: r["mean"] for (_, metric), r in rows.items() if metric.startswith("hard_negatives_text_only")}
    if text:
        cells = [text.get(f"hard_negatives_text_only_{k}") for k in NEGATIVE_KINDS]
        lines.append(f"| text alone | {_fmt(text.get('hard_negatives_text_only'))} | | "
                     + " | ".join(_fmt(c) for c in cells) + " |")
    lines.append("| chance | 50.0 | | " + " | ".join("50.0" for _ in NEGATIVE_KINDS) + " |")
    return lines


def temperature_section(study: Study, rows: dict, reading: dict) -> list[str]:
    """The learned temperature of each configuration, and (where configurations name one) the
    published row of Sun and Li beside ours."""
    lines = ["", "## Temperature", "",
             f"β = exp(t) at the end of training, and the first logged step from which it stays within "
             f"{CONVERGED_WITHIN:.0%} of that value (mean over seeds).", ""]
    papered = {name: c.paper for name, c in study.configs.items() if c.paper}
    published = None
    if papered:
        from euclip_cli.published import sun_li_temperature

        published = sun_li_temperature()
    header = ["config", "β final", "converged at step", "main", "retrieval"]
    if published is not None:
        header += ["Sun and Li row", "temperature init → final, as printed", "converged", "ImageNet zero-shot", "Flickr I2T / T2I R@1"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    idle = did_not_learn(rows.values())
    for config, spec in study.configs.items():
        step = rows.get((config, "temperature_converged_step"))
        # A temperature that is not learned, or barely moved, has no step it converged at: "frozen".
        frozen = not C.load_config(spec.recipe, study.overrides(config, 0)).geometry.learn_logit_scale or any(
            r["config"] == config and r["scalar"] == "β" and r["frozen"] for r in reading["scalars"])
        cells = [_label(config, idle), _mean_sd(rows.get((config, "temperature_final")), 2),
                 "frozen" if frozen else "–" if step is None else f"{step['mean']:.0f}",
                 _mean_sd(rows.get((config, "main"))), _mean_sd(rows.get((config, "retrieval")))]
        if published is not None:
            label = papered.get(config)
            if label is None:
                cells += [""] * 5
            else:
                row = published.loc[label]
                final = "" if row["temp_final"] != row["temp_final"] else f" → {row['temp_final']:.3f}"  # NaN: Table 6
                cells += [f"Table {row['table']} {label}", f"{row['temp_init']:.3f}{final}",
                          row["converge_step"] if isinstance(row["converge_step"], str) else "",
                          f"{row['zero_shot']:.2f}", f"{row['i2t_r1']:.1f} / {row['t2i_r1']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if published is not None:
        lines += ["", "The published rows are ViT-S/16 trained on YFCC-15M (batch 2,048, 108k steps); the world's "
                  "runs are tiny towers trained for minutes. Compare directions and orderings, not values; "
                  "the paper's temperatures are printed as it prints them (see the CSV's source line)."]
    return lines


def write_tables(study: Study, summary: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    texts = {"study.csv": to_csv(summary["rows"]), "claims.csv": to_csv(summary["claims"]),
             "seeds.csv": to_csv(summary["per_seed"]),
             "noise.csv": to_csv(summary["noise"]), "eval_size.csv": to_csv(summary.get("eval_size", [])),
             "regime.json": json.dumps(summary["regime"], indent=2),
             "study.md": to_markdown(study, summary)}
    for name in PUBLISHED:
        text = texts[name]
        write_text_atomic(out / name, text)
        written.append(out / name)
    return written
