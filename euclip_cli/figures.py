"""Figures (matplotlib, PNG and PDF) from the analyses' result dicts; nothing here computes a metric."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogFormatter  # noqa: E402

from euclip_cli.rundir import atomic_path  # noqa: E402


def _save(fig, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        with atomic_path(path) as tmp:  # a stop mid-write leaves no half figure
            fig.savefig(tmp, dpi=150, bbox_inches="tight", format=path.suffix[1:])
    plt.close(fig)
    return paths


def distance_histogram(study: dict, title: str, stem: Path) -> list[Path]:
    """Distances per modality from [ROOT] (and from the embedding average where that differs),
    as the paper's Figures 2, 4 and 6-8."""
    refs = list(study["arrays"])
    fig, axes = plt.subplots(len(refs), 1, figsize=(5, 3 * len(refs)), squeeze=False)
    for ax, ref in zip(axes[:, 0], refs):
        for modality, colour in (("image", "tab:blue"), ("text", "tab:orange")):
            ax.hist(study["arrays"][ref][modality], bins=40, alpha=0.6, color=colour, label=modality, density=True)
        info = study["references"][ref]
        name = "[ROOT]" if ref == "root" else "the embedding average"
        ax.set_xlabel(study.get("scale", "distance from [ROOT]") if ref == "root" else f"geodesic distance from {name}")
        ax.set_ylabel("density")
        ax.set_title(f"||{name}|| = {info['norm']:.3f}, P(text closer) = {info['auc_text_closer']:.2f}", fontsize=9)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, stem)


def spectra_plot(study: dict, title: str, stem: Path) -> list[Path]:
    """Singular values of the unit-normalized image and text embeddings, before and after centering."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, values in study["spectra"].items():
        ax.semilogy(range(1, len(values) + 1), values, label=name, linestyle="--" if "centered" in name else "-")
    ax.set_xlabel("index")
    ax.set_ylabel("singular value")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, stem)


def training_curves(metrics: dict[str, list[dict]], stem: Path) -> list[Path]:
    """Every loss term, the logit scale and (where learned) the curvature against step, one line per run;
    nothing where no record holds one of them."""
    keys = ["loss", "contrastive", "entailment", "logit_scale", "curvature"]
    present = [k for k in keys if any(k in r for records in metrics.values() for r in records)]
    if not present:
        return []
    fig, axes = plt.subplots(1, len(present), figsize=(3.2 * len(present), 3), squeeze=False)
    colours = {name: f"C{i % 10}" for i, name in enumerate(metrics)}  # one colour per run in every panel
    for ax, key in zip(axes[0], present):
        for name, records in metrics.items():
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                ax.plot(*zip(*points), label=name, color=colours[name])
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    return _save(fig, stem)


def group_bars(scores: dict[str, dict[str, float]], columns: dict[str, str], stem: Path) -> list[Path]:
    """Zero-shot results per group (percent), one bar per run in each group."""
    groups = [g for g in columns if any(s.get(g) is not None for s in scores.values())]
    fig, ax = plt.subplots(figsize=(1.6 * max(len(groups), 1) + 2, 3.2))
    width = 0.8 / max(len(scores), 1)
    for i, (name, s) in enumerate(scores.items()):
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [100 * (s.get(g) or 0) for g in groups], width=width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], [columns[g] for g in groups], fontsize=8)
    ax.set_ylabel("zero-shot (%)")
    ax.legend(fontsize=7)
    return _save(fig, stem)


def study_figure(rows: list[dict], configs: list[str], baseline: str, columns: dict[str, str], stem: Path) -> list[Path]:
    """Each configuration's mean with its 95% interval over seeds (left: the main task and the
    average), and its paired difference to the baseline (right); ``rows`` are study.csv's."""
    return _save(study_canvas(rows, configs, baseline, columns), stem)


def study_canvas(rows: list[dict], configs: list[str], baseline: str, columns: dict[str, str]):
    """``study_figure``'s matplotlib figure, unsaved."""
    by = {(r["config"], r["metric"]): r for r in rows}
    # Constrained layout makes room for a legend outside the axes, where it hides no configuration.
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * len(configs) + 1.9), sharey=True, layout="constrained")
    ys = list(range(len(configs)))[::-1]
    for metric, colour, shift in (("main", "tab:blue", 0.12), ("average", "tab:orange", -0.12)):
        for ax, (value, low, high) in zip(axes, (("mean", "ci_low", "ci_high"), ("diff_mean", "diff_low", "diff_high"))):
            points = [(y + shift, by[(c, metric)]) for y, c in zip(ys, configs)
                      if (c, metric) in by and by[(c, metric)].get(value) is not None]
            if not points:
                continue
            centre = [r[value] for _, r in points]
            err = [[r[value] - (r[low] if r.get(low) is not None else r[value]) for _, r in points],
                   [(r[high] if r.get(high) is not None else r[value]) - r[value] for _, r in points]]
            ax.errorbar(centre, [y for y, _ in points], xerr=err, fmt="o", color=colour, capsize=3,
                        label=columns[metric])
    axes[0].set_yticks(ys, configs)
    axes[0].set_xlabel("zero-shot (%), mean and 95% interval over seeds")
    axes[1].axvline(0, color="grey", lw=0.8)
    axes[1].set_xlabel(f"difference to {baseline} (points), paired by seed")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncol=2, fontsize=8, frameon=False)
    return fig


def hierarchy_figure(rows: list[dict], configs: list[str], guessing: float, stem: Path) -> list[Path]:
    """Each configuration's Shapes tree-induced error (left, with uniform guessing's) and its family
    captions' ROC AUC by similarity and by cone (right, 0.5 is chance): means with 95% intervals over
    seeds; ``rows`` are study.csv's."""
    return _save(hierarchy_canvas(rows, configs, guessing), stem)


def hierarchy_canvas(rows: list[dict], configs: list[str], guessing: float):
    """``hierarchy_figure``'s matplotlib figure, unsaved."""
    by = {(r["config"], r["metric"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * len(configs) + 1.9), sharey=True, layout="constrained")
    ys = list(range(len(configs)))[::-1]
    panels = ((axes[0], (("shapes_tie", "tree-induced error", "tab:purple", 0.0),)),
              (axes[1], (("family_similarity_auc", "ROC AUC, similarity", "tab:blue", 0.12),
                         ("family_cone_auc", "ROC AUC, cone", "tab:red", -0.12))))
    for ax, metrics in panels:
        for metric, label, colour, shift in metrics:
            points = [(y + shift, by[(c, metric)]) for y, c in zip(ys, configs) if (c, metric) in by]
            if not points:
                continue
            centre = [r["mean"] for _, r in points]
            err = [[r["mean"] - (r["ci_low"] if r.get("ci_low") is not None else r["mean"]) for _, r in points],
                   [(r["ci_high"] if r.get("ci_high") is not None else r["mean"]) - r["mean"] for _, r in points]]
            ax.errorbar(centre, [y for y, _ in points], xerr=err, fmt="o", color=colour, capsize=3, label=label)
    axes[0].axvline(guessing, color="grey", lw=0.8, ls="--", label="uniform guessing")
    axes[1].axvline(0.5, color="grey", lw=0.8, ls=":", label="chance")
    axes[0].set_yticks(ys, configs)
    axes[0].set_xlabel("Shapes mistakes: edges to the true shape (lower is nearer)")
    axes[1].set_xlabel("family captions against Shapes images (ROC AUC)")
    handles = [h for ax in axes for h in ax.get_legend_handles_labels()[0]]
    labels = [l for ax in axes for l in ax.get_legend_handles_labels()[1]]
    fig.legend(handles, labels, loc="outside upper center", ncol=5, fontsize=8, frameon=False)
    return fig


def temperature_figure(temperature: dict, stem: Path) -> list[Path]:
    """Sun and Li's Figure 3 for a study: the learned temperature over training, one panel per
    geometry, one line per configuration (the mean over seeds at each logged step, shaded from
    the lowest seed to the highest); ``temperature`` is ``study.summaries.temperature_curves``'."""
    return _save(temperature_canvas(temperature), stem)


def temperature_canvas(temperature: dict):
    """``temperature_figure``'s matplotlib figure, unsaved."""
    panels = temperature["panels"]
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.2 * rows), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, (title, configs) in zip(axes.flat, panels.items()):
        for i, config in enumerate(configs):
            seeds = list(temperature["curves"][config].values())
            shared = sorted(set.intersection(*({step for step, _ in points} for points in seeds)))
            at = [dict(points) for points in seeds]
            values = [[a[step] for a in at] for step in shared]
            colour = f"C{i % 10}"
            ax.plot(shared, [sum(v) / len(v) for v in values], color=colour, label=f"{config} ({len(seeds)} seeds)")
            ax.fill_between(shared, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.2,
                            linewidth=0)
        ax.set_yscale("log")
        # Plain numbers: a β that barely moves spans less than a decade, where matplotlib's default
        # minor labels read "1.4x10^1"; which minor ticks get a label stays matplotlib's choice.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("learned temperature beta")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    return fig


def equilibrium_plot(study: dict, title: str, stem: Path) -> list[Path]:
    """Sun and Li's Figure 1: the mean alignment/uniformity ratio against temperature, one line per
    shuffle percentage (colour) and batch size (line style); 1 is the equilibrium."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    percents = sorted({c["shuffle_percent"] for c in study["curves"]})
    sizes = sorted({c["batch_size"] for c in study["curves"]})
    styles = ["-", "--", ":", "-."]
    for curve in study["curves"]:
        ax.loglog([p["temperature"] for p in curve["points"]], [p["ratio"] for p in curve["points"]],
                  color=f"C{percents.index(curve['shuffle_percent']) % 10}",
                  linestyle=styles[sizes.index(curve["batch_size"]) % len(styles)],
                  label=f"shuffle {curve['shuffle_percent']:g}%, batch {curve['batch_size']}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    if study.get("learned_temperature"):
        ax.axvline(study["learned_temperature"], color="black", linewidth=0.8, linestyle=":",
                   label=f"the run's temperature {study['learned_temperature']:.1f}")
    ax.set_xlabel("temperature (logit scale beta)")
    ax.set_ylabel("alignment / uniformity ratio")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, stem)
