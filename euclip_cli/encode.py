"""A trained run's model, and its embeddings of images and texts: what evaluation and the analyses share.

Image embeddings are cached per checkpoint in ``RUN/features/``, so a task's images are
encoded once whether evaluation or an analysis asks first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from euclip_cli import config as C
from euclip_cli.device import resolve_precision
from euclip_cli.errors import UsageError
from euclip_cli.model import EuclipModel, initial_model, load_run_weights
from euclip_cli.rundir import RunDir, atomic_path

# Bump when a change alters image embeddings (transforms, encoders): cached features are keyed by it.
FEATURES = "features-1"


def load_model(run: RunDir, device: torch.device, at_init: bool = False
               ) -> tuple[EuclipModel, C.Config, Optional[Path], int]:
    """``(model, config, checkpoint, step)`` of a run's latest checkpoint, rebuilt from the config stored in it;
    with ``at_init`` the untrained model the run started from (checkpoint None, step 0).

    Only the weights reach ``device``: the checkpoint is read on the CPU, and its optimizer and RNG
    state are never moved. On a GPU the encoders run under the run's training precision (autocast).
    """
    if at_init:
        if not run.config_file.exists():
            raise UsageError(f"{run.path} is not a run directory (no {run.config_file.name}): name a run's folder")
        cfg, found, step = C.run_config(run), None, 0
        model = initial_model(cfg, run.path.parent)
    else:
        found, state = run.readable_checkpoint()
        if found is None:
            raise UsageError(f"{run.path} has no checkpoint: train it first (euclip train --recipe RECIPE)")
        cfg, step = C.from_dict(state["config"], f"{found}'s stored config"), state["step"]
        model = EuclipModel(cfg)
        load_run_weights(model, state, found)
    if device.type == "cuda":
        model.encoder_precision = resolve_precision(cfg.train.precision, device)
    return model.to(device).eval(), cfg, found, step


@torch.no_grad()
def embed_images(model: EuclipModel, batches: Iterable, device: torch.device,
                 on_images: Callable[[int], None] = lambda n: None) -> tuple[torch.Tensor, list]:
    """``(embeddings (N, D), labels)`` of ``(images, labels)`` batches; labels are kept as a flat list."""
    embs, labels = [], []
    for images, label in batches:
        embs.append(model.encode_image(images.to(device)))
        labels.extend(label if isinstance(label, (list, tuple)) else label.tolist())
        on_images(len(images))
    return torch.cat(embs), labels


@torch.no_grad()
def embed_image_trunks(model: EuclipModel, batches: Iterable, device: torch.device,
                       on_images: Callable[[int], None] = lambda n: None) -> tuple[torch.Tensor, list]:
    """``(features (N, F), labels)``: the image tower's fp32 features before its projection
    (``towers.image_trunk_features``, what linear probes read) under the encoders' precision, on the host."""
    from euclip_cli.device import autocast_factory
    from euclip_cli.towers import image_trunk_features

    found, labels = [], []
    for images, label in batches:
        with autocast_factory(model.encoder_precision, device)():
            found.append(image_trunk_features(model.clip, images.to(device)).float().cpu())
        labels.extend(label if isinstance(label, (list, tuple)) else label.tolist())
        on_images(len(images))
    return torch.cat(found), labels


@torch.no_grad()
def embed_texts(model: EuclipModel, tokenizer, texts: list[str], batch_size: int = 256) -> torch.Tensor:
    """``(len(texts), D)`` output-space text embeddings."""
    # The tokens stay on the host: the text tower plans its groups there and copies them over itself.
    return torch.cat([model.encode_text(tokenizer(texts[i:i + batch_size]))
                      for i in range(0, len(texts), batch_size)])


def files_identity(folder: Path) -> Optional[str]:
    """``folder``'s files as a digest of each regular file's path under it and its size (an evaluation set, a run's
    training shards); None when it holds none. Two copies of a set that differ in any file's presence or size (a
    subset, another release) differ here; a listing reads no bytes, so a file rewritten at its own size does not."""
    import hashlib

    if not folder.is_dir():
        return None
    listing = sorted(f"{p.relative_to(folder)}\t{p.stat().st_size}" for p in folder.rglob("*") if p.is_file())
    return hashlib.sha256("\n".join(listing).encode()).hexdigest()[:16] if listing else None


class FeatureCache:
    """Image embeddings of one checkpoint per task (``name``), so a task's images are encoded once.

    Text prototypes are cheap and always recomputed; a new checkpoint gets a new folder. Images are kept per
    source, since two sources share task names, not images: an embedded world's by its fingerprint (``world``),
    other sets by their files (``files``, ``files_identity``; ``with_files`` names them). Images of a source of
    unknown identity are computed and never cached.
    """

    def __init__(self, folder: Optional[Path], world: Optional[str] = None, files: Optional[str] = None):
        self.folder, self.world, self.files = folder, world, files

    def with_files(self, files: Optional[str]) -> FeatureCache:
        """This cache, for images read from files of this identity (``files_identity``)."""
        return FeatureCache(self.folder, self.world, files)

    def get(self, name: str, compute: Callable[[], tuple[torch.Tensor, list]],
            per_world: bool = False) -> tuple[torch.Tensor, list]:
        """``per_world``: the images are the embedded world's, else the files' (``with_files``)."""
        source = self.world if per_world else self.files
        if self.folder is None or source is None:
            return compute()
        path = self.folder / (f"{name}@{source}".replace("/", "__") + ".pt")
        if path.exists():
            try:
                cached = torch.load(path, map_location="cpu", weights_only=True)
                return cached["image_emb"], cached["labels"]
            # A damaged cache file (cut, or not this cache's): computed again and replaced, as a cache may be.
            except Exception:  # noqa: BLE001 (torch raises several kinds for a damaged file)
                pass
        image_emb, labels = compute()
        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            torch.save({"image_emb": image_emb.cpu(), "labels": labels}, tmp)
        return image_emb, labels


def feature_cache(run: RunDir, ckpt: Optional[Path], model: EuclipModel, world: Optional[str] = None) -> FeatureCache:
    """The cache of one checkpoint, keyed by the file itself (a run trained again writes new files)
    and by the encoders' precision (features from a GPU's autocast are not the CPU's fp32 ones), its
    world tasks by ``world`` (the embedded world's fingerprint). ``ckpt`` None: the untrained model, which
    the run's stored config alone fixes."""
    precision = "" if model.encoder_precision == "fp32" else f"-{model.encoder_precision}"
    weights = "init" if ckpt is None else f"{ckpt.stem}-{ckpt.stat().st_mtime_ns}"
    return FeatureCache(run.features_dir / f"{weights}-{FEATURES}{precision}", world)
