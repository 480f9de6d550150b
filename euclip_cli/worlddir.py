"""The embedded world's settings and folder: one owner for each.

``WorldSettings`` holds every setting's type, default, range and help, and the value a manifest
written before the setting existed implies; the config schema's keys (``data.world_<setting>``),
``euclip download world``'s options and the world's manifest are derived from it, and all three are
checked by ``problems``. ``WorldDir`` is a world's folder as ``RunDir`` is a run's: where its
training shards, evaluation tasks, entailment ground truth and manifest live, and what the manifest
says (stdlib only)::

    WORLD/manifest.json          the generator version, the settings and every file's size
    WORLD/train/NNNNN.tar        img2dataset's webdataset layout (and its parquet and stats files)
    WORLD/eval/<task>/           clip-benchmark's local "wds" layout; a selection task's also
                                 kinds.json (each pair's kind of negative) and text_only.json (its baseline)
    WORLD/eval/hierarchy.json    which captions entail which retrieval images
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from euclip_cli.errors import Failure
from euclip_cli.rundir import read_json

# The world's config keys: ``data.`` + this + the setting's name.
CONFIG_PREFIX = "world_"


def _setting(default: Any, help: str, low: float = -math.inf, high: float = math.inf, below: bool = False,
             since: bool = False) -> Any:
    """A field of ``WorldSettings``: its ``default``, ``help`` (the download option's), its range
    ``[low, high]`` (``[low, high)`` with ``below``) and, with ``since``, that worlds were written
    before it existed (their manifest lacks it, and their images are those of its default)."""
    return field(default=default, metadata={"help": help, "low": low, "high": high, "below": below, "since": since})


@dataclass(frozen=True)
class WorldSettings:
    """What an embedded world is generated from (``data/world.py`` draws it; equal settings, equal bytes)."""

    seed: int = _setting(0, "Everything is deterministic from this seed.", low=-(2 ** 63), high=2 ** 63 - 1)  # an int64, as torch seeds are
    samples: int = _setting(100_000, "Training pairs to write.", low=1)
    # The tasks do not depend on the mismatch, so worlds that differ only in it evaluate on the same images.
    mismatch: float = _setting(0.1, "Fraction of pairs whose caption describes another image.", low=0, high=1,
                               below=True)
    eval_size: int = _setting(1000, "Images per evaluation task.", low=1)
    # Below 0.3 a small object's radius is under 3 px, too few pixels to draw its shape; above 2 a large
    # one spills out of its cell over the image's edge. Below 1 the main task stays below its ceiling at
    # budgets where the default world's nears it (docs/results/budget.md).
    object_scale: float = _setting(1.0, "Every object's radius, in training and evaluation images, times this "
                                        "(below 1: smaller shapes, a harder world).", low=0.3, high=2.0, since=True)


SETTINGS = tuple(fields(WorldSettings))


def config_key(name: str) -> str:
    """The run config's key for setting ``name`` (``data.world_mismatch``)."""
    return f"data.{CONFIG_PREFIX}{name}"


def allowed(name: str) -> str:
    """Setting ``name``'s range, as messages print it."""
    m = next(f for f in SETTINGS if f.name == name).metadata
    high = "∞" if m["high"] == math.inf else _number(m["high"])
    return f"[{_number(m['low'])}, {high}{')' if m['below'] or m['high'] == math.inf else ']'}"


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def problems(settings: WorldSettings) -> list[tuple[str, Any, str]]:
    """``(setting, value, allowed range)`` for each setting outside its range: the one rule that recipes
    (``data.world_*``) and ``euclip download world``'s options are held to."""
    out = []
    for f in SETTINGS:
        value, m = getattr(settings, f.name), f.metadata
        if not (m["low"] <= value and (value < m["high"] if m["below"] else value <= m["high"])):
            out.append((f.name, value, allowed(f.name)))
    return out


def from_config(data: Any) -> WorldSettings:
    """The world a run config's data section (``config.DataConfig``) asks for."""
    return WorldSettings(**{f.name: getattr(data, CONFIG_PREFIX + f.name) for f in SETTINGS})


class WorldDamaged(Failure):
    """A world whose files are not the ones its manifest records."""


@dataclass(frozen=True)
class WorldDir:
    """An embedded world's folder (its layout in the module's docstring)."""

    path: Path

    @property
    def train(self) -> Path:
        return self.path / "train"

    @property
    def eval(self) -> Path:
        return self.path / "eval"

    def task(self, name: str) -> Path:
        """Evaluation task ``name``'s folder (``shapes`` for ``world/shapes``)."""
        return self.eval / name

    def negative_kinds_file(self, name: str) -> Path:
        """A selection task's kind of negative for each of its pairs, in order (a JSON list)."""
        return self.task(name) / "kinds.json"

    def text_only_file(self, name: str) -> Path:
        """A selection task's text-only baseline and chance (a JSON object)."""
        return self.task(name) / "text_only.json"

    @property
    def hierarchy_file(self) -> Path:
        return self.eval / "hierarchy.json"

    @property
    def manifest_file(self) -> Path:
        return self.path / "manifest.json"

    def manifest(self) -> Optional[dict]:
        """The manifest of the finished world here; None when the folder holds none. A manifest that is
        not a JSON object is a Failure naming it."""
        if not self.manifest_file.exists():
            return None
        found = read_json(self.manifest_file)
        if not isinstance(found, dict):
            raise Failure(f"{self.manifest_file} is not a world's manifest (not a JSON object); delete {self.path} "
                          f"and generate it again")
        return found

    def identity(self) -> Optional[str]:
        """The fingerprint of the finished world here; None when it holds none."""
        found = self.manifest()
        return None if found is None else fingerprint(found)

    def check_files(self, found: dict, part: str = "") -> None:
        """Raise WorldDamaged naming the first file under ``part`` that the manifest ``found`` records and
        that is missing or not the size it was written with. Manifests from before sizes were recorded pass."""
        for rel, size in found.get("files", {}).items():
            if not rel.startswith(part):
                continue
            path = self.path / rel
            actual = path.stat().st_size if path.is_file() else None
            if actual != size:
                state = "is missing" if actual is None else f"has {actual:,} bytes where {size:,} were written"
                raise WorldDamaged(f"{path} {state}: the world in {self.path} is damaged; delete {self.path} and "
                                   f"generate it again (euclip download world, or the recipe's download)")


def manifest_settings(settings: WorldSettings, generator_version: int) -> dict:
    """What a manifest records of the world ``settings`` describe: the generator version and settings."""
    return {"generator_version": generator_version, **asdict(settings)}


def recorded_settings(found: dict) -> dict:
    """The generator version and settings a manifest records, without its timings and task list; a setting
    added after the manifest was written has the default it was written with."""
    later = {f.name: f.default for f in SETTINGS if f.metadata["since"]}
    return {k: found.get(k, later.get(k)) for k in ("generator_version", *(f.name for f in SETTINGS))}


def fingerprint(found: dict) -> str:
    """The identity of the world a manifest records: its generator version and settings (the generator is
    deterministic, so equal settings give equal bytes)."""
    return hashlib.sha256(json.dumps(recorded_settings(found), sort_keys=True).encode()).hexdigest()[:16]
