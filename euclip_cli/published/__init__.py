"""Published numbers copied into the project, each file naming its source in its first line.

``euclip-tables.csv``: the EuCLIP paper's zero-shot results (Tables 1, 4, 5 and 8), one row per
(table, model, label). Reports put our runs beside these rows; study claims take the paper's
effects from them. ``euclip-traversal.csv``: its Tables 6 and 7, captions retrieved per image
along image traversals, one row per (table, model, filter). ``meru-tables.csv``: MERU's Tables 1
(zero-shot retrieval), 2 (zero-shot classification on 20 datasets), 3 (embedding widths) and 7 (linear
probes), one row per (table, arch, model, dataset, metric, embed_dim), each dataset beside DataComp's task of it.
``meru-table6.csv``: MERU's Table 6, each probe dataset's classes and split sizes. ``sun-li-temperature.csv``: Sun
and Li's temperature and structure ablations (their Tables 2, 6 and 7), one row per label that a
study configuration's ``paper`` key names. ``openclip-throughput.csv``: OpenCLIP's stated GPU
hours for its LAION-400M ViT-B models, from which ``euclip study --plan`` derives a training
throughput where the user has measured none. ``hycoclip-model-zoo.csv``: HyCoCLIP's released CLIP, MERU
and HyCoCLIP models (ViT-S/16, ViT-B/16, trained on GRIT), their zero-shot results as its model zoo
states them, one row per (arch, model). ``laion-scaling-grid.csv``: LAION's grid of CLIP and SigLIP runs
(Nezhurina et al., 2025), zero-shot ImageNet by image tower and samples seen, the best run of each cell's
hyperparameter sweep. pandas is imported only when a table is read.
"""

from __future__ import annotations

from pathlib import Path

EUCLIP_TABLES = Path(__file__).with_name("euclip-tables.csv")
EUCLIP_TRAVERSAL = Path(__file__).with_name("euclip-traversal.csv")
MERU_TABLES = Path(__file__).with_name("meru-tables.csv")
MERU_TABLE6 = Path(__file__).with_name("meru-table6.csv")
SUN_LI_TEMPERATURE = Path(__file__).with_name("sun-li-temperature.csv")
OPENCLIP_THROUGHPUT = Path(__file__).with_name("openclip-throughput.csv")
HYCOCLIP_MODEL_ZOO = Path(__file__).with_name("hycoclip-model-zoo.csv")
LAION_SCALING_GRID = Path(__file__).with_name("laion-scaling-grid.csv")


def euclip_tables():
    """The EuCLIP paper's published rows as a DataFrame (numbers in percent)."""
    import pandas as pd

    return pd.read_csv(EUCLIP_TABLES, comment="#")


def euclip_imagenet(table: int, model: str, label: str) -> float:
    """One published row's ImageNet zero-shot accuracy (percent)."""
    rows = euclip_tables()
    match = rows[(rows["table"] == table) & (rows["model"] == model) & (rows["label"] == label)]
    if len(match) != 1:
        raise KeyError(f"no single published row for table {table}, {model}, {label!r}")
    return float(match["imagenet"].iloc[0])


def euclip_traversal():
    """The EuCLIP paper's Tables 6 and 7 as a DataFrame, with ``filter`` named as euclip names it
    ("none", or "K=0.8" for the entailment filter of radius 0.8)."""
    import pandas as pd

    rows = pd.read_csv(EUCLIP_TRAVERSAL, comment="#")
    rows["filter"] = [f if f == "none" else f"K={k:g}" for f, k in zip(rows["filter"], rows["filter_K"])]
    return rows.drop(columns="filter_K")


def meru_tables():
    """MERU's Tables 1, 2, 3 and 7 as a DataFrame (values in percent; ``datacomp_task`` empty where DataComp
    has no task of the dataset)."""
    import pandas as pd

    return pd.read_csv(MERU_TABLES, comment="#", keep_default_na=False, dtype={"datacomp_task": str})


def meru_imagenet():
    """MERU's released models' zero-shot ImageNet accuracy (percent, its Table 2's first column), by euclip
    arch and model."""
    rows = meru_tables()
    rows = rows[(rows["table"] == 2) & (rows["dataset"] == "ImageNet")]
    return rows[["arch", "model"]].assign(imagenet=rows["value"].astype(float)).reset_index(drop=True)


def sun_li_temperature():
    """Sun and Li's Tables 6 and 7 as a DataFrame (metrics in percent), indexed by ``label``."""
    import pandas as pd

    return pd.read_csv(SUN_LI_TEMPERATURE, comment="#", dtype={"converge_step": str}).set_index("label")


def sun_li_labels() -> set[str]:
    """The labels of ``sun-li-temperature.csv``, without pandas (``euclip recipes validate`` stays light)."""
    import csv

    with SUN_LI_TEMPERATURE.open() as f:
        return {row["label"] for row in csv.DictReader(line for line in f if not line.startswith("#"))}


def openclip_throughput() -> dict[str, tuple[float, str]]:
    """Training samples per GPU-second by open_clip arch, derived from OpenCLIP's stated GPU hours:
    ``{arch: (samples_per_gpu_second, what it is)}``."""
    import pandas as pd

    rows = pd.read_csv(OPENCLIP_THROUGHPUT, comment="#")
    return {r.arch: (r.samples_seen / (r.gpu_hours * 3600),
                     f"OpenCLIP's {r.arch} on LAION-400M: {r.gpu_hours:,} {r.device} hours for {r.samples_seen / 1e9:g}B "
                     f"samples (docs/PRETRAINED.md)") for r in rows.itertuples()}


def meru_split_sizes() -> dict[str, dict[str, int]]:
    """MERU's Table 6: ``{probe dataset: {classes, train, val, test}}``."""
    import pandas as pd

    rows = pd.read_csv(MERU_TABLE6, comment="#")
    return {r.dataset: {"classes": int(r.classes), "train": int(r.train), "val": int(r.val), "test": int(r.test)}
            for r in rows.itertuples()}


def hycoclip_model_zoo():
    """HyCoCLIP's released models' zero-shot results (percent) as a DataFrame, one row per (arch, model)."""
    import pandas as pd

    return pd.read_csv(HYCOCLIP_MODEL_ZOO, comment="#")


def hycoclip_imagenet(arch: str, model: str) -> float:
    """One of HyCoCLIP's released models' zero-shot ImageNet accuracy (percent)."""
    rows = hycoclip_model_zoo()
    match = rows[(rows["arch"] == arch) & (rows["model"] == model)]
    if len(match) != 1:
        raise KeyError(f"no single HyCoCLIP model-zoo row for {arch}, {model!r}")
    return float(match["imagenet"].iloc[0])


def laion_scaling_grid():
    """LAION's grid as a DataFrame: one row per (arch, model, samples_seen), ``samples_seen`` as the grid labels
    it ("12.8M", "1.28B"), ``imagenet`` in percent."""
    import pandas as pd

    return pd.read_csv(LAION_SCALING_GRID, comment="#", dtype={"samples_seen": str})


def laion_grid_imagenet(arch: str, model: str, samples_seen: str) -> float:
    """One cell of LAION's grid: ``model``'s (CLIP or SigLIP) zero-shot ImageNet accuracy (percent) with image
    tower ``arch`` at ``samples_seen``."""
    rows = laion_scaling_grid()
    match = rows[(rows["arch"] == arch) & (rows["model"] == model) & (rows["samples_seen"] == samples_seen)]
    if len(match) != 1:
        raise KeyError(f"no single LAION grid cell for {arch}, {model!r} at {samples_seen}")
    return float(match["imagenet"].iloc[0])


def grid_samples(label: str) -> int:
    """A LAION grid label's samples seen: "12.8M" -> 12,800,000, "1.28B" -> 1,280,000,000."""
    units = {"K": 10 ** 3, "M": 10 ** 6, "B": 10 ** 9}
    if label[-1:] not in units:
        raise ValueError(f"{label!r}: a LAION grid label ends in K, M or B")
    return round(float(label[:-1]) * units[label[-1]])
