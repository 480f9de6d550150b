"""The embedded world: determinism, the real data's formats, and its entailment ground truth."""

import dataclasses
import hashlib
import json
import random
import tarfile

import pytest

from euclip_cli.data import world as w
from euclip_cli.data.loader import DataError, list_shards
from euclip_cli.data.world_files import WorldExistsError, generate
from euclip_cli.worlddir import WorldDamaged, WorldDir, WorldSettings
from euclip_cli.data.world_tasks import WORLD_TASKS
from tests.conftest import SMALL_WORLD


def digest(folder):
    """Hashes of every data file; manifests and _stats.json hold timings, as img2dataset's do."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix in (".tar", ".txt", ".json") and p.name != "manifest.json" and not p.name.endswith("_stats.json")}


def test_generation_is_deterministic_from_the_seed(world, tmp_path):
    again = tmp_path / "again"
    generate(again, SMALL_WORLD, workers=1)  # another process count, same bytes
    assert digest(again) == digest(world)
    other = tmp_path / "other"
    generate(other, WorldSettings(seed=8, samples=SMALL_WORLD.samples, eval_size=SMALL_WORLD.eval_size), workers=2)
    assert digest(other) != digest(world)


def test_second_run_is_a_no_op_and_other_settings_are_refused(world):
    assert generate(world, SMALL_WORLD)["skipped"]
    with pytest.raises(WorldExistsError, match="other settings"):
        generate(world, WorldSettings(seed=99))


def test_training_shards_are_img2dataset_webdataset(world):
    shards = sorted((world / "train").glob("*.tar"))
    assert [s.name for s in shards] == ["00000.tar"]
    assert (world / "train" / "00000_stats.json").exists() and (world / "train" / "00000.parquet").exists()
    with tarfile.open(shards[0]) as tar:
        names = tar.getnames()
        assert {"000000000.jpg", "000000000.json", "000000000.txt"} <= set(names)
        meta = json.loads(tar.extractfile("000000000.json").read())
    # Each sample: img2dataset's three files, HyCoCLIP's box count, and two files per box.
    assert len(names) == SMALL_WORLD.samples * 4 + 2 * sum(1 for n in names if n.endswith(".jpg") and ".parent" in n)
    assert len(meta["uid"]) == 32 and int(meta["uid"], 16) >= 0
    assert meta["status"] == "success" and meta["key"] == "000000000"
    stats = json.loads((world / "train" / "00000_stats.json").read_text())
    assert stats["successes"] == stats["count"] == SMALL_WORLD.samples


def test_mismatch_fraction_and_caption_levels(world):
    with tarfile.open(world / "train" / "00000.tar") as tar:
        metas = [json.loads(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".json")]
    mismatched = sum(m["world"]["mismatched"] for m in metas) / len(metas)
    assert 0.06 < mismatched < 0.14
    levels = {m["world"]["spec"]["level"] for m in metas}
    assert levels == set(w.LEVELS)
    for m in metas:  # a matched caption is always true of its image
        if not m["world"]["mismatched"]:
            assert w.entails(m["world"]["spec"], w.scene_from_json(m["world"]["objects"]))


def test_generic_captions_describe_many_images(world):
    hierarchy = json.loads((world / "eval" / "hierarchy.json").read_text())
    by_level = {}
    for cap in hierarchy["captions"]:
        by_level.setdefault(cap["level"], []).append(len(cap["entails"]))
    mean = {k: sum(v) / len(v) for k, v in by_level.items()}
    assert mean["family"] > mean["shape"] > mean["detailed"]


def test_entails_follows_the_taxonomy():
    scene = [w.Obj("triangle", "red", "small", "solid", "left"), w.Obj("circle", "blue", "large", "outlined", "top")]
    assert w.entails({"mentions": [{"family": "polygon"}]}, scene)
    assert w.entails({"mentions": [{"family": "round shape"}, {"colour": "red"}]}, scene)
    assert not w.entails({"mentions": [{"family": "symbol"}]}, scene)
    assert not w.entails({"mentions": [{"shape": "triangle", "colour": "blue"}]}, scene)
    assert w.entails({"count": 2, "mentions": []}, scene) and not w.entails({"count": 3, "mentions": []}, scene)
    assert w.caption_text({"count": 2, "mentions": [{"shape": "triangle"}, {"shape": "oval"}]}) == "two shapes: a triangle and an oval"


@pytest.mark.parametrize("task", WORLD_TASKS, ids=lambda t: t.name)
def test_eval_tasks_read_back_through_clip_benchmark(world, task):
    from clip_benchmark.datasets.builder import build_dataset

    kind = "zeroshot_retrieval" if task.classes is None else "zeroshot_classification"
    ds = build_dataset("wds/world/" + task.name, root=str(world / "eval" / task.name), transform=None, split="test", task=kind)
    samples = list(ds)
    assert len(samples) == SMALL_WORLD.eval_size
    image, label = samples[0]
    assert image.size == (w.IMAGE_SIZE, w.IMAGE_SIZE)
    if task.classes is None:
        assert isinstance(label, list) and len(label) == 2
    else:
        assert ds.classes == task.classes and ds.templates == w.FRAMES
        assert {lab for _, lab in samples} <= set(range(len(task.classes)))


def test_missing_or_empty_data_folder_names_the_command(tmp_path):
    with pytest.raises(DataError, match="euclip download world"):
        list_shards(tmp_path / "nope", "euclip download world")
    with pytest.raises(DataError, match="no training shards"):
        list_shards(tmp_path, "euclip download world")


def test_every_shape_renders_inside_the_frame():
    rng = random.Random(0)
    for shape in w.SHAPES:
        for position in w.POSITIONS:
            img = w.render([w.Obj(shape, "red", "large", "solid", position)], rng)
            red = sum(1 for r, g, b in img.get_flattened_data() if r > 150 and g < 100)
            assert red > 40, (shape, position)


def _red_pixels(img) -> int:
    return sum(1 for r, g, b in img.getdata() if r > 150 and g < 100 and b < 100)


@pytest.mark.parametrize("scale", [0.5, 0.7])
def test_the_object_scale_draws_the_same_scene_with_the_area_scaled_by_its_square(scale):
    scene = [w.Obj("hexagon", "red", "large", "solid", "middle")]
    full, smaller = (w.render(scene, random.Random(3), scale=s) for s in (1.0, scale))
    # Same draws, so same centre and jitter: only the radius changes, and a solid polygon's area with its square.
    assert _red_pixels(smaller) / _red_pixels(full) == pytest.approx(scale ** 2, rel=0.15)


def test_a_world_of_smaller_objects_has_the_same_scenes_and_captions_in_other_images(world, tmp_path):
    smaller = tmp_path / "smaller"
    generate(smaller, dataclasses.replace(SMALL_WORLD, object_scale=0.6), workers=1)
    assert json.loads((smaller / "manifest.json").read_text())["object_scale"] == 0.6

    def read(folder):
        with tarfile.open(folder / "train" / "00000.tar") as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}

    default, small = read(world), read(smaller)
    captions = [n for n in default if n.endswith(".txt")]
    assert [default[n] for n in captions] == [small[n] for n in captions]
    assert all(json.loads(default[n])["world"]["objects"] == json.loads(small[n])["world"]["objects"]
               for n in default if n.endswith(".json"))
    images = [n for n in default if n.endswith(".jpg") and n.count(".") == 1]  # not the boxes' crops
    assert len(images) == SMALL_WORLD.samples and all(default[n] != small[n] for n in images)
    for task in ("shapes", "retrieval"):  # the evaluation images are drawn smaller too, the labels kept
        assert (smaller / "eval" / task / "scenes.json").read_bytes() == (world / "eval" / task / "scenes.json").read_bytes()
        assert (smaller / "eval" / task / "test" / "0.tar").read_bytes() != (world / "eval" / task / "test" / "0.tar").read_bytes()
    with pytest.raises(WorldExistsError, match=r"object_scale=1.0, not 0.6 \(data.world_object_scale\)"):
        generate(world, dataclasses.replace(SMALL_WORLD, object_scale=0.6))


def test_a_world_written_before_the_object_scale_existed_has_the_default_scale(world, tmp_path):
    older = tmp_path / "older"
    older.mkdir()
    manifest = json.loads((world / "manifest.json").read_text())
    del manifest["object_scale"]
    (older / "manifest.json").write_text(json.dumps(manifest))
    assert generate(older, SMALL_WORLD)["skipped"]
    with pytest.raises(WorldExistsError, match="object_scale=1.0, not 0.5"):
        generate(older, dataclasses.replace(SMALL_WORLD, object_scale=0.5))


def test_an_interrupted_generation_leaves_no_world_and_the_same_command_starts_again(tmp_path, monkeypatch):
    from euclip_cli.data import world_files

    small = WorldSettings(seed=3, samples=60, eval_size=12)
    out = tmp_path / "w"
    calls = []

    def cut(*args, **kwargs):  # the generation dies once its shards are written, before its manifest (a Ctrl-C)
        calls.append(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(world_files, "_write_hierarchy", cut)
    with pytest.raises(KeyboardInterrupt):
        generate(out, small, workers=1)
    assert calls and sorted(tmp_path.iterdir()) == []  # nothing that looks like a world, nothing beside it
    monkeypatch.undo()
    (tmp_path / ".w.partial" / "train").mkdir(parents=True)  # what a generation killed outright (SIGKILL) leaves
    (tmp_path / ".w.partial" / "train" / "00000.tar").write_bytes(b"half a shard")
    manifest = generate(out, small, workers=1)  # the same command again
    assert not (tmp_path / ".w.partial").exists() and not (out / ".lock").exists()
    assert WorldDir(out).manifest() == manifest and manifest["files"]
    assert {rel: (out / rel).stat().st_size for rel in manifest["files"]} == manifest["files"]


def test_a_world_is_trusted_only_whole(world, tmp_path):
    import shutil

    from euclip_cli.errors import Failure

    copy = tmp_path / "w"
    shutil.copytree(world, copy)
    found = WorldDir(copy).manifest()
    WorldDir(copy).check_files(found)  # as written
    shard = copy / "train" / "00000.tar"
    shard.write_bytes(shard.read_bytes()[:4096])
    with pytest.raises(WorldDamaged, match=r"00000.tar has 4,096 bytes where .* were written"):
        WorldDir(copy).check_files(found, "train/")
    WorldDir(copy).check_files(found, "eval/")  # the evaluation sets are whole
    (copy / "manifest.json").write_text('{"generator_version": 1, "se')
    with pytest.raises(Failure, match="manifest.json is not valid JSON"):
        WorldDir(copy).manifest()


def test_a_generation_killed_outright_takes_its_workers_with_it(tmp_path):
    """SIGTERM runs no cleanup in a command that does not catch it: its generator workers must not write on."""
    import os
    import signal
    import subprocess
    import sys
    import time

    command = [sys.executable, "-m", "euclip_cli", "download", "world", "--out", str(tmp_path / "w"), "--samples",
               "400000", "--workers", "2"]
    parent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def children() -> list[int]:
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError):
                continue
            if int(fields[1]) == parent.pid and fields[0] != "Z":
                found.append(int(entry))
        return found

    deadline = time.monotonic() + 60
    while len(children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    workers = children()
    assert len(workers) >= 2, "the generator never started its workers"
    time.sleep(1)  # the workers are writing
    parent.send_signal(signal.SIGTERM)
    parent.wait(timeout=30)

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if alive(pid)], "orphaned workers still running"
    assert not (tmp_path / "w").exists()  # and nothing that looks like a world


def samples_of(shard):
    """Every sample of a training shard: its files' bytes by their extension (``parent000.jpg``, ``txt``, ...)."""
    found: dict[str, dict[str, bytes]] = {}
    with tarfile.open(shard) as tar:
        for member in tar.getmembers():
            key, _, ext = member.name.partition(".")
            found.setdefault(key, {})[ext] = tar.extractfile(member).read()
    return found


def test_each_sample_carries_the_boxes_of_the_objects_its_caption_names_in_hycoclips_layout(world):
    """HyCoCLIP's prepared GRIT layout beside img2dataset's: ``numparents.txt`` and, per box, its crop and its
    phrase, a phrase of the caption. Checked against the scene the json records: a box is kept for every mention
    some object of the scene matches, and only for those; the box holds that object's pixels."""
    import io

    import numpy as np
    from PIL import Image

    samples = samples_of(world / "train" / "00000.tar")
    counts = [int(files["numparents.txt"]) for files in samples.values()]
    assert 0.8 < sum(c > 0 for c in counts) / len(counts) < 0.97 and max(counts) >= 2
    checked = 0
    for files in samples.values():
        meta = json.loads(files["json"])["world"]
        scene = w.scene_from_json(meta["objects"])
        caption = files["txt"].decode()
        phrases = [files[f"parent{i:03d}.txt"].decode() for i in range(int(files["numparents.txt"]))]
        named = [m for m in meta["spec"]["mentions"] if any(w.mention_matches(m, o) for o in scene)]
        assert len(phrases) == len({w.article(w.describe(m)) for m in named})
        for i, phrase in enumerate(phrases):
            assert phrase in caption  # a phrase of the caption, as GRIT's noun chunks are
            crop = Image.open(io.BytesIO(files[f"parent{i:03d}.jpg"]))
            left, top, right, bottom = meta["boxes"][i]["box"]
            assert crop.size == (max(right - left, bottom - top),) * 2  # padded to a square at its own size
        if len(scene) == 1 and phrases and scene[0].fill == "solid":
            # The one object's pixels (far from the background's grey) all lie inside its box.
            pixels = np.asarray(Image.open(io.BytesIO(files["jpg"])).convert("RGB")).astype(int)
            left, top, right, bottom = meta["boxes"][0]["box"]
            far = np.abs(pixels - pixels[0, 0]).max(-1) > 60
            assert far.any()
            far[top:bottom, left:right] = False
            assert not far.any()
            checked += 1
    assert checked > 100


def test_a_generation_starts_no_more_processes_than_it_has_pieces_of_work(tmp_path, monkeypatch):
    """--workers 200 for a world of one training shard and ten evaluation tasks: a forked pool starts every
    process it may use at once, so the pool is sized to the eleven pieces, not to the 200 asked for."""
    from concurrent.futures import ProcessPoolExecutor

    from euclip_cli import workers

    sizes = []

    class Counted(ProcessPoolExecutor):
        def __init__(self, max_workers=None, **kwargs):
            sizes.append(max_workers)
            super().__init__(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(workers, "ProcessPoolExecutor", Counted)
    generate(tmp_path / "w", WorldSettings(seed=3, samples=60, eval_size=12), workers=200)
    assert sizes == [1 + len(WORLD_TASKS)]
