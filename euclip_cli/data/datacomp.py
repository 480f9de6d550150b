"""DataComp's pools and the paper's filtered subsets, computed from the pool's metadata.

DataComp publishes each pool's metadata (parquet: ``uid``, ``url``, ``text``, CLIP scores,
``face_bboxes``; npz: OpenAI CLIP embeddings) but no uid lists for its baselines, so the
subsets the paper trains on are recomputed here, as DataComp's ``baselines/apply_filter.py``
computes them:

- ``clip-l14-30``: the top 30% of the *whole pool* by ``clip_l14_similarity_score``. The
  threshold is the score at rank ``int(0.3 N)`` of the descending sort and every row scoring
  at least that is kept, so ties at the cut are all in.
- ``image-based-clip-l14-30``: the same threshold, then DataComp's caption filter (fastText
  says English, more than one fastText token, more than 5 characters), then its
  ImageNet-cluster test: a sample is kept iff the pool centroid nearest to its L/14 image
  embedding (largest dot product) is the nearest centroid of at least one ImageNet-1k train
  image. Centroids and ImageNet embeddings are DataComp's published assets (``ASSETS``).

A subset is written as DataComp writes uid files: a sorted NumPy ``u8,u8`` array (the high
and low 64 bits of the 128-bit hex uid). A uid listed twice in the pool is selected once.
Any such file (another baseline's, one's own filter) can also serve as the subset (``UID_FILE``);
a uid the file lists k times is upsampled to k samples, as DataComp's resharder does. The
resharder copies one downloaded sample k times; here the row is put k times in the download
list (each listing is its own request), so no second pass over the shards is needed.

Everything here is importable without a network; fetching is the ``download`` runner's (``download/webshards.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from euclip_cli.errors import UsageError

FILTERS = ("none", "clip-l14-30", "image-based-clip-l14-30")
# A subset given as a uid file (another baseline's, or one's own filter) instead of a named filter.
UID_FILE = "uids"
SCORE_COLUMN = "clip_l14_similarity_score"
FRACTION = 0.3
# The columns img2dataset needs to fetch a selected sample (face boxes: for blurring).
DOWNLOAD_COLUMNS = ("url", "text", "uid", "face_bboxes")
UID_DTYPE = np.dtype("u8,u8")


# DataComp's global batch at the small and medium scales, which the EuCLIP paper keeps.
BATCH = 4096


@dataclass(frozen=True)
class Scale:
    repo: str
    pool: int  # metadata rows (= DataComp's samples-seen budget)

    @property
    def steps(self) -> int:
        """Optimizer steps of the scale's budget: 3,125 (small), 31,250 (medium)."""
        return self.pool // BATCH


SCALES = {
    "small": Scale("mlfoundations/datacomp_small", 12_800_000),
    "medium": Scale("mlfoundations/datacomp_medium", 128_000_000),
}


def scale_for_steps(steps: int) -> str:
    """The published scale a run of ``steps`` optimizer steps is read against: the largest whose
    budget it reaches, else the smallest. The EuCLIP paper finds its medium-scale ordering does not
    hold at small scale, where the budget keeps Euclidean and hyperbolic geometries from catching up;
    a shorter run is nearer the small scale's regime than the medium's."""
    reached = [name for name, scale in SCALES.items() if steps >= scale.steps]
    return reached[-1] if reached else next(iter(SCALES))


@dataclass(frozen=True)
class Asset:
    url: str
    sha256: str


_ASSET_RELEASE = "https://github.com/sagadre/datacomp_baseline_assets/releases/download/v0.1.0-alpha"
# DataComp's image-based filter assets, with the checksums DataComp's own downloader pins.
ASSETS: dict[str, Asset] = {
    "lid.176.bin": Asset("https://dl.fbaipublicfiles.com/fasttext/supervised-models/lid.176.bin",
                         "7e69ec5451bc261cc7844e49e4792a85d7f09c06789ec800fc4a44aec362764e"),
    "small_centroids_l14.pt": Asset(f"{_ASSET_RELEASE}/small_centroids_l14.pt",
                                    "23c66a05e49ad77283c1e2b33355c7eb088ac332a944c97ff85d5dfd48a5b251"),
    "medium_centroids_l14.pt": Asset(f"{_ASSET_RELEASE}/medium_centroids_l14.pt",
                                     "028b1721b1d0f139c565b6b0ac99f8a1756f4bae89c36b0ec6d1c6ea9b6f112d"),
    **{f"in1k_clip_vit_l14_{i}.pt": Asset(f"{_ASSET_RELEASE}/in1k_clip_vit_l14_{i}.pt", sha)
       for i, sha in enumerate(["304990fd492f40ba90072b80af78d6e8edcab9d042476ef513e03441cf53743b",
                                "72f008e6aa3bfb54174fa322963215337f843fc90fd642a9dccc815dd9e7ee76",
                                "83c3cc6503b8a50a22cac7023ca6cd61b130ab9725db2a7519f1bec5cabf5493",
                                "83faa289f847799ddcd438e5b74df1cb5973c345674896d10ba31ea48bc63804",
                                "067a45f4a140a93371876510a2fd9198a89ac1d194ae4063a51b45a6da69cadf"])},
}


def assets_for(scale: str) -> list[str]:
    """The asset files the image-based filter of ``scale`` needs."""
    return ["lid.176.bin", f"{scale}_centroids_l14.pt"] + [f"in1k_clip_vit_l14_{i}.pt" for i in range(5)]


class LanguageModel(Protocol):
    def predict(self, texts: list[str], k: int) -> tuple[list, list]: ...


# ------------------------------------------------------------------ uids

def uid_pairs(uids: Sequence[str]) -> np.ndarray:
    """Hex uids (32 chars) -> (n,) ``u8,u8``: first 16 hex digits, next 16 (DataComp's convention)."""
    if any(len(u) != 32 for u in uids):
        bad = next(u for u in uids if len(u) != 32)
        raise UsageError(f"uid {bad!r} is not 32 hex digits (DataComp's 128-bit uid)")
    # One hex decode of the concatenation, read as big-endian 64-bit halves: DataComp's pools hold
    # ~10^8 uids, and int(uid, 16) per half took minutes where this takes seconds.
    halves = np.frombuffer(bytes.fromhex("".join(uids)), dtype=">u8").reshape(-1, 2)
    out = np.empty(len(uids), dtype=UID_DTYPE)
    out["f0"], out["f1"] = halves[:, 0], halves[:, 1]
    return out


def uid_hex(pairs: np.ndarray) -> list[str]:
    return [f"{int(hi):016x}{int(lo):016x}" for hi, lo in zip(pairs["f0"], pairs["f1"])]


def load_uids(path: Path) -> np.ndarray:
    """A DataComp uid file (``.npy`` of ``u8,u8``), sorted, repeats kept: a uid listed k times is
    upsampled to k samples, as DataComp's resharder writes it. (n,) u8,u8."""
    try:
        pairs = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise UsageError(f"--uids {path} is not a NumPy .npy file ({err})") from None
    if pairs.dtype != UID_DTYPE or pairs.ndim != 1:
        raise UsageError(f"--uids {path} holds {pairs.dtype} of shape {pairs.shape}; a DataComp uid file is a 1-D "
                         f"'u8,u8' array")
    return np.sort(pairs)


def listings(sorted_pairs: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """(m,) int: how many times each of ``pairs`` is listed in ``sorted_pairs`` (the resharder's
    ``searchsorted`` left/right count)."""
    return np.searchsorted(sorted_pairs, pairs, side="right") - np.searchsorted(sorted_pairs, pairs, side="left")


def contains(sorted_pairs: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """(m,) bool: which of ``pairs`` are in ``sorted_pairs`` (binary search, as DataComp's resharder does)."""
    at = np.searchsorted(sorted_pairs, pairs)
    found = at < len(sorted_pairs)
    found[found] = sorted_pairs[at[found]] == pairs[found]
    return found


def save_uids(pairs: np.ndarray, path: Path) -> None:
    """Sorted, as DataComp's resharder expects (it binary-searches the file); atomic."""
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, np.sort(pairs))
    tmp.replace(path)


# ------------------------------------------------------------------ the filters

def score_threshold(scores: np.ndarray, fraction: float = FRACTION) -> float:
    """The score at rank ``int(fraction * N)`` of the descending sort; keep ``score >= threshold``.

    Keeps at least ``int(fraction * N) + 1`` rows (DataComp's off-by-one kept on purpose: its
    published subset sizes come from it) and every row tied with the last one. NaN scores sort
    last and never pass ``>=``.
    """
    ranked = -np.sort(-np.asarray(scores, dtype=np.float64))
    return float(ranked[min(int(len(ranked) * fraction), len(ranked) - 1)])


def caption_mask(texts: Sequence[str], language: LanguageModel, tokenize: Callable[[str], list]) -> np.ndarray:
    """DataComp's caption filter: English per fastText, > 1 fastText token, > 5 characters. (n,) bool."""
    if len(texts) == 0:
        return np.zeros(0, dtype=bool)
    # fastText predicts one line at a time: a newline inside a caption would be an error.
    labels, _ = language.predict([t.replace("\n", " ") for t in texts], k=1)
    english = np.array([lab[0] == "__label__en" for lab in labels], dtype=bool)
    long_enough = np.array([len(tokenize(t)) > 1 and len(t) > 5 for t in texts], dtype=bool)
    return english & long_enough


def nearest_centroid(features, centroids, chunk: int = 4096):
    """Index of the centroid with the largest dot product, for each row.

    Args:
        features: (N, D) tensor, any float dtype (DataComp stores fp16), on any device.
        centroids: (K, D) float32 tensor on the device to compute on.
        chunk: rows per matmul; the (chunk, K) score block is the memory peak.
    Returns:
        (N,) int64 tensor on the CPU.
    """
    import torch

    out = torch.empty(features.shape[0], dtype=torch.long)
    with torch.no_grad():
        for start in range(0, features.shape[0], chunk):
            # fp32 so that near-ties between centroids resolve as in DataComp's code.
            block = features[start:start + chunk].to(centroids.device, torch.float32)
            out[start:start + chunk] = (block @ centroids.T).argmax(dim=1).cpu()
    return out


def imagenet_clusters(imagenet_features, centroids, chunk: int = 4096):
    """(K,) bool tensor: which centroids are the nearest one of at least one ImageNet image."""
    import torch

    hit = torch.zeros(centroids.shape[0], dtype=torch.bool)
    hit[nearest_centroid(imagenet_features, centroids, chunk)] = True
    return hit


# ------------------------------------------------------------------ selection over a pool

@dataclass
class ImageBasedInputs:
    """What the image-based test needs besides the metadata."""
    language: LanguageModel
    tokenize: Callable[[str], list]
    centroids: object  # (K, D) float32 tensor on the compute device
    target: object  # (K,) bool tensor, from imagenet_clusters
    chunk: int = 4096


def metadata_files(metadata_dir: Path) -> list[Path]:
    files = sorted(metadata_dir.glob("*.parquet"))
    if not files:
        raise UsageError(f"no metadata (*.parquet) in {metadata_dir}")
    return files


def pool_threshold(files: list[Path], fraction: float = FRACTION,
                   on_file: Callable[[str, int, int], None] = lambda stage, done, total: None) -> tuple[float, int]:
    """The clip-l14-30 threshold over every row of the pool, and the pool's size."""
    scores = []
    for done, path in enumerate(files, start=1):
        scores.append(pq.read_table(path, columns=[SCORE_COLUMN])[SCORE_COLUMN].to_numpy(zero_copy_only=False))
        on_file("reading scores", done, len(files))
    return score_threshold(np.concatenate(scores), fraction), sum(len(s) for s in scores)


def select_rows(parquet: Path, uids: np.ndarray, filter_name: str, threshold: Optional[float],
                image_based: Optional[ImageBasedInputs], subset: Optional[np.ndarray] = None) -> np.ndarray:
    """Row indices of one metadata file (whose ``uid`` column is ``uids``) that pass ``filter_name``.
    (m,) int64, ascending."""
    if filter_name == "none":
        return np.arange(len(uids))
    if filter_name == UID_FILE:
        return np.flatnonzero(contains(subset, uid_pairs(uids.tolist())))
    columns = [SCORE_COLUMN] + (["text"] if filter_name == "image-based-clip-l14-30" else [])
    table = pq.read_table(parquet, columns=columns)
    scores = table[SCORE_COLUMN].to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(scores >= threshold)
    if filter_name == "clip-l14-30":
        return rows
    texts = table["text"].to_pylist()
    # A missing caption can be neither English nor long: it fails the caption filter.
    rows = rows[caption_mask([texts[i] or "" for i in rows], image_based.language, image_based.tokenize)]
    if len(rows) == 0:
        return rows
    import torch

    embeddings = np.load(parquet.with_suffix(".npz"))["l14_img"]  # (n_rows, 768) fp16, rows as in the parquet
    if embeddings.shape[0] != table.num_rows:
        raise UsageError(f"{parquet.with_suffix('.npz')} has {embeddings.shape[0]} embeddings for {table.num_rows} "
                         f"metadata rows; delete both files and rerun to fetch them again")
    nearest = nearest_centroid(torch.from_numpy(embeddings[rows]), image_based.centroids, image_based.chunk)
    return rows[image_based.target[nearest].numpy()]


@dataclass
class Selection:
    """The subset, per metadata file: row indices to download, and the uid file's content."""
    rows: dict[str, np.ndarray]  # metadata file name -> selected rows (a repeated uid's row once per listing)
    uids: np.ndarray  # (n,) u8,u8, sorted; a uid-file selection keeps the file's repeats
    pool: int
    threshold: Optional[float]
    repeats: int = 0  # extra listings of uids a uid file names more than once (upsampling)


def select(metadata_dir: Path, filter_name: str, image_based: Optional[ImageBasedInputs] = None,
           on_file: Callable[[str, int, int], None] = lambda stage, done, total: None,
           subset: Optional[np.ndarray] = None) -> Selection:
    """Apply ``filter_name`` (or, for ``UID_FILE``, the sorted uid array ``subset``) to the pool in
    ``metadata_dir``, one metadata file at a time."""
    if filter_name not in FILTERS + (UID_FILE,):
        raise UsageError(f"unknown filter '{filter_name}': choose one of {', '.join(FILTERS)}")
    if filter_name == "image-based-clip-l14-30" and image_based is None:
        raise UsageError("the image-based filter needs its language model, centroids and ImageNet clusters")
    if filter_name == UID_FILE and subset is None:
        raise UsageError("a uid-file selection needs the uids")
    files = metadata_files(metadata_dir)
    scored = filter_name not in ("none", UID_FILE)
    threshold, pool = pool_threshold(files, FRACTION, on_file) if scored else (None, None)
    per_file, pairs = {}, []
    for done, parquet in enumerate(files, start=1):
        uids = pq.read_table(parquet, columns=["uid"])["uid"].to_numpy(zero_copy_only=False)
        rows = select_rows(parquet, uids, filter_name, threshold, image_based, subset)
        per_file[parquet.name] = rows
        pairs.append(uid_pairs(uids[rows].tolist()))
        on_file("filtering", done, len(files))
    if pool is None:
        pool = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    everything = np.concatenate(pairs) if pairs else np.empty(0, UID_DTYPE)
    # Keep the first row of each uid (files in sorted order, rows ascending).
    unique, first = np.unique(everything, return_index=True)
    keep = np.zeros(len(everything), dtype=bool)
    keep[first] = True
    offset, repeats = 0, 0
    for (name, rows), file_pairs in zip(per_file.items(), pairs):
        kept = keep[offset:offset + len(rows)]
        per_file[name] = rows[kept]
        if filter_name == UID_FILE:
            counts = listings(subset, file_pairs[kept])
            per_file[name] = np.repeat(per_file[name], counts)
            repeats += int((counts - 1).sum())
        offset += len(rows)
    if filter_name == UID_FILE:
        unique = np.repeat(unique, listings(subset, unique))
    return Selection(per_file, unique, pool, threshold, repeats)


def write_download_list(metadata_dir: Path, selection: Selection, out_dir: Path, bbox: bool) -> int:
    """One parquet per metadata file with the selected rows' url, text, uid (and face boxes).

    This list is what img2dataset reads, so only the subset's images are ever requested.
    Returns the number of rows written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    total = 0
    for name, rows in selection.rows.items():
        if len(rows) == 0:  # img2dataset is not given empty files
            continue
        available = pq.ParquetFile(metadata_dir / name).schema_arrow.names
        columns = [c for c in DOWNLOAD_COLUMNS if c in available and (bbox or c != "face_bboxes")]
        table = pq.read_table(metadata_dir / name, columns=columns).take(pa.array(rows, type=pa.int64()))
        tmp = out_dir / f".{name}.tmp"
        pq.write_table(table, tmp)
        tmp.replace(out_dir / name)
        total += len(rows)
    return total
