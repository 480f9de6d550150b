"""Ctrl-C (SIGINT to the whole foreground process group, as a terminal sends it) and SIGTERM (to the command
alone, as a scheduler or `kill` sends it) stop a long command within seconds, in one line, exit 1, and leave
nothing partial: a generator neither its output nor its staging folder; an img2dataset download no finished-looking
manifest; and an export, an evaluation, a study, an analysis, a bench and a download that reaches a host (one
analysis, one bench and one download drawn each run, so that over runs every one is stopped), stopped at a random
point of their lives (from the interpreter's first imports to its last teardown), no half file, no half set of
files and no temporary file. (The trainer's and the study's own stops, a checkpoint and a resume, are tested
beside them: test_trainer_faults.py, test_study_launch.py.)"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.trained import copy_run

COMMANDS = {"download world": ["download", "world", "--samples", "40000"],
            "download datacomp-like": ["download", "datacomp-like", "--samples", "20000"]}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGTERM"])
def test_a_signal_stops_a_generating_command_in_one_line_leaving_nothing(tmp_path, command, how):
    out = tmp_path / "out"
    # Started with SIGINT ignored, as a parent that ignores it (a test runner's worker, a shell's background
    # job) starts it: the command must take Ctrl-C all the same.
    process = subprocess.Popen([sys.executable, "-m", "euclip_cli", *COMMANDS[command], "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env={**os.environ, "COLUMNS": "200"},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    staging = tmp_path / ".out.partial"
    deadline = time.time() + 60
    while not staging.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert staging.exists(), "the command never started writing"
    time.sleep(1.5)  # the pool's workers are writing shards: the moment that needs its cleanup
    if how == "SIGTERM":
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    lines = [line for line in output.splitlines() if line.strip()]
    assert process.returncode == 1 and lines == [f"error: {'terminated (SIGTERM)' if how == 'SIGTERM' else 'interrupted'}"], output
    assert not out.exists() and not staging.exists()


# A fresh point each run, named by a failure: over runs the stops land everywhere in a command's life.
POINTS = random.Random()


# How the command line starts: as ``euclip`` does (``python -m euclip_cli``).
AS_EUCLIP = ("-m", "euclip_cli")


@dataclass(frozen=True)
class Life:
    """A command to stop: its arguments, the latest point a stop is drawn at (about its life here), what its stop
    must leave (``check(exit code)``), and how its command line starts."""

    argv: list[str]
    latest: float
    check: Callable[[int], None]
    entry: tuple[str, ...] = AS_EUCLIP


def stopped_at_random(argv: list[str], cwd: Path, latest: float, how: str,
                      entry: tuple[str, ...] = AS_EUCLIP) -> tuple[int, str, str, float]:
    """``euclip ARGV`` run from ``cwd`` and sent ``how`` at a point drawn from [0.05 s, ``latest``]: (exit
    code, stdout, stderr, the point). Before 0.05 s the interpreter itself is starting, and no euclip code has
    run."""
    point = POINTS.uniform(0.05, latest)
    process = subprocess.Popen([sys.executable, *entry, *argv], cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, "COLUMNS": "200", "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1",
                                    "TMPDIR": str(temporary_folder(cwd))})
    time.sleep(point)
    try:
        if how == "SIGTERM":
            process.send_signal(signal.SIGTERM)
        else:
            os.killpg(process.pid, signal.SIGINT)
    except ProcessLookupError:  # finished already: its output must then be whole
        pass
    stdout, stderr = process.communicate(timeout=60)
    return process.returncode, stdout, stderr, point


def temporary_folder(cwd: Path) -> Path:
    """The temporary folder (``TMPDIR``) a stopped command and its children are given: empty once it has exited,
    whatever the stop (``left_in``), since a temporary file left behind is a leak in every user's /tmp."""
    folder = cwd / "temporary"
    folder.mkdir(exist_ok=True)
    return folder


# What torch keeps in the temporary folder on purpose: its compiler's cache, one per user, shared by every process.
CACHES = ("torchinductor_",)


def left_in(folder: Path) -> list[Path]:
    """What a command left in its temporary folder, less torch's cache."""
    return [p for p in folder.iterdir() if not p.name.startswith(CACHES)]


def said(stderr: str) -> list[str]:
    """What a command said: its lines, less progress bars (tqdm's, from huggingface_hub and img2dataset), which a
    terminal draws over and over in one place."""
    return [line for line in stderr.splitlines() if line.strip() and not re.search(r"(it/s|s/it)\]\s*$", line)]


def leftovers(folder: Path) -> list[Path]:
    """Temporary and staging files under ``folder``: what a stop must not leave."""
    return [p for p in folder.rglob("*") if p.name.endswith((".tmp", ".partial")) or ".partial" in p.parent.name]


def whole_json_lines(path: Path) -> bool:
    return not path.exists() or all(json.loads(line) is not None for line in path.read_text().splitlines() if line)


def export_case(tmp_path, world, tiny_clip):
    out = tmp_path / "export"

    def check(code: int) -> None:
        from euclip_cli import exported

        assert exported.read_described(out) if code == 0 else not out.exists()
        assert not leftovers(tmp_path)

    return Life(["export", str(tiny_clip), str(out)], 3.5, check)


def eval_case(tmp_path, world, tiny_clip):
    run = copy_run(tiny_clip, tmp_path / "runs")

    def check(code: int) -> None:
        assert not leftovers(run) and whole_json_lines(run / "eval.jsonl")
        if code == 0:
            assert (run / "eval.jsonl").exists()

    return Life(["eval", str(run), "--world", str(world)], 5.0, check)


# Each bench with arguments that keep it small, and the latest point a stop is drawn at: its life here, at most
# 8 s (the longer ones' first 8 s: their imports, workers and first rounds).
BENCHES = {
    "loader": (["--arch", "tiny-vit-c16", "--workers", "1", "--device", "cpu", "--batch-size", "32", "--batches", "4",
                "--rounds", "1"], 4.5),
    "text": (["--arch", "tiny-vit-c16", "--batch-size", "32", "--batches", "4", "--rounds", "1"], 4.5),
    "decode": (["--arch", "tiny-vit-c16", "--images", "64", "--rounds", "1"], 4.5),
    "ops": (["--arch", "tiny-vit-c16", "--batch-size", "16"], 5.5),
    "profile": (["--arch", "tiny-vit-c16", "--batch-size", "16", "--steps", "3"], 8.0),
    "feed": (["--arch", "tiny-vit-c16", "--batch-size", "32", "--steps", "4", "--warmup", "1", "--workers", "1",
              "--rounds", "1"], 8.0),
    "train": (["--arch", "tiny-vit-c16", "--batch-size", "16", "--steps", "3", "--warmup", "1", "--rounds", "1",
               "--no-openclip", "--no-accumulation", "--device", "cpu"], 8.0),
}
SHARDS_READ = ("loader", "text", "decode", "ops")


def bench_case(tmp_path, world, tiny_clip):
    """One bench, drawn afresh each run as the point is (the test's failure names it): over runs, every bench."""
    kind = POINTS.choice(sorted(BENCHES))
    args, latest = BENCHES[kind]
    out = tmp_path / "bench"

    def check(code: int) -> None:
        results = list(out.glob("*.json")) if out.exists() else []
        assert len(results) == (code == 0) and all(json.loads(p.read_text()) for p in results)
        assert not leftovers(tmp_path)

    shards = ["--shards", str(world / "train")] if kind in SHARDS_READ else []
    return Life(["bench", kind, *args, *shards, "--out", str(out)], latest, check)


def evalsets_case(tmp_path, world, tiny_clip):
    """``download evalsets`` from a Hugging Face-shaped host on 127.0.0.1: ImageNet's repo holding the world's shapes
    task and seven 16 MiB shards more, each fetched, checked against its LFS pointer and renamed into place."""
    from euclip_cli.evaluate.evalsets import repo_for
    from euclip_cli.protocol.tasks import TASKS
    from tests.test_evalsets import FakeHub

    source, repo = world / "eval" / "shapes", repo_for(TASKS["imagenet1k"])
    files = {f"{repo}/{p.relative_to(source)}": p.read_bytes() for p in source.rglob("*")
             if p.is_file() and p.name != "scenes.json"}
    files |= {f"{repo}/test/{i}.tar": bytes([i]) * (16 << 20) for i in range(1, 8)}
    files[f"{repo}/test/nshards.txt"] = b"8\n"
    hub, root = FakeHub(files), tmp_path / "evalsets"

    def check(code: int) -> None:
        hub.server.shutdown()
        folder = TASKS["imagenet1k"].data_dir(root, world)
        # The marker is written last: a folder with it holds the whole set, whatever the stop.
        if code == 0 or (folder / "test" / "nshards.txt").exists():
            assert all((folder / rel[len(repo) + 1:]).read_bytes() == data for rel, data in files.items())
        assert not leftovers(tmp_path)

    return Life(["download", "evalsets", "--tasks", "imagenet1k", "--root", str(root), "--base-url", hub.url], 4.5, check)


def image_download_check(out: Path, *hosts) -> Callable[[int], None]:
    """What a stop leaves of an img2dataset download into ``out``: a manifest complete exactly when the command
    finished, and no staging file or folder."""
    def check(code: int) -> None:
        for host in hosts:
            host.stop()
        manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else None
        assert (manifest or {}).get("complete", False) == (code == 0), manifest
        assert not leftovers(out.parent) and not any(out.rglob("_tmp"))

    return check


def datacomp_case(tmp_path, world, tiny_clip):
    """``download datacomp --scale small`` from a Hub and an image host on 127.0.0.1: the pool's metadata through
    huggingface_hub, the filter, then the images through img2dataset."""
    from tests.test_download_datacomp import FAST, FILES, REPO, ROWS
    from tests.webfakes import FakeHub, ImageHost, datacomp_metadata

    images = ImageHost(delay_s=0.05)
    hub, out = FakeHub({REPO: datacomp_metadata(images.url, FILES, ROWS, {})}), tmp_path / "dc"
    return Life(["download", "datacomp", "--scale", "small", "--hub-url", hub.url, "--out", str(out), *FAST], 7.0,
                image_download_check(out, images, hub))


def redcaps_case(tmp_path, world, tiny_clip):
    """``download redcaps``: RedCaps' annotations archive from a host on 127.0.0.1, fetched, read into the download
    list, then 46 images through img2dataset."""
    from tests.test_download_datacomp import FAST
    from tests.test_redcaps import annotation_archive
    from tests.webfakes import ImageHost, StaticHost

    images = ImageHost(delay_s=0.02)
    archive, out = StaticHost({"annotations.zip": annotation_archive(images.url, more=40)}), tmp_path / "redcaps"
    return Life(["download", "redcaps", "--annotations-url", f"{archive.url}/annotations.zip", "--out", str(out), *FAST],
                12.0, image_download_check(out, images, archive))


def grit_case(tmp_path, world, tiny_clip):
    """``download grit``: two metadata parts from a Hub on 127.0.0.1, 60 images through img2dataset, then each
    pair's boxes cut as HyCoCLIP prepares them."""
    from tests.test_download_datacomp import FAST
    from tests.test_grit import CAPTION, grit_part, span
    from tests.webfakes import FakeHub, ImageHost

    images, whole = ImageHost(delay_s=0.02), (0.0, 0.0, 1.0, 1.0)
    parts = {f"grit-20m/coyo_{k}_snappy.parquet": grit_part([
        {"id": 1000 * k + i, "url": f"{images.url}/ok/{30 * k + i}.jpg", "caption": CAPTION,
         "noun_chunks": [span("a red circle", whole)], "ref_exps": []} for i in range(30)]) for k in range(2)}
    hub, out = FakeHub({"zzliang/GRIT": parts}), tmp_path / "grit"
    return Life(["download", "grit", "--parts", "2", "--hub-url", hub.url, "--out", str(out), *FAST], 12.0,
                image_download_check(out, images, hub))


# ``download wordnet`` as ``euclip`` starts it, with nltk's refusal to fetch from an address that is not globally
# routable (127.0.0.1 among them) lifted as the command line loads: the rest of nltk runs as shipped.
NLTK_FROM_127 = ("-c", """
from euclip_cli.cli import stops

def load():
    import nltk.pathsec

    nltk.pathsec.ENFORCE = False
    from euclip_cli.cli.main import main

    return main

stops.launch(load)
""")


def wordnet_case(tmp_path, world, tiny_clip):
    """``download wordnet``: nltk's index and the stand-in WordNet's package from nltk's data server on 127.0.0.1,
    checksummed and unpacked."""
    from tests.test_hierarchy_wordnet import stand_in_wordnet
    from tests.webfakes import FakeNltkData, nltk_package, write_wordnet

    corpus, out = tmp_path / "source" / "wordnet", tmp_path / "nltk_data"
    write_wordnet(corpus, *stand_in_wordnet())
    server = FakeNltkData({"wordnet": (nltk_package(corpus, "wordnet"), sum(p.stat().st_size for p in corpus.iterdir()))})

    def check(code: int) -> None:
        server.stop()
        installed = all((out / "corpora" / "wordnet" / p.name).is_file() and
                        (out / "corpora" / "wordnet" / p.name).read_bytes() == p.read_bytes() for p in corpus.iterdir())
        # The corpus is whole or absent, whatever the stop; finished, it is there.
        assert installed if code == 0 else installed or not list(out.rglob("data.noun"))
        assert not leftovers(tmp_path)

    return Life(["download", "wordnet", "--out", str(out), "--index-url", f"{server.url}/index.xml"], 4.0, check,
                NLTK_FROM_127)


def probesets_case(tmp_path, world, tiny_clip):
    """``download probesets --tasks meru-probe/pets``: clip-benchmark's builder reading a stand-in Oxford-IIIT Pet
    (300 images in torchvision's layout, which it takes as downloaded), its exporter writing both splits."""
    from PIL import Image

    from euclip_cli.protocol.tasks import TASKS

    pets, root = tmp_path / "sources" / "oxford-iiit-pet", tmp_path / "eval"
    (pets / "images").mkdir(parents=True)
    (pets / "annotations").mkdir()
    for split, count in (("trainval", 200), ("test", 100)):
        lines = []
        for i in range(count):
            name = f"{('beagle', 'pug', 'persian')[i % 3]}_{split}{i}"
            Image.new("RGB", (64, 48), (i % 256, 40 * (i % 3), 90)).save(pets / "images" / f"{name}.jpg")
            lines.append(f"{name} {i % 3 + 1} {1 + (i % 3 == 2)} 1")
        (pets / "annotations" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    folder = TASKS["meru-probe/pets"].data_dir(root, Path("data/world"))

    def check(code: int) -> None:
        made = {part: (folder / part / "nshards.txt").exists() for part in ("train", "test")}
        assert all(made.values()) if code == 0 else True, made
        for part in (p for p, whole in made.items() if whole):  # a split there is whole
            shards = int((folder / part / "nshards.txt").read_text())
            assert sorted(p.name for p in (folder / part).glob("*.tar")) == sorted(f"{i}.tar" for i in range(shards))
        assert not leftovers(tmp_path)
        assert all(made[p.name] for p in folder.iterdir() if p.is_dir()) if folder.exists() else True

    return Life(["download", "probesets", "--tasks", "meru-probe/pets", "--root", str(root), "--sources",
                 str(tmp_path / "sources")], 8.0, check)


def study_case(tmp_path, world, tiny_clip):
    from euclip_cli.study.tables import PUBLISHED

    recipe, out = tmp_path / "study.toml", tmp_path / "study"
    common = [f"data.train_dir={world / 'train'}", "optim.samples=64", "data.batch_size=32", "optim.warmup_steps=1",
              "train.precision=fp32", "train.tensorboard=false", "data.shuffle_buffer=100"]
    recipe.write_text(f'[study]\nseeds = 1\ntasks = "world/colour"\nbaseline = "clip"\noverrides = {json.dumps(common)}\n'
                      f'[configs.clip]\nrecipe = "tiny-clip"\n[configs.slower]\nrecipe = "tiny-clip"\n'
                      f'overrides = ["optim.lr=1e-4"]\n')
    figures = ("study.png", "study.pdf", "study_temperature.png", "study_temperature.pdf")

    def check(code: int) -> None:
        tables = [name for name in (*PUBLISHED, *figures) if (out / name).exists()]
        # All of the tables and figures or none: a study stopped writing them says it was stopped.
        assert tables == ([*PUBLISHED, *figures] if code == 0 else []), tables
        assert not leftovers(out) if out.exists() else True

    return Life(["study", "--recipe", str(recipe), "--out", str(out), "--world", str(world)], 18.0, check)


# Each analysis with arguments that keep it small; hierarchy, isotropy and traverse read the world's tasks.
ANALYSES = {"distances": ["--root-samples", "64"], "isotropy": [], "traverse": ["--images", "16", "--root-samples", "64"],
            "hierarchy": [], "equilibrium": ["--batch-sizes", "16,32", "--samples", "64", "--batches", "2"]}


def analyze_case(tmp_path, world, tiny_clip):
    """One analysis, drawn afresh each run as the point is (the failure names it): over runs, every analysis."""
    kind = POINTS.choice(sorted(ANALYSES))
    run = copy_run(tiny_clip, tmp_path / "runs")
    where = [] if kind == "equilibrium" else ["--world", str(world)]

    def check(code: int) -> None:
        results = list((run / "analysis").glob("*.json")) if (run / "analysis").exists() else []
        assert results if code == 0 else True
        assert all(json.loads(p.read_text()) is not None for p in results)  # whole, or not there
        assert not leftovers(run)

    return Life(["analyze", kind, str(run), *ANALYSES[kind], *where], 8.0, check)


# The download commands that reach a host, each against its stand-in on 127.0.0.1 (``download world`` and
# ``datacomp-like`` generate: the test above).
DOWNLOADS = {"evalsets": evalsets_case, "datacomp": datacomp_case, "redcaps": redcaps_case, "grit": grit_case,
             "wordnet": wordnet_case, "probesets": probesets_case}


def download_case(tmp_path, world, tiny_clip):
    """One download, drawn afresh each run as the point is (the failure names it): over runs, every download."""
    return DOWNLOADS[POINTS.choice(sorted(DOWNLOADS))](tmp_path, world, tiny_clip)


LIVES = {"export": export_case, "eval": eval_case, "bench": bench_case, "study": study_case, "download": download_case,
         "analyze": analyze_case}


@pytest.mark.parametrize("command", list(LIVES))
@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGTERM"])
def test_a_stop_at_a_random_point_of_a_commands_life_is_one_line_and_leaves_nothing_partial(
        tmp_path, world, tiny_clip, command, how):
    life = LIVES[command](tmp_path, world, tiny_clip)
    argv = life.argv
    code, stdout, stderr, point = stopped_at_random(argv, tmp_path, life.latest, how, life.entry)
    lines = said(stderr)
    where = f"euclip {' '.join(argv)}: {how} at {point:.3f} s: exit {code}\n{stdout}{stderr}"
    assert "Traceback" not in stdout + stderr, where
    if code == 0:  # the stop came as it finished: a whole result, said as usual
        assert not lines or not lines[-1].startswith("error:"), where
    else:
        # The study's own stop names how to resume; everything else says what stopped it.
        assert code == 1 and len(lines) == 1, where
        assert lines[0] in ("error: interrupted", "error: terminated (SIGTERM)") or (
            command == "study" and "stopped" in lines[0] and "run the same command" in lines[0]), where
    life.check(code)
    assert not left_in(temporary_folder(tmp_path)), where


@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGTERM"])
def test_a_stopped_img2dataset_download_is_one_line_and_not_taken_for_a_finished_one(tmp_path, how):
    """img2dataset answers Ctrl-C with its own handler, which removes its staging folder and exits with 0: a
    download stopped there ended with exit 0 and no word, its manifest incomplete; and the terminal's Ctrl-C,
    sent to the whole process group, reached img2dataset's spawned workers too, each printing its traceback."""
    import pandas as pd

    from tests.test_download_datacomp import FAST
    from tests.webfakes import ImageHost

    host = ImageHost(delay_s=0.02)  # about 12 s for the 400 images: a stop lands mid-download
    urls = [f"{host.url}/ok/{i}.jpg" for i in range(400)]
    pd.DataFrame({"image": urls, "alt": [f"caption {i}" for i in range(400)]}).to_parquet(tmp_path / "list.parquet")
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "euclip_cli", "download", "urls", "--parquet",
                                str(tmp_path / "list.parquet"), "--url-col", "image", "--caption-col", "alt", "--out",
                                str(out), *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True,
                               env={**os.environ, "COLUMNS": "200", "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1",
                                    "TMPDIR": str(temporary_folder(tmp_path))})
    try:
        deadline = time.time() + 60
        while not list((out / "shards").glob("*.tar")) and time.time() < deadline:  # img2dataset is writing shards
            time.sleep(0.05)
        point = POINTS.uniform(0.0, 3.0)
        time.sleep(point)
        if how == "SIGTERM":
            process.send_signal(signal.SIGTERM)
        else:
            os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        host.stop()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    lines = said(stderr)
    where = f"{how} {point:.2f} s after the first shard: exit {process.returncode}\n{stderr[-2000:]}"
    manifest = json.loads((out / "manifest.json").read_text())
    if process.returncode == 0:  # it came as the download finished
        assert manifest["complete"], where
    else:
        assert process.returncode == 1 and not manifest["complete"], where
        assert lines == ["error: terminated (SIGTERM)" if how == "SIGTERM" else "error: interrupted"], where
    assert "Traceback" not in stderr and "Fatal" not in stderr and not (out / "shards" / "_tmp").exists(), where
    # Its workers import wandb, whose temporary folders a worker's exit leaves: they went in its own, now gone.
    assert not left_in(temporary_folder(tmp_path)), where


ENTRY = """
import os, signal, sys, time
from euclip_cli.cli import stops

class StopInTeardown:  # a module global's finalizer: it runs in the interpreter's last teardown
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)

def load():
    if sys.argv[1] == "while importing":  # a KeyboardInterrupt through exec, as a dataclass's import may meet it
        exec("raise KeyboardInterrupt")
    def main():
        if sys.argv[1] == "in an exit handler":
            import atexit
            atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.2)))
            sys.exit(3)
        globals()["late"] = StopInTeardown()
        sys.exit(0)
    return main

stops.launch(load)
"""


@pytest.mark.parametrize("when,code", [("while importing", 1), ("in an exit handler", 3), ("in the last teardown", 0)])
def test_a_stop_the_interpreter_would_misreport_ends_with_the_commands_own_exit_code(tmp_path, when, code):
    """Under ``python -m`` (torchrun's way in) CPython ends a process by SIGINT when a KeyboardInterrupt once passed
    through exec, whatever it was caught as (130 for a stop said as exit 1); a stop in an exit handler or in the
    teardown after them would end a finished command by its signal (143)."""
    package = tmp_path / "entry_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(ENTRY)
    done = subprocess.run([sys.executable, "-m", "entry_probe", when], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == code, done
    assert done.stderr == ("error: interrupted\n" if code == 1 else ""), done


@pytest.mark.parametrize("stop,said", [(KeyboardInterrupt, "error: interrupted"),
                                       ("terminated", "error: terminated (SIGTERM)")])
def test_a_stop_outside_a_commands_own_funnel_is_its_line_and_exit_1_not_typers_silent_130(stop, said):
    import typer
    from typer.testing import CliRunner

    from euclip_cli.cli.common import OneLineErrors
    from euclip_cli.cli.stops import Terminated

    app = typer.Typer(cls=OneLineErrors)

    @app.command()
    def work() -> None:  # no ``with errors()``: as a stop while Click parses or dispatches
        raise Terminated() if stop == "terminated" else stop()

    @app.command()
    def other() -> None:
        pass

    result = CliRunner().invoke(app, ["work"])
    assert result.exit_code == 1 and [l for l in result.output.splitlines() if l.strip()] == [said], result.output


WRAPPED = """
import sys
from euclip_cli.cli import stops


class Descriptor:
    def __set_name__(self, owner, name):
        raise KeyboardInterrupt()  # as SIGINT's handler raises it, when the signal comes here


def stopped(how):
    if how == "in a class body's __set_name__":  # Python 3.11 wraps it in a RuntimeError; later ones do not
        class Owner:
            field = Descriptor()
    try:
        raise KeyboardInterrupt()
    except KeyboardInterrupt as stop:
        raise ConnectionError("the request was aborted") from stop


def load():
    where, how = sys.argv[1:]
    if where == "while the command line imports":
        stopped(how)
    import typer
    from euclip_cli.cli.common import OneLineErrors, errors

    app = typer.Typer(cls=OneLineErrors)

    @app.command()
    def work() -> None:
        if where == "in the command's funnel":
            with errors():
                stopped(how)
        else:
            stopped(how)

    @app.command()
    def other() -> None:
        pass

    return lambda: app(["work"])


stops.launch(load)
"""


@pytest.mark.parametrize("where", ["in the command's funnel", "while Click dispatches", "while the command line imports"])
@pytest.mark.parametrize("how", ["in a class body's __set_name__", "wrapped by a library"])
def test_a_stop_that_python_or_a_library_wraps_in_another_error_is_still_the_stops_one_line(where, how):
    """Ctrl-C 2 s into ``download redcaps`` once ended in a traceback: it came as torch's imports made a dataclass,
    inside ``__set_name__``, where Python 3.11 turns whatever is raised into a RuntimeError caused by it."""
    done = subprocess.run([sys.executable, "-c", WRAPPED, where, how], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == "error: interrupted\n", done


HALF_MADE = """
import sys
from euclip_cli.cli import stops


class HalfMade:  # as a DataLoader's iterator is, stopped while it starts its workers
    def __del__(self):
        raise AttributeError("'HalfMade' object has no attribute '_workers_status'")


def load():
    import typer
    from euclip_cli.cli.common import OneLineErrors, errors

    app = typer.Typer(cls=OneLineErrors)

    @app.command()
    def work() -> None:
        import atexit

        atexit.register(HalfMade)  # made and dropped as the command ends: its finalizer runs then
        with errors():
            if sys.argv[1] == "after a stop":
                raise KeyboardInterrupt()

    @app.command()
    def other() -> None:
        pass

    return lambda: app(["work"])


stops.launch(load)
"""


@pytest.mark.parametrize("when", ["after a stop", "without one"])
def test_an_object_the_stop_cut_short_fails_in_its_finalizer_silently_and_only_then(when):
    """Ctrl-C as clip-benchmark's exporter started its DataLoader's workers printed "Exception ignored in ...
    __del__" under the stop's line: the half-made iterator, collected after it. Without a stop, such a failure is
    a fault and Python's report of it stays."""
    done = subprocess.run([sys.executable, "-c", HALF_MADE, when], capture_output=True, text=True, timeout=60)
    if when == "after a stop":
        assert done.returncode == 1 and done.stderr == "error: interrupted\n", done
    else:
        assert done.returncode == 0 and "Exception ignored in" in done.stderr and "_workers_status" in done.stderr, done


def test_a_stop_inside_held_stops_takes_effect_as_the_block_ends_and_a_set_of_files_stays_whole(tmp_path):
    from euclip_cli.rundir import files_together, held_stops

    class Stopped(Exception):
        pass

    def stop(signum, frame):
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, stop)
    steps = []
    study = tmp_path / "study"
    study.mkdir()
    for name in ("study.csv", "study.md"):
        (study / name).write_text("the last study's")
    try:
        with pytest.raises(Stopped):
            with held_stops():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # a handler left in place would have raised by now
                steps.append("finished")
        with pytest.raises(Stopped):  # a stop while the new set is written: none of it replaces the last
            with files_together(study) as staging:
                (staging / "study.csv").write_text("new")
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                (staging / "study.md").write_text("new")
        assert {p.name: p.read_text() for p in study.iterdir()} == {"study.csv": "the last study's",
                                                                    "study.md": "the last study's"}
        with files_together(study) as staging:
            for name in ("study.csv", "study.md"):
                (staging / name).write_text("new")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert steps == ["finished"]
    assert {p.name: p.read_text() for p in study.iterdir()} == {"study.csv": "new", "study.md": "new"}
