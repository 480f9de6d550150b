"""Atomic checkpoints of plain tensors and JSON-able metadata (``torch.load(weights_only=True)`` works)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch


def save(state: dict, folder: Path, step: int, keep: int) -> Path:
    """Write ``step_N.pt`` through a temporary file and a rename, point ``latest.pt`` at it, prune old ones."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step}.pt"
    tmp = folder / f".step_{step}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    latest_tmp = folder / ".latest.tmp"
    latest_tmp.write_text(path.name)
    os.replace(latest_tmp, folder / "latest")
    for old in sorted(folder.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))[:-keep]:
        old.unlink()
    return path


def latest(folder: Path) -> Optional[Path]:
    pointer = folder / "latest"
    if not pointer.exists():
        return None
    path = folder / pointer.read_text().strip()
    return path if path.exists() else None


def load(path: Path, map_location: str = "cpu") -> dict:
    return torch.load(path, map_location=map_location, weights_only=True)
