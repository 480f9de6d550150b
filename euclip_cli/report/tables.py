"""Tables from run directories: the embedded sweep, and the paper's tables beside our runs.

A run's row comes from its recipe (``report.paper_rows``), never from its directory name.
Several seeds of one configuration become one row, mean ± sample standard deviation.
A paper row without a run of ours stays in the table, marked missing.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from euclip_cli import config as C
from euclip_cli.errors import Failure, UsageError
from euclip_cli.geometry import describe
from euclip_cli.published import (euclip_tables, euclip_traversal, grid_samples, hycoclip_imagenet, hycoclip_model_zoo,
                                  laion_scaling_grid, meru_imagenet, meru_tables, sun_li_temperature)
from euclip_cli.protocol.aggregate import aggregate
from euclip_cli.protocol.tasks import HARD_NEGATIVES, SUITE_COLUMNS, TASKS
from euclip_cli.rundir import RunDir, all_runs, read_json
from euclip_cli.stats import CLAIMS_HEADER, MISSING, claim_cells, config_table

METRICS = ("main", "shifts", "attributes", "retrieval", "average")
# The report tables of published rows, one row per (published row, run) and a "run" column that is MISSING
# where no run of ours is beside the row.
PUBLISHED_BESIDE_RUNS = ("traversal", "meru", "hycoclip")
PAPER_COLUMNS = {"main": "imagenet", "shifts": "imagenet_dist_shifts", "attributes": "vtab",
                 "retrieval": "retrieval", "average": "avg38"}


@dataclass
class Run:
    name: str
    recipe: str
    config: dict
    scores: dict[str, dict]  # suite -> aggregate
    imported: Optional[str] = None  # the format of a released checkpoint brought in by ``euclip import``
    import_meta: Optional[dict] = None  # meta.json's "imported" record
    results: dict = field(default_factory=dict)  # task key -> its newest metrics (of its own embedded world)
    other_worlds: int = 0  # the embedded worlds besides its own it has scores on, which the tables leave out
    earlier_only: int = 0  # tasks scored only at a checkpoint older than its newest scored, which they leave out


def completed_config(run: RunDir) -> dict:
    """The run's stored configuration with the keys added since it was written at their defaults (as the
    trainer reads it); a damaged one (no model or geometry, or a key or value the schema refuses) is a
    Failure naming the file, since every row reads its keys."""
    stored = run.config()
    try:
        if not all(isinstance(stored.get(section), dict) for section in ("model", "geometry")):
            raise C.ConfigError(["no [model] or [geometry] section"])
        return C.to_dict(C.from_dict(stored))
    except C.ConfigError as err:
        raise Failure(f"{run.config_file} is not a configuration this euclip reads ({'; '.join(err.problems)}); "
                      f"restore it, or delete the run") from None


def load_runs(runs_dir: Path) -> list[Run]:
    runs = []
    for run in all_runs(runs_dir):
        config = completed_config(run)
        lines = run.eval_lines()
        results = run.latest_results(lines=lines)
        scores = {suite: aggregate(results, suite) for suite in SUITE_COLUMNS}
        imported = run.meta().get("imported")
        runs.append(Run(run.name, config.get("recipe", ""), config, scores,
                        imported.get("format") if imported else None, imported,
                        {line["key"]: line["metrics"] for line in results}, len(run.other_worlds(lines)),
                        len(run.earlier_only(lines=lines))))
    return runs


def _row_key(run: Run) -> str:
    """Runs that differ only in their seed share a row. An imported run has a row of its own: its config may be
    a trained run's to the seed (an euclip export brought back), and the same weights twice are not two seeds."""
    stripped = {k: (dict(v, seed=None) if k == "train" else v) for k, v in run.config.items()}
    return json.dumps([stripped, run.import_meta], sort_keys=True)


def _cell(values: list[Optional[float]], digits: int = 1) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return MISSING
    if len(values) == 1:
        return f"{100 * values[0]:.{digits}f}"
    return f"{100 * statistics.mean(values):.{digits}f} ± {100 * statistics.stdev(values):.{digits}f} (n={len(values)})"


def _configurations(runs: list[Run], scored: Callable[[Run], bool]) -> list[tuple[dict, list[Run]]]:
    """The runs ``scored`` picks, one group per configuration (its seeds), each with the row's leading
    columns: who they are, their geometry, logit, final LN and λ."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        if scored(run):
            groups.setdefault(_row_key(run), []).append(run)
    found = []
    for members in groups.values():
        # Seeds of one recipe are named by the recipe; anything else by its run names.
        same_recipe = len(members) > 1 and len({m.recipe for m in members}) == 1 and members[0].recipe
        label = members[0].recipe if same_recipe else ", ".join(
            m.name + (f" (imported: {m.imported})" if m.imported else "") for m in members)
        g = members[0].config["geometry"]
        logit = describe(g["name"]).logit(g["logit"])
        found.append(({"run": label, "seeds": len(members), "geometry": g["name"], "logit": logit,
                       "final LN": "yes" if members[0].config["model"]["final_ln"] else "no",
                       "λ": members[0].config["loss"]["entail_weight"]}, members))
    return found


def suite_table(runs: list[Run], suite: str) -> pd.DataFrame:
    """One row per configuration with any result in ``suite``; columns named as the suite names them."""
    rows = []
    for row, members in _configurations(runs, lambda run: run.scores[suite]["tasks_done"]):
        for metric in METRICS:
            row[SUITE_COLUMNS[suite][metric]] = _cell([m.scores[suite][metric] for m in members])
        rows.append(row)
    return pd.DataFrame(rows)


def compositional_table(runs: list[Run]) -> pd.DataFrame:
    """One row per configuration scored on a compositional task: Winoground's text, image and group scores,
    each SugarCrepe split's accuracy and their mean (the suite's SugarCrepe column), and the world's hard
    negatives beside what text alone scores on them (``evaluate.runner.evaluate_selection``)."""
    splits = [t for t in TASKS.values() if t.suite == "compositional" and t.key != "winoground"]
    rows = []
    for row, members in _configurations(runs, lambda run: run.scores["compositional"]["tasks_done"]
                                         or HARD_NEGATIVES in run.results):
        wino = [m.results.get("winoground", {}) for m in members]
        for metric, name in (("text_acc", "text"), ("image_acc", "image"), ("acc", "group")):
            row[f"Winoground {name}"] = _cell([r.get(metric) for r in wino])
        for task in splits:
            row[task.name] = _cell([m.results.get(task.key, {}).get("acc") for m in members])
        row[SUITE_COLUMNS["compositional"]["attributes"]] = _cell(
            [m.scores["compositional"]["attributes"] for m in members])
        hard = [m.results.get(HARD_NEGATIVES, {}) for m in members]
        row["world hard negatives"] = _cell([r.get("acc") for r in hard])
        row["text alone"] = _cell([r.get("text_only_acc") for r in hard])
        rows.append(row)
    return pd.DataFrame(rows)


# Said wherever runs of one seed are set side by side (make demo's table and bars).
SINGLE_SEED = ("one seed per row: a difference between rows may be seed noise; euclip study compares "
               "configurations over seeds, with intervals")


def single_seed_note(seeds: list[int]) -> str:
    """The warning a table or figure of runs carries when any row is a single seed; "" otherwise."""
    return f" ({SINGLE_SEED})" if any(n == 1 for n in seeds) else ""


def paper_table(runs: list[Run], table: int) -> pd.DataFrame:
    """The paper's rows of ``table`` with ours beside each published number and the difference (points)."""
    paper = euclip_tables()
    rows = []
    for _, ref in paper[paper["table"] == table].iterrows():
        tag = f"{table}:{ref['label']}"
        # Labels repeat across models within a table (Table 5), so the architecture must match too.
        mine = [r for r in runs if tag in r.config.get("report", {}).get("paper_rows", [])
                and r.config["model"]["arch"] == ref["model"]]
        row = {"model": f"{ref['model']} {ref['label']}"}
        for metric in METRICS:
            title = SUITE_COLUMNS["datacomp"][metric]
            published = float(ref[PAPER_COLUMNS[metric]])
            values = [r.scores["datacomp"][metric] for r in mine if r.scores["datacomp"][metric] is not None]
            row[f"{title} (paper)"] = published
            row[f"{title} (ours)"] = _cell(values, digits=2)
            row[f"{title} Δ"] = f"{100 * statistics.mean(values) - published:+.2f}" if values else MISSING
        rows.append(row)
    return pd.DataFrame(rows)


def without_runs(name: str, df: pd.DataFrame) -> bool:
    """Whether a report table (``euclip report --table NAME``) holds published rows only."""
    if df.empty:
        return True
    if name.isdigit():
        return bool((df[[c for c in df.columns if c.endswith(" (ours)")]] == MISSING).all(axis=None))
    if name in PUBLISHED_BESIDE_RUNS:
        return bool((df["run"] == MISSING).all())
    return False


def fill_command(name: str) -> str:
    """The command that would put a run of ours into report table ``name``."""
    if name.isdigit():
        from euclip_cli import config as C

        recipes = [r for r in C.list_recipes() if not C.is_study_recipe(r)
                   and any(row.split(":", 1)[0] == name for row in C.load_config(r).report.paper_rows)]
        others = f" or another of the {len(recipes)} recipes of its rows (euclip recipes list)" if len(recipes) > 1 else ""
        return f"euclip train --recipe {recipes[0]}{others}, then euclip eval" if recipes else "no recipe reproduces it"
    if name == "traversal":
        return "euclip analyze traverse RUN"
    if name == "released":
        return "euclip import openclip | euclip-authors | meru | hycoclip SOURCE --name RUN, then euclip eval"
    if name == "meru":
        return "euclip import meru SOURCE --name RUN, then euclip eval RUN --tasks meru"
    if name == "hycoclip":
        return "euclip import hycoclip SOURCE --name RUN, then euclip eval RUN --tasks meru"
    if name == "compositional":
        return "euclip download evalsets --tasks compositional, then euclip eval RUN --tasks compositional"
    return "euclip report --help"


def traversal_table(runs_dir: Path) -> pd.DataFrame:
    """Captions per image of every run's traversals beside the paper's Tables 6 and 7.

    A run sits beside the published rows of its geometry and filter (Table 7's only beside a run
    imported from MERU's release, ``meta.json`` ``imported.format == "meru"``); its images and caption pool
    (MERU's pexels set through ``--image-dir``, or the embedded world) and its protocol are named,
    since only the paper protocol on the paper's images is the published measurement.
    """
    published = euclip_traversal()
    ours = []
    for run in all_runs(runs_dir):
        origin = "meru-release" if run.meta().get("imported", {}).get("format") == "meru" else "trained"
        for stem in ("traverse_custom", "traverse"):
            path = run.analysis_dir / f"{stem}.json"
            if not path.exists():
                continue
            result = read_json(path)
            images = (f"{Path(result['image_dir']).name} ({result['images']})" if stem == "traverse_custom"
                      else f"embedded world ({result['images']})")
            for name, row in result["filters"].items():
                ours.append({"geometry": result["geometry"], "filter": name, "origin": origin, "run": run.name,
                             "images": images,
                             "protocol": result.get("protocol", "euclip"),
                             "ours": round(row["captions_per_image"], 3)})
    rows = []
    for _, ref in published.iterrows():
        mine = [o for o in ours
                if (o["geometry"], o["filter"], o["origin"]) == (ref["geometry"], ref["filter"], ref["runs"])]
        base = {"paper": f"Table {ref['table']}: {ref['model']}", "filter": ref["filter"],
                "published": ref["avg_captions_retrieved"]}
        rows += [dict(base, **{k: o[k] for k in ("run", "images", "protocol", "ours")}) for o in mine] or \
            [dict(base, run=MISSING, images="", protocol="", ours="")]
    matched = {(r["geometry"], r["filter"], r["runs"]) for _, r in published.iterrows()}
    rows += [{"paper": "", "filter": o["filter"], "published": "", **{k: o[k] for k in ("run", "images", "protocol",
                                                                                       "ours")}}
             for o in ours if (o["geometry"], o["filter"], o["origin"]) not in matched]
    return pd.DataFrame(rows)


def equilibrium_table(runs_dirs: list[Path]) -> pd.DataFrame:
    """Every run's ``euclip analyze equilibrium`` result as numbers (Sun and Li's Figure 1 is a plot,
    with no published values): per shuffle percentage and batch size, the temperature at which the
    alignment/uniformity ratio reaches 1, and the ratio at the run's own learned temperature."""
    rows = []
    for run in (run for folder in runs_dirs for run in all_runs(folder)):
        path = run.analysis_dir / "equilibrium.json"
        if not path.exists():
            continue
        result = read_json(path)
        learned = result["learned_temperature"]
        for curve in result["curves"]:
            at = next(p["ratio"] for p in curve["points"] if p["temperature"] == learned)
            eq = curve["equilibrium_temperature"]
            rows.append({"run": run.name, "geometry": f"{result['geometry']} ({result['logit']})",
                         "learned β": round(learned, 2), "shuffled %": curve["shuffle_percent"],
                         "batch": curve["batch_size"],
                         "equilibrium β": "above the grid" if eq is None else round(eq, 2),
                         "ratio at learned β": round(at, 3)})
    return pd.DataFrame(rows)


def hierarchy_table(runs_dirs: list[Path]) -> pd.DataFrame:
    """Every run's ``euclip analyze hierarchy --tree wordnet`` result on ImageNet's tasks: HyCoCLIP's metrics,
    the mistakes' TIE beside uniform mistakes', and the tree and convention they were scored under (a
    number sits beside HyCoCLIP's only under its convention, in its tree)."""
    rows = []
    for run in (run for folder in runs_dirs for run in all_runs(folder)):
        path = run.wordnet_hierarchy_file
        if not path.exists():
            continue
        result = read_json(path)
        if "trees" not in result:
            continue  # written before trees were per task: its numbers are the graph's over every set present
        for task, row in result["tasks"].items():
            rows.append({"run": run.name, "geometry": f"{result['geometry']} ({result['logit']})", "task": task,
                         "tree": "HyCoCLIP's" if result.get("isa") else result["tree"],
                         "convention": result["convention"], "accuracy": round(100 * row["accuracy"], 2),
                         "TIE": round(row["tie"], 3), "LCA error": round(row["lca_error"], 3),
                         "Jaccard": round(row["jaccard"], 3), "h-precision": round(row["h_precision"], 3),
                         "h-recall": round(row["h_recall"], 3),
                         "mistakes' TIE": MISSING if row["mistake_tie"] is None else round(row["mistake_tie"], 3),
                         "uniform mistakes' TIE": (MISSING if row["random_mistake_tie"] is None
                                                   else round(row["random_mistake_tie"], 3))})
    return pd.DataFrame(rows)


def _published_row(run: Run) -> tuple[str, Optional[float]]:
    """The published row an imported run should reproduce, and its ImageNet accuracy (percent)."""
    model, g = run.config["model"], run.config["geometry"]
    if run.imported == "meru":
        rows = meru_imagenet()
        match = rows[(rows["arch"] == model["arch"]) & (rows["model"] == run.import_meta.get("model"))]
        label = f"MERU Table 2: {run.import_meta.get('model')} {model['arch']}"
    elif run.imported == "hycoclip" and model["arch"] in HYCOCLIP_ARCHS:
        arch, name = HYCOCLIP_ARCHS[model["arch"]], run.import_meta.get("model")
        try:
            return f"HyCoCLIP's model zoo: {name} {arch}", hycoclip_imagenet(arch, name)
        except KeyError:
            return "", None
    elif run.imported == "euclip-authors":
        rows = euclip_tables()
        logit = describe(g["name"]).logit(g["logit"])
        match = rows[(rows["table"] == 1) & (rows["model"] == model["arch"]) & (rows["geometry"] == g["name"])
                     & (rows["logit"] == logit) & (rows["final_ln"] == ("ln" if model["final_ln"] else "no-ln"))]
        label = f"EuCLIP Table 1: {match['label'].iloc[0]}" if len(match) == 1 else ""
    else:
        return "", None
    return (label, float(match["imagenet"].iloc[0])) if len(match) == 1 else ("", None)


def released_table(runs: list[Run]) -> pd.DataFrame:
    """Imported runs beside the published ImageNet accuracy of the release they came from.

    Ours is DataComp's ImageNet task (``euclip eval --tasks datacomp`` or ``imagenet1k``); MERU's
    published figure used MERU's prompts and evaluation code, so a small gap is expected there.
    """
    rows = []
    for run in (r for r in runs if r.imported):
        label, published = _published_row(run)
        ours = run.scores["datacomp"]["main"]
        rows.append({"run": run.name, "format": run.imported, "published row": label or MISSING,
                     "ImageNet (published)": published if published is not None else MISSING,
                     "ImageNet (ours)": _cell([ours], digits=2),
                     "Δ": f"{100 * ours - published:+.2f}" if ours is not None and published is not None else MISSING})
    return pd.DataFrame(rows)


def meru_model(run: Run) -> Optional[str]:
    """The model of MERU's tables a run is one of (``MERU`` or ``CLIP baseline``), or None: an import of
    MERU's release says which; a run trained at one of MERU's architectures is MERU when hyperbolic and
    the baseline when CLIP."""
    if run.imported == "meru":
        return (run.import_meta or {}).get("model")
    if run.imported or not run.config.get("model", {}).get("arch", "").startswith("meru-"):
        return None
    return {"hyperbolic": "MERU", "clip": "CLIP baseline"}.get(run.config.get("geometry", {}).get("name"))


def meru_task_keys() -> dict[tuple[str, str], str]:
    """(suite, MERU's dataset as ``meru-tables.csv`` names it) to the task of the meru suites."""
    return {(t.suite, t.name): t.key for t in TASKS.values() if t.suite in ("meru", "meru-probe")}


def _meru_score(run: Run, ref, suite_keys: dict[tuple[str, str], str]) -> tuple[Optional[float], str]:
    """A run's value for a published row of MERU's, and by which protocol: MERU's suites (``euclip eval
    --tasks meru``: its prompts, mean per-class accuracy; ``meru-probe``: its linear probes) where the run
    has them, else (zero-shot only) DataComp's task of the dataset."""
    if ref["table"] == 7:
        value = run.results.get(suite_keys.get(("meru-probe", ref["dataset"]), ""), {}).get("mean_per_class_recall")
        return value, "MERU's" if value is not None else ""
    mine = run.results.get(suite_keys.get(("meru", ref["dataset"]), ""), {}).get(ref["metric"])
    if mine is not None:
        return mine, "MERU's"
    theirs = run.results.get(ref["datacomp_task"], {}).get(ref["metric"]) if ref["datacomp_task"] else None
    return theirs, "DataComp's" if theirs is not None else ""


def meru_width(run: Run) -> tuple[int, bool]:
    """``(embedding width, towers frozen)`` of a run as MERU's tables tell models apart: Table 3's models
    are Table 2's ViT-L towers, frozen, under new projections of each width (``model.freeze_towers``,
    ``model.embed_dim``); every other model of its tables is 512 wide and trained whole."""
    model = run.config.get("model", {})
    return model.get("embed_dim") or 512, bool(model.get("freeze_towers"))


def meru_table(runs: list[Run]) -> pd.DataFrame:
    """MERU's Tables 1 (retrieval), 2 (zero-shot classification), 3 (embedding widths) and 7 (linear probes)
    with each MERU-comparable run beside its own rows (``meru_model``, ``meru_width``: a run with frozen
    towers beside Table 3's row of its width, any other beside Tables 1, 2 and 7): ours from MERU's suites
    where the run was evaluated on them, else (zero-shot) from DataComp's task of the same dataset, whose
    prompts, splits and, for COCO, image set are DataComp's (the ``protocol`` column says which). With no
    such run, every published row with ours missing."""
    published = meru_tables()
    suite_keys = meru_task_keys()
    rows = []
    for run in runs:
        model = meru_model(run)
        arch = run.config.get("model", {}).get("arch")
        width, frozen = meru_width(run)
        mine = published[(published["arch"] == arch) & (published["model"] == model)
                         & (published["embed_dim"] == width) & ((published["table"] == 3) == frozen)]
        for _, ref in mine.iterrows():
            value, protocol = _meru_score(run, ref, suite_keys)
            rows.append({"run": run.name, "table": f"Table {ref['table']}", "model": f"{ref['model']} {arch}",
                         "embed_dim": width, "dataset": ref["dataset"], "metric": ref["metric"], "MERU": ref["value"],
                         "ours": _cell([value], digits=2), "protocol": protocol or MISSING,
                         "Δ": f"{100 * value - ref['value']:+.2f}" if value is not None else MISSING})
    if rows:
        return pd.DataFrame(rows)
    return pd.DataFrame([{"run": MISSING, "table": f"Table {ref['table']}", "model": f"{ref['model']} {ref['arch']}",
                          "embed_dim": ref["embed_dim"], "dataset": ref["dataset"], "metric": ref["metric"],
                          "MERU": ref["value"], "ours": MISSING, "protocol": MISSING, "Δ": MISSING}
                         for _, ref in published.iterrows()])


# euclip's MERU towers as HyCoCLIP's model zoo names its image towers (HyCoCLIP builds MERU's).
HYCOCLIP_ARCHS = {"meru-vit-s": "ViT-S/16", "meru-vit-b": "ViT-B/16"}
# The model zoo's columns: (column, dataset, euclip task, metric). HyCoCLIP scores classification by torchmetrics'
# MulticlassAccuracy, whose default is the mean per-class accuracy, as MERU's suite does; "text retrieval" is
# image to text (texts retrieved), "image retrieval" text to image, as MERU's Table 1 names them.
HYCOCLIP_COLUMNS = (("imagenet", "ImageNet", "meru/imagenet", "mean_per_class_recall"),
                    ("caltech101", "Caltech-101", "meru/caltech101", "mean_per_class_recall"),
                    ("food101", "Food-101", "meru/food101", "mean_per_class_recall"),
                    ("coco_text_r10", "COCO", "meru/coco", "text_retrieval_recall@10"),
                    ("coco_image_r10", "COCO", "meru/coco", "image_retrieval_recall@10"))


def hycoclip_table(runs: list[Run]) -> pd.DataFrame:
    """HyCoCLIP's model zoo (its released CLIP, MERU and HyCoCLIP on GRIT) with each run imported from that
    release beside its own row, ours from MERU's suite (``euclip eval --tasks meru``), which HyCoCLIP's
    evaluation configs repeat: the same 20 sets and prompts, and COCO and Flickr30K retrieval, where euclip's
    COCO is DataComp's 2014 test split (5,000 images) and theirs MERU's val2017. With no such run, every
    published row with ours missing."""
    zoo = hycoclip_model_zoo()
    rows = []
    for run in runs:
        arch = HYCOCLIP_ARCHS.get(run.config.get("model", {}).get("arch"))
        if run.imported != "hycoclip" or arch is None:
            continue
        model = (run.import_meta or {}).get("model")
        for _, ref in zoo[(zoo["arch"] == arch) & (zoo["model"] == model)].iterrows():
            for column, dataset, task, metric in HYCOCLIP_COLUMNS:
                value = run.results.get(task, {}).get(metric)
                rows.append({"run": run.name, "model": f"{model} {arch}", "dataset": dataset, "metric": metric,
                             "HyCoCLIP": ref[column], "ours": _cell([value], digits=2),
                             "Δ": f"{100 * value - ref[column]:+.2f}" if value is not None else MISSING})
    if rows:
        return pd.DataFrame(rows)
    return pd.DataFrame([{"run": MISSING, "model": f"{ref['model']} {ref['arch']}", "dataset": dataset,
                          "metric": metric, "HyCoCLIP": ref[column], "ours": MISSING, "Δ": MISSING}
                         for _, ref in zoo.iterrows() for column, dataset, _, metric in HYCOCLIP_COLUMNS])


def own_rows(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """The rows of report table ``name`` that hold a run of ours (every row of a table made of runs alone)."""
    if df.empty:
        return df
    if name.isdigit():
        return df[(df[[c for c in df.columns if c.endswith(" (ours)")]] != MISSING).any(axis=1)]
    if name in PUBLISHED_BESIDE_RUNS:
        return df[df["run"] != MISSING]
    return df


def published_reference() -> list[tuple[str, pd.DataFrame]]:
    """Every published table the report sets runs beside, whole and with its published columns alone:
    the EuCLIP paper's Tables 1, 4, 5 and 8, its traversal counts (Tables 6 and 7), MERU's Tables 1,
    2, 3 and 7 with one column per model, HyCoCLIP's model zoo, and LAION's grid of CLIP and SigLIP."""
    tables = []
    for number in (1, 4, 5, 8):
        df = paper_table([], number)
        paper = [c for c in df.columns if c.endswith(" (paper)")]
        tables.append((f"The EuCLIP paper's Table {number} (%)",
                       df[["model", *paper]].rename(columns=lambda c: c.removesuffix(" (paper)"))))
    published = euclip_traversal()
    tables.append(("The EuCLIP paper's Tables 6 and 7: captions per image along image traversals, [ROOT] excluded",
                   pd.DataFrame({"paper": [f"Table {r['table']}: {r['model']}" for _, r in published.iterrows()],
                                 "filter": published["filter"], "published": published["avg_captions_retrieved"]})))
    meru = meru_tables().assign(model=lambda d: d["model"] + " " + d["arch"])
    # The pivot's column axis keeps the name "model", which a rendered table shows as a header cell
    # over nothing: dropped.
    tables.append(("MERU's Tables 1, 2, 3 and 7 (%), one column per model",
                   meru.pivot_table(index=["table", "embed_dim", "dataset", "metric"], columns="model", values="value",
                                    sort=False).reset_index().rename_axis(columns=None)
                   .assign(table=lambda d: "Table " + d["table"].astype(str))))
    tables.append(("HyCoCLIP's model zoo: its released models, trained on GRIT (%)",
                   hycoclip_model_zoo().drop(columns="checkpoint")))
    grid = laion_scaling_grid()
    tables.append(("LAION's grid: CLIP and SigLIP on DataComp-1.4B, zero-shot ImageNet by samples seen, the best run of "
                   "each cell's sweep (%)",
                   grid.pivot_table(index=["arch", "model"], columns="samples_seen", values="imagenet", sort=False)
                   .reindex(columns=sorted(set(grid["samples_seen"]), key=grid_samples)).reset_index()
                   .rename_axis(columns=None).fillna(MISSING)))
    return [(title, without_empty_columns(df)) for title, df in tables]


def without_empty_columns(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without the columns that hold nothing in any row (missing, blank or NaN)."""
    def empty(cell) -> bool:
        return cell is None or (isinstance(cell, float) and math.isnan(cell)) or str(cell).strip() in ("", MISSING)

    return df[[c for c in df.columns if not df[c].map(empty).all()]]


def render(df: pd.DataFrame, fmt: str) -> str:
    """md, csv, tex (a LaTeX tabular) or html (a bare <table> for the report page)."""
    if df.empty:
        return "<p>(no runs with results)</p>\n" if fmt == "html" else "(no runs with results)\n"
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "tex":
        return df.to_latex(index=False, escape=True, float_format="%g")
    if fmt == "html":
        return df.to_html(index=False, border=0)
    return df.to_markdown(index=False) + "\n"


# Records a run's training curves keep (evenly spaced over a metrics.jsonl of any length, the last included).
CURVE_POINTS = 2000


def training_metrics(runs_dir: Path, names: list[str]) -> dict[str, list[dict]]:
    """Each run's ``metrics.jsonl`` records for its curves, at most about ``CURVE_POINTS`` (lines cut
    short by a crash are skipped); a run killed before its first step has none and no curve."""
    runs = {name: RunDir(runs_dir / name) for name in names}
    records = {name: run.training_records(CURVE_POINTS) for name, run in runs.items() if run.metrics_file.exists()}
    return {name: kept for name, kept in records.items() if kept}


def _interval(mean, low, high, digits: int = 1) -> str:
    if pd.isna(mean):
        return MISSING
    if pd.isna(low):
        return f"{mean:+.{digits}f}"
    return f"{mean:+.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def unpaired_configs(rows: pd.DataFrame) -> list[str]:
    """The configurations of a published study.csv (``rows``, indexed by config and metric) whose main row
    has no paired difference: its baseline, which study.csv does not name (every other configuration
    shares its seeds)."""
    return [c for c in dict.fromkeys(rows.index.get_level_values("config"))
            if (c, "main") in rows.index and pd.isna(rows.loc[(c, "main"), "diff_mean"])]


def study_tables(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A study's results (``euclip study``) as two display tables: each configuration's groups as
    mean ± sd over seeds with the paired difference to the baseline, and the claims with verdicts."""
    rows = pd.read_csv(folder / "study.csv")
    names = SUITE_COLUMNS["world"]
    sun_li = sun_li_temperature() if "paper" in rows.columns and rows["paper"].notna().any() else None
    configs = list(dict.fromkeys(rows["config"]))
    unpaired = unpaired_configs(rows.set_index(["config", "metric"])) if "diff_mean" in rows else []
    table = config_table(rows.to_dict("records"), configs, unpaired[0] if unpaired else "",
                         {m: names[m] for m in METRICS})
    for row, (config, group) in zip(table, rows.groupby("config", sort=False)):
        label = group["paper"].dropna().iloc[0] if "paper" in group.columns and group["paper"].notna().any() else ""
        if label:
            published = sun_li.loc[label]
            # The paper prints its temperatures ambiguously (its initialisations 2.659 and 5.310 are ln β,
            # its 1.000 is β = 1; see the CSV's source line), so its value is shown as printed, not as a β.
            final = "" if pd.isna(published["temp_final"]) else f", final temperature as printed {published['temp_final']:.3f}"
            row["Sun and Li (ImageNet zero-shot)"] = f"Table {published['table']} {label}: {published['zero_shot']:.2f}{final}"
    claims = pd.read_csv(folder / "claims.csv") if (folder / "claims.csv").stat().st_size else pd.DataFrame()
    if "family_level" not in claims.columns:  # summarised before verdicts were family-wise: re-run euclip study
        claims = pd.DataFrame()
    shown = [dict(zip(CLAIMS_HEADER, claim_cells(c))) for c in claims.to_dict("records")]
    return pd.DataFrame(table), pd.DataFrame(shown)


# The groups a budget curve shows: the main task, and the groups that stay clear of their ceiling
# (the attributes reach about 94% by 2,048 steps on the embedded world).
CURVE_METRICS = ("main", "shifts", "retrieval", "average")


def _budgets(folders: list[Path]) -> tuple[list[tuple], str, list[str]]:
    """The study at each budget, fewest steps first, as (regime.json, study.csv rows, noise.csv rows, its
    folder), with the baseline they share and the configurations every budget has besides it."""
    studies = []
    for folder in folders:
        rows = pd.read_csv(folder / "study.csv").set_index(["config", "metric"])
        regime = read_json(folder / "regime.json")
        noise = pd.read_csv(folder / "noise.csv").set_index("metric")
        if "ceiling" not in noise.columns:
            raise UsageError(f"{folder / 'noise.csv'} has no ceilings (published by an older euclip): publish the "
                             f"study again (euclip study --recipe NAME ... --publish {folder})")
        configs = list(dict.fromkeys(rows.index.get_level_values("config")))
        (baseline,) = unpaired_configs(rows)
        studies.append((regime, rows, noise, folder, configs, baseline))
    baselines = {s[5] for s in studies}
    if len(baselines) != 1:
        raise UsageError(f"the budgets have different baselines ({', '.join(sorted(baselines))}): a curve compares one")
    baseline = baselines.pop()
    compared = [c for c in studies[0][4] if c != baseline and all(c in s[4] for s in studies)]
    return [s[:4] for s in sorted(studies, key=lambda s: s[0]["steps"])], baseline, compared


def budget_curve(folders: list[Path]) -> pd.DataFrame:
    """One study published at several budgets (``euclip study --publish``), as a curve: a row per
    budget and group with the group's ceiling (the best score any model can expect), the baseline's
    mean, each other configuration's paired difference to it [95%] and its shortfall from the ceiling
    over the baseline's (a ratio that stays put while the difference in points narrows is the ceiling
    drawing near, not a catching up), and the noise floor's paired sd and paired sampling error of
    the group. The configurations shown are those every budget has."""
    names = SUITE_COLUMNS["world"]
    studies, baseline, compared = _budgets(folders)
    table = []
    for regime, rows, noise, _ in studies:
        steps = regime["steps"]
        for metric in CURVE_METRICS:
            base, floor = rows.loc[(baseline, metric)], noise.loc[metric]
            ceiling = floor["ceiling"]
            row = {"steps": f"{steps:,}", "seeds": int(base["n_seeds"]), "group": names[metric],
                   "ceiling": f"{ceiling:.1f}", baseline: f"{base['mean']:.1f}"}
            for config in compared:
                r = rows.loc[(config, metric)]
                row[f"Δ {config} [95%]"] = _interval(r["diff_mean"], r["diff_low"], r["diff_high"])
                # "–" where the baseline is at the ceiling: no ratio to take.
                row[f"{config}'s shortfall ÷ {baseline}'s"] = ("–" if base["mean"] >= ceiling else
                                                               f"{(ceiling - r['mean']) / (ceiling - base['mean']):.2f}")
            row["paired Δ sd"] = f"{floor['paired_sd_median']:.2f}"
            row["paired sampling error"] = f"{floor['paired_sampling_se_median']:.2f}"
            table.append(row)
    return pd.DataFrame(table)


def budget_trend(folders: list[Path]) -> pd.DataFrame:
    """How each configuration's paired difference to the baseline changes from the fewest steps to the
    most: the change with Welch's 95% interval (the two budgets' runs are separate trainings, treated as
    unpaired; ``stats.welch_difference``),
    named only where that interval excludes 0 ("gains on" or "loses ground to" the baseline; otherwise
    "undetermined"), beside the baseline's distance from the group's ceiling at the last budget (a gain
    in points there may be the ceiling's, which the curve's shortfall ratios show)."""
    from euclip_cli.stats import Estimate, welch_difference

    names = SUITE_COLUMNS["world"]
    studies, baseline, compared = _budgets(folders)
    (start, early, _, _), (end, late, noise, _) = studies[0], studies[-1]
    first, last = start["steps"], end["steps"]
    if first == last:
        raise UsageError("a trend needs the study at two budgets or more")

    def delta(rows: pd.DataFrame, config: str, metric: str) -> Estimate:
        r = rows.loc[(config, metric)]
        return Estimate(int(r["diff_n"]), r["diff_mean"], None if pd.isna(r["diff_sd"]) else r["diff_sd"], None, None)

    table = []
    for config in compared:
        for metric in CURVE_METRICS:
            a, b = delta(early, config, metric), delta(late, config, metric)
            change = welch_difference(b, a)
            reading = ("undetermined (one seed)" if change is None else f"gains on {baseline}" if change[1] > 0
                       else f"loses ground to {baseline}" if change[2] < 0 else "undetermined")
            table.append({"config": config, "group": names[metric], f"Δ at {first:,} steps": f"{a.mean:+.1f}",
                          f"Δ at {last:,} steps": f"{b.mean:+.1f}",
                          "change [95%, Welch]": "–" if change is None else _interval(*change),
                          "reading": reading,
                          f"{baseline} below its ceiling at {last:,} steps":
                              f"{noise.loc[metric, 'ceiling'] - late.loc[(baseline, metric), 'mean']:.1f}"})
    return pd.DataFrame(table)


# A mean at its ceiling has no shortfall left and no logarithm: it is fitted as this many points short,
# below the sampling error of any world task (1,000 images: 0.3 points at 99%). Seeds that agree exactly
# are given this spread too, so that no budget's point weighs without bound.
SHORTFALL_FLOOR = 0.1
# A fitted curve is shown only where its chi-squared against the seed noise leaves at least this p-value.
FIT_LEVEL = 0.05


def _published_seeds(folder: Path, needs: str = "a curve fit reads each budget's seeds") -> pd.DataFrame:
    path = folder / "seeds.csv"
    if not path.exists():
        raise UsageError(f"{path} is missing: {needs}, which a study publishes from euclip's seeds.csv on: "
                         f"publish the study again (euclip study --recipe NAME ... --publish {folder})")
    return pd.read_csv(path)


def _steps(samples: float, batch: int) -> str:
    """Samples as steps of ``batch``."""
    return f"{samples / batch:,.0f}"


def budget_fit(folders: list[Path], metric: str = "main") -> pd.DataFrame:
    """One study published at several budgets, as fitted curves where they fit: each configuration's
    shortfall from the metric's ceiling (its mean over seeds) as a power law of the samples seen,
    weighted by each budget's seed noise (``stats.fit_power_law``), with the fit's chi-squared test
    against that noise. A curve is shown only where the test passes (p >= ``FIT_LEVEL``; never from two
    budgets, which any curve fits). For each configuration whose curve and the baseline's both fit: the
    difference of their exponents with a Student's t interval (their standard errors combined, at the
    fewest seeds any budget has less one degrees of freedom; unpaired, so wider than the seeds' pairing
    would give), named "falls faster" or "slower" only where it excludes 0, and where the fitted curves
    cross if that lies within the budgets measured; a crossing outside them would be an extrapolation
    and is not given."""
    from euclip_cli.stats import crossing, fit_power_law, t_quantile

    studies, baseline, _ = _budgets(folders)
    budgets = []
    for regime, _, noise, folder in studies:
        seeds = _published_seeds(folder)
        seeds = seeds[seeds["metric"] == metric].pivot(index="seed", columns="config", values="value")
        budgets.append((regime["samples"], seeds.dropna(), noise.loc[metric, "ceiling"], regime["batch_size"]))
    if len({b[0] for b in budgets}) < 2:
        raise UsageError("a curve fit needs the study at two budgets or more")
    configs = [c for c in budgets[0][1].columns if all(c in b[1].columns for b in budgets)]
    lowest, highest, batch = budgets[0][0], budgets[-1][0], budgets[0][3]
    fewest = min(len(b[1].index) for b in budgets)

    def fitted(config: str):
        short, variances = [], []
        for _, values, ceiling, _ in budgets:
            scores = values[config]
            gap = max(SHORTFALL_FLOOR, ceiling - scores.mean())
            sd = max(SHORTFALL_FLOOR, scores.std(ddof=1)) if len(scores) > 1 else math.nan
            short.append(gap)
            variances.append(sd ** 2 / len(scores) / gap ** 2)  # the mean's variance, on the log scale
        return None if any(math.isnan(v) for v in variances) else fit_power_law([b[0] for b in budgets], short,
                                                                                  variances)

    fits = {config: fitted(config) for config in configs}

    def fits_well(config: str) -> bool:
        fit = fits[config]
        return fit is not None and fit.p_value is not None and fit.p_value >= FIT_LEVEL

    table = []
    for config in configs:
        fit = fits[config]
        row = {"config": config,
               "fit (χ², df, p)": "one seed: no noise to test against" if fit is None else
               f"{fit.chi2:.1f}, {fit.df}, " + ("–: two budgets fit any curve" if fit.p_value is None else
                                                f"{fit.p_value:.3f}: " + ("fits" if fits_well(config) else "does not fit"))}
        if not fits_well(config):
            row |= {f"exponent [{metric}] ± se": "not shown", f"fitted shortfall at {lowest // batch:,} / "
                    f"{highest // batch:,} steps": "not shown"}
            if config != baseline:
                row |= {f"exponent − {baseline}'s [95%, t]": "–: its curve does not fit", "fitted curves cross": "–"}
            table.append(row)
            continue
        law = fit.law
        row |= {f"exponent [{metric}] ± se": f"{law.exponent:.3f} ± {fit.exponent_se:.3f}",
                f"fitted shortfall at {lowest // batch:,} / {highest // batch:,} steps":
                    f"{law.at(lowest):.1f} / {law.at(highest):.1f}"}
        if config != baseline and fits_well(baseline):
            base = fits[baseline]
            diff = law.exponent - base.law.exponent
            half = t_quantile(0.975, fewest - 1) * math.hypot(fit.exponent_se, base.exponent_se)
            trend = "falls faster" if diff - half > 0 else "falls slower" if diff + half < 0 else "undetermined"
            row[f"exponent − {baseline}'s [95%, t]"] = f"{diff:+.3f} [{diff - half:+.3f}, {diff + half:+.3f}]: {trend}"
            at = crossing(law, base.law)
            row["fitted curves cross"] = ("never (parallel)" if at is None else
                                          f"at {_steps(at, batch)} steps, within the budgets measured"
                                          if lowest <= at <= highest else
                                          "outside the budgets measured (an extrapolation: not given)")
        elif config != baseline:
            row |= {f"exponent − {baseline}'s [95%, t]": f"–: {baseline}'s curve does not fit", "fitted curves cross": "–"}
        table.append(row)
    return pd.DataFrame(table).fillna("baseline")


def _worth(score: float, curve: list[tuple[int, float]]) -> str:
    """The baseline's steps whose measured ``curve`` ((steps, mean) by steps) reaches ``score``, linear
    in log steps between adjacent budgets; "< FIRST" or "> LAST" outside the curve, where it would be an
    extrapolation."""
    (first, low), (last, high) = curve[0], curve[-1]
    if score < low:
        return f"< {first:,}"
    if score > high:
        return f"> {last:,}"
    for (s0, m0), (s1, m1) in zip(curve, curve[1:]):
        if m0 <= score <= m1:
            share = 0.0 if m1 == m0 else (score - m0) / (m1 - m0)
            return f"{math.exp(math.log(s0) + share * (math.log(s1) - math.log(s0))):,.0f}"
    raise AssertionError("a rising curve holds every score between its ends")


def budget_worth(folders: list[Path], metric: str = "main") -> pd.DataFrame:
    """An equivalent-budget yardstick, the unit scaling-law comparisons of training procedures use: how
    many of the baseline's steps each configuration's score at each budget is worth, read off the
    baseline's own measured curve (its mean at each budget, linear in log steps between them), at the
    configuration's mean and at the ends of its 95% interval over seeds (the baseline curve's own noise
    is not in that interval). Only within the baseline's measured budgets; outside them, "<" or ">" its
    first or last. Refused where the baseline's curve does not rise with the budget, which no score can
    be read off."""
    names = SUITE_COLUMNS["world"]
    studies, baseline, compared = _budgets(folders)
    curve = [(regime["steps"], float(rows.loc[(baseline, metric), "mean"])) for regime, rows, _, _ in studies]
    if len({s for s, _ in curve}) < 2:
        raise UsageError("a yardstick needs the study at two budgets or more")
    if any(m1 <= m0 for (_, m0), (_, m1) in zip(curve, curve[1:])):
        raise UsageError(f"{baseline}'s {names.get(metric, metric)} does not rise with the budget "
                         f"({', '.join(f'{m:.1f}' for _, m in curve)}): no score can be read off it")
    table = []
    for config in compared:
        for regime, rows, _, _ in studies:
            r = rows.loc[(config, metric)]
            worth = _worth(r["mean"], curve)
            ends = ("" if pd.isna(r["ci_low"]) else
                    f" [{_worth(r['ci_low'], curve)}, {_worth(r['ci_high'], curve)}]")
            table.append({"config": config, "steps": f"{regime['steps']:,}",
                          f"{names.get(metric, metric)} [95%]": (f"{r['mean']:.1f}" + ("" if pd.isna(r["ci_low"]) else
                                                                 f" [{r['ci_low']:.1f}, {r['ci_high']:.1f}]")),
                          f"worth {baseline}'s steps [95%]": worth + ends})
    return pd.DataFrame(table)


def contrast_table(folder: Path, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """Pairs of one published study's configurations, each against the other on the seeds both ran, where
    the study's baseline is neither (say a recipe with and without a learning-rate multiplier): a row per
    pair with how far each one's learnable scalars moved (``regime.json``: the mean over seeds of the
    final value) and the paired difference on each of ``CURVE_METRICS``'s groups with its Student's t 95%
    interval, from the per-seed values (``seeds.csv``). Raw intervals: such a pair is a reading beside the
    study's claims, not one of them. A configuration study.csv says did not learn is marked so, its pair
    read as one at the chance floor."""
    from euclip_cli.stats import did_not_learn, paired_difference

    seeds = _published_seeds(folder, "a contrast pairs the seeds")
    regime = read_json(folder / "regime.json")
    ran = list(dict.fromkeys(seeds["config"]))
    for name in (n for pair in pairs for n in pair):
        if name not in ran:
            raise UsageError(f"contrast: {folder.name} has no configuration '{name}' (it has {', '.join(ran)})")
    names = SUITE_COLUMNS["world"]
    values = {config: {metric: dict(zip(group["seed"], group["value"]))
                       for metric, group in by_config.groupby("metric")}
              for config, by_config in seeds.groupby("config")}

    def moved(config: str) -> str:
        scalars = [r for r in regime["scalars"] if r["config"] == config]
        return "; ".join(f"{r['scalar']} {r['init']:.3g} → {r['final']:.3g}" for r in scalars) or MISSING

    idle = did_not_learn(pd.read_csv(folder / "study.csv").to_dict("records"))

    def named(config: str) -> str:
        return f"{config} (did not learn)" if config in idle else config

    table = []
    for config, against in pairs:
        row = {"config": named(config), "against": named(against), "its scalars (initial → final)": moved(config),
               "against's scalars": moved(against)}
        for metric in CURVE_METRICS:
            diff = paired_difference(values[config].get(metric, {}), values[against].get(metric, {}), "t")
            row[f"Δ {names[metric]} [95%]"] = MISSING if diff is None else _interval(diff.mean, diff.low, diff.high)
        row["seeds"] = len(set(values[config].get("main", {})) & set(values[against].get("main", {})))
        table.append(row)
    return pd.DataFrame(table)


def noise_table(folder: Path) -> Optional[pd.DataFrame]:
    """A study's noise floor (``noise.csv``, in points) as a display table; None when it has none."""
    path = folder / "noise.csv"
    if not path.exists() or not path.stat().st_size:
        return None
    names = SUITE_COLUMNS["world"]

    def points(value: float) -> str:  # "–": not computable (one configuration, or tasks not the world's)
        return "–" if pd.isna(value) else f"{value:.2f}"

    shown = []
    for _, r in pd.read_csv(path).iterrows():
        metric = r["metric"]
        shown.append({"metric": names[metric] if metric in names else TASKS[metric].name,
                      "seed sd, median (range)": f"{r['seed_sd_median']:.2f} ({r['seed_sd_min']:.2f}–{r['seed_sd_max']:.2f})",
                      "paired Δ sd, median": points(r["paired_sd_median"]),
                      "evaluation sampling error": points(r["sampling_se_median"]),
                      "paired sampling error": points(r.get("paired_sampling_se_median", float("nan")))})
    return pd.DataFrame(shown)
