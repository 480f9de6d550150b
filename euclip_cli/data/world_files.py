"""Write the embedded world to disk in the real data's formats (its folder: ``worlddir.WorldDir``).

- ``<out>/train/NNNNN.tar``: img2dataset's webdataset output (``KEY.jpg``, ``KEY.txt``,
  ``KEY.json`` with a ``uid``), plus its per-shard ``NNNNN.parquet`` and ``NNNNN_stats.json``; beside each
  sample its boxes in HyCoCLIP's layout (``KEY.numparents.txt``, ``KEY.parentNNN.jpg``, ``KEY.parentNNN.txt``).
- ``<out>/eval/<task>/``: clip-benchmark's local ``wds`` layout (``test/nshards.txt``,
  ``test/N.tar``, ``classnames.txt``, ``zeroshot_classification_templates.txt``, ``dataset_type.txt``).
- ``<out>/eval/hierarchy.json``: which captions of a generic-to-specific pool entail which
  retrieval images (ground truth for the hierarchy analyses).
- ``<out>/manifest.json``: the settings and every file's size, so a second run with the same settings is a
  no-op and a damaged world is noticed. A world is generated in ``.<out>.partial`` beside it and renamed
  into place whole, so an interrupted generation leaves nothing that looks usable, and the same command
  starts it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tarfile
import time
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa
import pyarrow.parquet as pq
import webdataset as wds

from euclip_cli.config import DataConfig
from euclip_cli.data import world as w
from euclip_cli.data.world_tasks import WORLD_TASKS, BigramScorer, retrieval_ceiling, retrieval_specs
from euclip_cli.errors import UsageError
from euclip_cli.rundir import read_json, whole_folder, write_text_atomic
from euclip_cli.workers import make_room_for_workers, pool_size, worker_pool
from euclip_cli import worlddir as W
from euclip_cli.worlddir import WorldDir, WorldSettings

# 2: every training sample carries its boxes (``box_entries``).
GENERATOR_VERSION = 2
SAMPLES_PER_SHARD = 10_000  # img2dataset's number_sample_per_shard default
SHARD_DIGITS = 5  # img2dataset's oom_shard_count default
KEY_DIGITS = 4  # ceil(log10(SAMPLES_PER_SHARD))
EVAL_SHARD_SIZE = 1000
# A fixed integer mtime: byte-identical shards for a seed, and no per-file PAX header
# (a float mtime adds one, doubling tar parsing time in the training loader).
TAR_MTIME = 1_700_000_000


class WorldExistsError(UsageError):
    """The output folder holds another world or other files; nothing is overwritten."""


def check_shared_world(data: DataConfig, out: Path, found: dict, remedy: str) -> None:
    """``check_world`` for a ``DataConfig`` whose world is ``out`` (manifest ``found``), when that is
    the shared default folder (``data.train_dir`` unset): every world recipe trains there, so one
    generated with other settings (by ``euclip download world``, say) would silently change a run's
    data. A folder the user names with ``data.train_dir`` is taken as it is.
    """
    if not data.train_dir:
        check_world(out, found, W.from_config(data), remedy)


def check_world(out: Path, found: dict, settings: WorldSettings, remedy: str) -> None:
    """Raise WorldExistsError when the world in ``out``, whose manifest is ``found``, was generated
    with other settings than ``settings``: a run on it would train on other data than its
    configuration records.
    """
    recorded_as = W.recorded_settings(found)
    wanted = W.manifest_settings(settings, GENERATOR_VERSION)
    differ = {k: (recorded_as[k], v) for k, v in wanted.items() if recorded_as[k] != v}
    if differ:
        what = ", ".join(f"{k}={old}, not {new}" + (f" ({W.config_key(k)})" if k != "generator_version" else "")
                         for k, (old, new) in differ.items())
        raise WorldExistsError(f"{out} holds a world generated with other settings: {what}; {remedy}")


def _rng(*parts) -> random.Random:
    # A string seed hashes deterministically (unlike hash() of a tuple across processes).
    return random.Random("/".join(str(p) for p in parts))


def write_train_shard(out: Path, shard: int, samples: Iterable[tuple[bytes, str, Callable[[str], dict]]]) -> int:
    """One training shard in img2dataset's layout: ``NNNNN.tar`` (``KEY.jpg``, ``KEY.txt``, ``KEY.json``; the
    tar written under a temporary name and moved into place when whole), ``NNNNN.parquet`` and
    ``NNNNN_stats.json``. ``samples``: each sample's JPEG, caption, and a function of its key giving its
    ``uid``, ``url``, sizes (``width``, ``height``, ``original_width``, ``original_height``), any fields
    of its own, and under ``entries`` any files of its own beside them (``{"numparents.txt": ...}``).
    Returns the number of samples."""
    name = f"{shard:0{SHARD_DIGITS}d}"
    start = time.time()
    rows = []
    tmp = out / f".{name}.tar.tmp"
    with wds.TarWriter(str(tmp), mtime=TAR_MTIME) as sink:
        for i, (jpg, caption, fields_of) in enumerate(samples):
            key = f"{name}{i:0{KEY_DIGITS}d}"
            fields = fields_of(key)
            entries = fields.pop("entries", {})
            meta = {"uid": fields.pop("uid"), "key": key, "caption": caption, "url": fields.pop("url"),
                    "status": "success", "error_message": None,
                    **{size: fields.pop(size) for size in ("width", "height", "original_width", "original_height")},
                    "sha256": hashlib.sha256(jpg).hexdigest(), **fields}
            sink.write({"__key__": key, "jpg": jpg, "txt": caption, "json": meta, **entries})
            rows.append({k: meta[k] for k in ("key", "uid", "caption", "url", "status", "error_message", "sha256")})
    os.replace(tmp, out / f"{name}.tar")
    pq.write_table(pa.Table.from_pylist(rows), out / f"{name}.parquet")
    end = time.time()
    stats = {"count": len(rows), "successes": len(rows), "failed_to_download": 0, "failed_to_resize": 0,
             "duration": end - start, "start_time": start, "end_time": end, "status_dict": {"success": len(rows)}}
    (out / f"{name}_stats.json").write_text(json.dumps(stats))
    return len(rows)


def box_entries(pair: w.TrainingPair) -> tuple[dict, list[dict]]:
    """A sample's boxes as HyCoCLIP's prepared GRIT shards hold them (``numparents.txt``, then
    ``parentNNN.jpg`` and ``parentNNN.txt`` for each: the box's crop and its phrase), and the boxes for its
    ``json``. A sample whose caption names no object of its image has none (``numparents.txt`` 0): HyCoCLIP's
    preparation drops such a sample, and euclip's box loader skips it (the other losses train on it)."""
    grounded = w.grounded_boxes(pair.spec, pair.scene, pair.boxes)
    entries = {"numparents.txt": str(len(grounded))}
    for i, (box, phrase) in enumerate(grounded):
        entries[f"parent{i:03d}.jpg"] = w.encode_jpeg(w.box_image(pair.image, box))
        entries[f"parent{i:03d}.txt"] = phrase
    return entries, [{"box": list(box), "phrase": phrase} for box, phrase in grounded]


def _write_train_shard(out: str, settings: WorldSettings, shard: int, count: int) -> int:
    rng = _rng("train", settings.seed, shard)

    def samples():
        for _ in range(count):
            pair = w.training_pair(rng, settings.mismatch, scale=settings.object_scale)
            entries, boxes = box_entries(pair)
            yield w.encode_jpeg(pair.image), pair.caption, lambda key, pair=pair, entries=entries, boxes=boxes: {
                "uid": hashlib.md5(f"world-{settings.seed}-{key}".encode()).hexdigest(),
                "url": f"world://{settings.seed}/{key}", "width": w.IMAGE_SIZE, "height": w.IMAGE_SIZE,
                "original_width": w.IMAGE_SIZE, "original_height": w.IMAGE_SIZE,
                "world": {"objects": w.scene_json(pair.scene), "spec": pair.spec, "mismatched": pair.mismatched,
                          "boxes": boxes},
                "entries": entries}

    return write_train_shard(Path(out), shard, samples())


def _write_eval_task(out: str, settings: WorldSettings, index: int) -> str:
    task = WORLD_TASKS[index]
    rng = _rng("eval", settings.seed, task.name)
    folder = Path(out) / task.name
    (folder / "test").mkdir(parents=True, exist_ok=True)
    scenes, kinds = [], []
    nshards = (settings.eval_size + EVAL_SHARD_SIZE - 1) // EVAL_SHARD_SIZE
    for shard in range(nshards):
        with wds.TarWriter(str(folder / "test" / f"{shard}.tar"), mtime=TAR_MTIME) as sink:
            for i in range(shard * EVAL_SHARD_SIZE, min(settings.eval_size, (shard + 1) * EVAL_SHARD_SIZE)):
                image, label, scene = task.sample(rng, settings.object_scale)
                sample = {"__key__": f"s{i:07d}", "jpg": w.encode_jpeg(image)}
                if task.selection:  # the caption, then its negative: clip-benchmark's retrieval layout reads both
                    sample["txt"] = "\n".join(label["captions"])
                    kinds.append(label["kind"])
                elif task.classes is None:
                    sample["txt"] = "\n".join(label)
                else:
                    sample["cls"] = label
                sink.write(sample)
                scenes.append(w.scene_json(scene))
    (folder / "test" / "nshards.txt").write_text(f"{nshards}\n")
    if task.selection:
        WorldDir(Path(out).parent).negative_kinds_file(task.name).write_text(json.dumps(kinds))
    if task.classes is None:
        (folder / "dataset_type.txt").write_text("retrieval\n")
    else:
        (folder / "dataset_type.txt").write_text("classification\n")
        (folder / "classnames.txt").write_text("\n".join(task.classes) + "\n")
        (folder / "zeroshot_classification_templates.txt").write_text("\n".join(w.FRAMES) + "\n")
    (folder / "scenes.json").write_text(json.dumps(scenes))
    return task.name


def caption_pool() -> list[dict]:
    """Specs from the root to single objects in full detail: the hierarchy's levels."""
    specs: list[dict] = [{"level": "family", "mentions": [{"family": f}]} for f in w.FAMILIES]
    for key, values in [("colour", w.COLOURS), ("size", w.SIZES), ("fill", w.FILLS), ("position", w.POSITIONS)]:
        specs += [{"level": "attribute", "mentions": [{key: v}]} for v in values]
    specs += [{"level": "attribute", "count": n, "mentions": []} for n in (1, 2, 3)]
    specs += [{"level": "shape", "mentions": [{"shape": s}]} for s in w.SHAPES]
    specs += [{"level": "detailed", "mentions": [{"shape": s, "colour": c}]} for s in w.SHAPES for c in w.COLOURS]
    specs += [{"level": "detailed", "mentions": [{"shape": s, "colour": c, "size": z, "position": p}]}
              for s in w.SHAPES for c in w.COLOURS for z in w.SIZES for p in w.POSITIONS]
    return specs


def train_captions(world: WorldDir) -> list[str]:
    """Every training pair's caption (``KEY.txt``; a box's phrase, ``KEY.parentNNN.txt``, is not one)."""
    captions = []
    for shard in sorted(world.train.glob("*.tar")):
        with tarfile.open(shard) as tar:
            captions += [tar.extractfile(m).read().decode() for m in tar.getmembers()
                         if m.name.endswith(".txt") and m.name.count(".") == 1]
    return captions


def _write_text_only(world: WorldDir) -> None:
    """The text-only baseline of each selection task (``world_tasks.BigramScorer`` of the training captions):
    its accuracy overall and per kind of negative, beside chance, in its ``WorldDir.text_only_file``."""
    scorer = BigramScorer(train_captions(world))
    for task in (t for t in WORLD_TASKS if t.selection):
        folder = world.task(task.name)
        kinds = read_json(world.negative_kinds_file(task.name))
        picks: dict[str, list[float]] = {}
        pairs = []  # in the order written, as kinds.json is
        for shard in sorted((folder / "test").glob("*.tar"), key=lambda p: int(p.stem)):
            with tarfile.open(shard) as tar:
                pairs += [tar.extractfile(m).read().decode().split("\n") for m in tar.getmembers()
                          if m.name.endswith(".txt")]
        for kind, (caption, negative) in zip(kinds, pairs, strict=True):
            picks.setdefault(kind, []).append(scorer.picks_caption(caption, negative))
        everything = [p for found in picks.values() for p in found]
        doc = {"scorer": "bigram language model of the training captions, add-one smoothing, total log-probability",
               "captions": scorer.captions, "acc": sum(everything) / len(everything),
               **{f"acc_{kind}": sum(found) / len(found) for kind, found in sorted(picks.items())}, "chance": 0.5}
        world.text_only_file(task.name).write_text(json.dumps(doc, indent=1))


def _write_hierarchy(world: WorldDir) -> None:
    scenes = [w.scene_from_json(s) for s in read_json(world.task("retrieval") / "scenes.json")]
    captions = []
    for spec in caption_pool():
        images = [i for i, scene in enumerate(scenes) if w.entails(spec, scene)]
        captions.append({"text": w.caption_text(spec), "level": spec["level"], "spec": spec, "entails": images})
    doc = {"images": "retrieval/scenes.json", "levels": list(w.LEVELS), "captions": captions}
    world.hierarchy_file.write_text(json.dumps(doc))


def generate(out: Path, settings: WorldSettings, workers: int = 2, progress=None) -> dict:
    """Write the world under ``out``; a no-op when ``out`` already holds the same settings.

    Raises WorldExistsError when ``out`` holds anything else, so nothing is overwritten. The world is
    written whole or not at all (``rundir.whole_folder``). ``progress(done, total)`` is called after each
    shard or task.
    """
    found = WorldDir(out).manifest()
    if found is not None:
        check_world(out, found, settings, f"choose another --out or delete {out}")
        added = _add_missing_tasks(WorldDir(out), settings, found)
        return (found | {"added": added}) if added else (found | {"skipped": True})
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise WorldExistsError(f"{out} exists and is not an embedded world (no manifest.json); "
                               f"choose another --out or delete it")
    make_room_for_workers(pool_size(workers, pieces(settings)), "--workers")
    with whole_folder(out, lambda pid: WorldExistsError(
            f"{out} is being generated by another process (pid {pid}): wait for it, or choose another --out")) as staging:
        return _write_world(staging, settings, workers, progress)


def pieces(settings: WorldSettings) -> int:
    """The world's independent pieces of work: its training shards and its evaluation tasks."""
    return -(-settings.samples // SAMPLES_PER_SHARD) + len(WORLD_TASKS)


def file_sizes(world: WorldDir) -> dict[str, int]:
    """Every training and evaluation file's size, by its path in the world: what its manifest records."""
    return {str(p.relative_to(world.path)): p.stat().st_size for part in (world.train, world.eval)
            for p in sorted(part.rglob("*")) if p.is_file()}


def _add_missing_tasks(world: WorldDir, settings: WorldSettings, found: dict) -> list[str]:
    """Write into a finished world the evaluation tasks its manifest does not list (a world generated before
    they existed) and then list them; returns their names. Each task's images are drawn from its own seed, so
    the tasks a world already has, its training shards and its fingerprint are what they were; an addition cut
    short is not listed, and the next one writes it again."""
    listed = found.get("eval_tasks", [t.name for t in WORLD_TASKS])
    missing = [i for i, task in enumerate(WORLD_TASKS) if task.name not in listed]
    if not missing:
        return []
    for i in missing:
        _write_eval_task(str(world.eval), settings, i)
    if any(WORLD_TASKS[i].selection for i in missing):
        _write_text_only(world)
    write_text_atomic(world.manifest_file, json.dumps(found | {"eval_tasks": [t.name for t in WORLD_TASKS],
                                                               "files": file_sizes(world)}, indent=2))
    return [WORLD_TASKS[i].name for i in missing]


def _write_world(out: Path, settings: WorldSettings, workers: int, progress) -> dict:
    world = WorldDir(out)
    world.train.mkdir(parents=True, exist_ok=True)
    world.eval.mkdir(parents=True, exist_ok=True)
    counts = [min(SAMPLES_PER_SHARD, settings.samples - s) for s in range(0, settings.samples, SAMPLES_PER_SHARD)]
    total = pieces(settings)
    start = time.time()
    with worker_pool(workers, total) as pool:
        jobs = [pool.submit(_write_train_shard, str(world.train), settings, i, n) for i, n in enumerate(counts)]
        jobs += [pool.submit(_write_eval_task, str(world.eval), settings, i) for i in range(len(WORLD_TASKS))]
        for done, job in enumerate(jobs, 1):
            job.result()
            if progress:
                progress(done, total)
    _write_hierarchy(world)
    _write_text_only(world)
    manifest = W.manifest_settings(settings, GENERATOR_VERSION) | {
        "train_shards": len(counts), "eval_tasks": [t.name for t in WORLD_TASKS],
        "seconds": round(time.time() - start, 1), "files": file_sizes(world)}
    # Written last: its presence means the world is complete.
    world.manifest_file.write_text(json.dumps(manifest, indent=2))
    return manifest


def task_ceiling(eval_dir: Path, name: str) -> float:
    """The best main metric any model can expect on the world's evaluation task ``name`` (a fraction),
    from its files under ``eval_dir``: 1 for a classification task, whose label is a function of the
    scene each image renders, and for a selection task, whose negatives are false of theirs; for
    retrieval, the limit its captions set (``world_tasks.retrieval_ceiling``)."""
    task = next(t for t in WORLD_TASKS if t.name == name)
    if task.classes is not None or task.selection:  # every negative is false of its scene (hard_negative)
        return 1.0
    folder = eval_dir / name
    scenes = [w.scene_from_json(s) for s in read_json(folder / "scenes.json")]
    captions: dict[str, list[str]] = {}
    for shard in sorted((folder / "test").glob("*.tar"), key=lambda p: int(p.stem)):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".txt"):
                    captions[member.name] = tar.extractfile(member).read().decode().split("\n")
    texts = [captions[key] for key in sorted(captions)]  # keys s0000000.txt, ... in the order scenes.json has
    specs = [retrieval_specs(scene, own) for scene, own in zip(scenes, texts, strict=True)]
    return retrieval_ceiling(scenes, specs)["mean_recall@1"]
