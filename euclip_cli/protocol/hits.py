"""Per-example outcomes of an evaluation as its eval.jsonl line keeps them (``"hits"``): which images a
model classified right (top-1) and which queries found their match first (retrieval R@1), so that two runs
scored on the same examples can be compared pair by pair (``stats.paired_proportion_se``). numpy only: a
study reads them without torch."""

from __future__ import annotations

import base64

import numpy as np


def pack_hits(outcomes) -> dict:
    """Per-example outcomes (``(N,)`` bool, a CPU tensor or array) as an eval line keeps them: ``{"n": N,
    "bits": base64 of the packed bits}`` (ImageNet's 50,000 images take 8 kB)."""
    flat = np.asarray(outcomes, dtype=bool).reshape(-1)
    return {"n": int(flat.size), "bits": base64.b64encode(np.packbits(flat).tobytes()).decode("ascii")}


def unpack_hits(packed: dict) -> list[bool]:
    """``pack_hits``'s outcomes, in the examples' order."""
    bits = np.unpackbits(np.frombuffer(base64.b64decode(packed["bits"]), dtype=np.uint8))
    return bits[: packed["n"]].astype(bool).tolist()
