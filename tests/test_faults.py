"""The fault suite: mistakes a user makes and faults the machine causes, each through the CLI.

Every case asserts the exit code (2 for usage, 1 for failures), exactly one ``error:`` line that
names the culprit, no traceback, an answer within a time limit, and that nothing already in the
working folder changed. Cases that train or download live beside their subject
(test_trainer_faults.py, test_download_datacomp.py, test_evalsets.py); this table covers the
commands' edges that need no training.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from typer.testing import CliRunner

from euclip_cli.cli.main import app

runner = CliRunner()
TIME_LIMIT_S = 120


@dataclass
class Case:
    name: str
    argv: list[str]  # "{tmp}" and "{world}" are filled in
    code: int
    culprit: list[str]  # fragments the single error line must contain
    setup: Callable[[Path, Path], None] = field(default=lambda tmp, world: None)
    env: dict = field(default_factory=dict)  # environment variables set for the command


def _write(rel: str, data: bytes | str) -> Callable[[Path, Path], None]:
    def setup(tmp: Path, world: Path) -> None:
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def _both(*setups) -> Callable[[Path, Path], None]:
    return lambda tmp, world: [s(tmp, world) for s in setups]


def _run_dir(rel: str, config: str | None = '{"recipe": "tiny-clip"}', checkpoint: bytes | None = None):
    """A run directory with a given config.json text and, optionally, one checkpoint's bytes."""
    def setup(tmp: Path, world: Path) -> None:
        run = tmp / rel
        (run / "checkpoints").mkdir(parents=True)
        if config is not None:
            (run / "config.json").write_text(config)
        if checkpoint is not None:
            (run / "checkpoints" / "step_4.pt").write_bytes(checkpoint)
            (run / "checkpoints" / "latest").write_text("step_4.pt")
    return setup


def _trained_config(tmp: Path, world: Path) -> str:
    from euclip_cli import config as C

    return json.dumps(C.to_dict(C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}"])))


def _real_run(rel: str, checkpoint: bytes | None):
    def setup(tmp: Path, world: Path) -> None:
        _run_dir(rel, _trained_config(tmp, world), checkpoint)(tmp, world)
    return setup


def _checkpointed_run(rel: str, drop_key: bool = False):
    """A run whose step_4.pt holds an untrained tiny-clip model, as the trainer writes it; with
    ``drop_key``, one weight is missing, as after a code change that renamed a parameter."""
    def setup(tmp: Path, world: Path) -> None:
        import io

        import torch

        from euclip_cli import config as C
        from euclip_cli.model import EuclipModel
        from euclip_cli.rundir import checkpoint_meta

        config = json.loads(_trained_config(tmp, world))
        model = EuclipModel(C.from_dict(config))
        weights = model.state_dict()
        if drop_key:
            weights.pop("clip.text_projection")
        state = {"model": weights, "step": 4, "config": config,
                 "meta": checkpoint_meta(config, model.geometry.logit, model.embed_dim)}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        _run_dir(rel, json.dumps(config), buffer.getvalue())(tmp, world)
    return setup


def _saved_run(rel: str, damage: str, seed: int = 0):
    """A run whose trainer-written checkpoints step_2.pt and step_4.pt (each with its digest and the run's
    fingerprint) are then damaged: ``cut`` (truncated), ``flip`` (one byte changed, the size kept), ``foreign``
    (step_4.pt and its digest copied in from a run of another seed), ``latest`` (a pointer that is not text)."""
    def setup(tmp: Path, world: Path) -> None:
        from euclip_cli import config as C
        from euclip_cli.model import EuclipModel
        from euclip_cli.rundir import RunDir

        def saved(path: Path, seed: int) -> RunDir:
            cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", f"train.seed={seed}"])
            run, model = RunDir(path), EuclipModel(cfg)
            run.claim(C.to_dict(cfg), {})
            for step in (2, 4):
                run.save_checkpoint({"model": model.state_dict(), "step": step, "config": C.to_dict(cfg)}, step, keep=2)
            return run

        run = saved(tmp / rel, seed)
        newest = run.checkpoints_dir / "step_4.pt"
        data = newest.read_bytes()
        if damage == "cut":
            newest.write_bytes(data[: len(data) // 2])
        elif damage == "flip":
            newest.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
        elif damage == "foreign":
            other = saved(tmp / "elsewhere", seed + 1)
            for suffix in ("", ".sha256"):
                (run.checkpoints_dir / f"step_4.pt{suffix}").write_bytes(
                    (other.checkpoints_dir / f"step_4.pt{suffix}").read_bytes())
        elif damage == "latest":
            (run.checkpoints_dir / "latest").write_bytes(b"\xff\xfe step")
        elif damage == "latest-fifo":
            (run.checkpoints_dir / "latest").unlink()
            os.mkfifo(run.checkpoints_dir / "latest")
    return setup


def _copy_world(world: Path, tmp: Path) -> None:
    """The test world where every world recipe looks for its data, as `euclip download world` with
    other settings than the recipe's would leave it."""
    import shutil

    shutil.copytree(world, tmp / "data" / "world")


def _world_copy(rel: str, damage: str):
    """A copy of the test world at ``rel`` with its first training shard (``cut-shard``), its manifest
    (``cut-manifest``) or the shapes task's shard (``cut-eval``) cut to half its size, or that shard's images
    replaced by text (``text-as-image``)."""
    def setup(tmp: Path, world: Path) -> None:
        import io
        import shutil
        import tarfile

        shutil.copytree(world, tmp / rel)
        if damage == "text-as-image":  # every .jpg member of the shapes shard replaced by text
            path = tmp / rel / "eval" / "shapes" / "test" / "0.tar"
            members = []
            with tarfile.open(path) as tar:
                for m in tar.getmembers():
                    data = tar.extractfile(m).read()
                    members.append((m.name, b"not a picture" if m.name.endswith((".jpg", ".png", ".webp")) else data))
            with tarfile.open(path, "w") as tar:
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            return
        path = tmp / rel / {"cut-shard": "train/00000.tar", "cut-manifest": "manifest.json",
                            "cut-eval": "eval/shapes/test/0.tar"}[damage]
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return setup


def _pictures(tmp: Path, world: Path) -> None:
    """A folder of one real image and one text file named as a JPEG, and a caption list."""
    pics = tmp / "pics"
    pics.mkdir()
    (pics / "a.png").write_bytes(_png())
    (pics / "notes.jpg").write_text("this is not a picture")
    (tmp / "captions.txt").write_text("a red circle\na blue square\n")


def _png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


AUTHORS = ["--geometry", "euclidean", "--logit", "d2", "--arch", "ViT-B-16"]
TRAIN = ["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs", "data.train_dir={world}/train"]

CASES = [
    # ---- recipes and overrides
    Case("recipe not UTF-8", ["recipes", "validate", "{tmp}/latin1.toml"], 2, ["latin1.toml", "not UTF-8", "line 2"],
         _write("latin1.toml", b'extends = "tiny-clip"\n# caf\xe9\n')),
    Case("training recipe not UTF-8", ["train", "--recipe", "{tmp}/latin1.toml"], 2, ["latin1.toml", "not UTF-8"],
         _write("latin1.toml", b'extends = "tiny-clip"\n# caf\xe9\n')),
    Case("study recipe not UTF-8", ["study", "--recipe", "{tmp}/study-latin1.toml"], 2,
         ["study-latin1.toml", "not UTF-8"], _write("study-latin1.toml", b"# \xff\n")),
    Case("recipe is a folder", ["train", "--recipe", "{tmp}/folder.toml"], 2, ["folder.toml is a folder"],
         lambda tmp, world: (tmp / "folder.toml").mkdir()),
    Case("recipe not found", ["train", "--recipe", "no-such-recipe"], 2, ["no-such-recipe", "euclip recipes list"]),
    Case("recipe not TOML", ["recipes", "validate", "{tmp}/broken.toml"], 2, ["broken.toml", "not valid TOML"],
         _write("broken.toml", "extends = \n")),
    Case("recipe extends itself", ["recipes", "validate", "{tmp}/loop.toml"], 2, ["loop.toml", "cycle"],
         _write("loop.toml", 'extends = "{tmp}/loop.toml"\n')),
    Case("unknown override key", [*TRAIN, "optim.lrr=0.1"], 2, ["optim.lrr"]),
    Case("override without =", [*TRAIN, "optim.lr"], 2, ["optim.lr", "key=value"]),
    Case("override of the wrong type", [*TRAIN, "data.batch_size=big"], 2, ["data.batch_size", "big"]),
    Case("negative workers", [*TRAIN, "data.workers=-1"], 2, ["data.workers", "-1", ">= 0"]),
    Case("nan learning rate", [*TRAIN, "optim.lr=nan"], 2, ["optim.lr", "nan"]),
    Case("log every 0 steps", [*TRAIN, "train.log_every=0"], 2, ["train.log_every", ">= 1"]),
    Case("skip limit above 1", [*TRAIN, "data.max_skipped_fraction=2"], 2, ["data.max_skipped_fraction", "[0, 1]"]),
    Case("a device that does not exist", [*TRAIN, "train.device=tpu"], 2, ["device 'tpu'", "cpu"]),
    Case("training on a GPU the machine lacks", [*TRAIN, "train.device=cuda"], 2,
         ["device 'cuda'", "no CUDA GPU", "cpu or auto"]),
    Case("an unknown architecture", [*TRAIN, "model.arch=NoSuch"], 2, ["model.arch 'NoSuch'", "open_clip"]),
    Case("a key given twice", [*TRAIN, "optim.lr=1e-3", "optim.lr=2e-3"], 2,
         ["optim.lr=2e-3", "optim.lr is already given", "optim.lr=1e-3", "once"]),
    # The configuration is the first thing checked: a bad key is named before the data a run would read.
    Case("an unknown architecture and no data", ["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs",
                                                 "data.train_dir={tmp}/nothere", "model.arch=NoSuch"], 2,
         ["model.arch 'NoSuch'"]),
    # ---- names that become folders
    Case("a run name that climbs out", [*TRAIN, "--name", "../outside"], 2, ["--name '../outside' is a path"]),
    Case("a run name that is the runs folder", [*TRAIN, "--name", "."], 2, ["--name '.'", "not a folder name"]),
    Case("an empty run name", [*TRAIN, "--name", ""], 2, ["--name ''", "not a folder name"]),
    Case("an import named by a path", ["import", "meru", "{tmp}/x.pth", "--runs-dir", "{tmp}/runs", "--name",
                                       "a/b"], 2, ["--name 'a/b' is a path"], _write("x.pth", b"")),
    Case("a study configuration named by a path", ["study", "--recipe", "{tmp}/study-names.toml"], 2,
         ["study-names.toml: configs", "'../up' is a path"],
         _write("study-names.toml", '[study]\nseeds = 1\n[configs."../up"]\nrecipe = "tiny-clip"\n'
                                    '[configs.clip]\nrecipe = "tiny-clip"\n[configs.euclip]\nrecipe = "tiny-euclip"\n')),
    Case("a study file whose name leaves no study name", ["study", "--recipe", "{tmp}/study-.toml"], 2,
         ["study-.toml: the study's name", "is not a folder name"],
         _write("study-.toml", '[study]\nseeds = 1\n[configs.clip]\nrecipe = "tiny-clip"\n'
                               '[configs.euclip]\nrecipe = "tiny-euclip"\n')),
    Case("class tokens without product sphere", [*TRAIN, "model.class_tokens=4"], 2, ["model.class_tokens"]),
    # ---- training data
    Case("training data folder missing", ["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs",
                                          "data.train_dir={tmp}/nothere"], 2, ["{tmp}/nothere", "does not exist"]),
    Case("training data folder empty", ["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs",
                                        "data.train_dir={tmp}/empty"], 2, ["no training shards", "{tmp}/empty"],
         lambda tmp, world: (tmp / "empty").mkdir()),
    Case("a file given as the training data folder", ["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs",
                                                      "data.train_dir={tmp}/shard.tar"], 2,
         ["{tmp}/shard.tar is a file", "folder that holds the shards"], _write("shard.tar", b"x")),
    Case("the shared world generated with other settings", ["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs"],
         2, ["data/world holds a world generated with other settings", "samples=1500, not 50000 (data.world_samples)",
             "delete data/world", "euclip download --recipe tiny-clip"], lambda tmp, world: _copy_world(world, tmp)),
    Case("a study on a shared world of other settings", ["study", "--recipe", "study-geometries", "--out", "{tmp}/st"],
         2, ["data/world holds a world generated with other settings", "data.world_samples", "configuration clip",
             "delete data/world"], lambda tmp, world: _copy_world(world, tmp)),
    Case("a file given as the runs folder", [*TRAIN[:3], "--runs-dir", "{tmp}/file", TRAIN[-1]], 2,
         ["{tmp}/file is a file where a folder is needed", "give a folder path"], _write("file", "x")),
    Case("training resumed from a checkpoint that does not fit", [*TRAIN, "--name", "misfit"], 1,
         ["{tmp}/runs/misfit/checkpoints/step_4.pt does not fit", "clip.text_projection", "another euclip version"],
         _checkpointed_run("runs/misfit", drop_key=True)),
    Case("a run holding another configuration", [*TRAIN, "--name", "other", "optim.lr=0.1"], 2,
         ["holds a run with another configuration", "optim.lr", "--name NEW"], _real_run("runs/other", None)),
    # ---- evaluation
    Case("eval of a run that does not exist", ["eval", "{tmp}/nothere"], 2, ["no run", "{tmp}/nothere"]),
    Case("eval of a run without a checkpoint", ["eval", "{tmp}/runs/fresh"], 2, ["fresh", "checkpoint"],
         _real_run("runs/fresh", None)),
    # A checkpoint is trusted only whole, readable and the run's own: never an older one in its place.
    Case("eval when the newest checkpoint was cut after it was written", ["eval", "{tmp}/runs/r", "--tasks",
                                                                          "world:main"], 1,
         ["{tmp}/runs/r/checkpoints/step_4.pt is damaged", "bytes where", "restore it", "(step_2.pt)"],
         _saved_run("runs/r", "cut")),
    Case("analyze when one byte of the newest checkpoint changed", ["analyze", "isotropy", "{tmp}/runs/r"], 1,
         ["step_4.pt is damaged: its sha256"], _saved_run("runs/r", "flip")),
    Case("eval of a checkpoint copied in from another run", ["eval", "{tmp}/runs/r", "--tasks", "world:main"], 1,
         ["step_4.pt belongs to another run", "{tmp}/runs/r/meta.json"], _saved_run("runs/r", "foreign")),
    Case("train resuming from a checkpoint copied in from another run", [*TRAIN, "--name", "r"], 1,
         ["step_4.pt belongs to another run"], _saved_run("runs/r", "foreign")),
    Case("eval when 'latest' is not text", ["eval", "{tmp}/runs/r", "--tasks", "world:main"], 1,
         ["{tmp}/runs/r/checkpoints/latest", "a short UTF-8 text file", "delete it"], _saved_run("runs/r", "latest")),
    # Every reader of the pointer alike: a resume read it apart once, and gave a traceback.
    Case("train resuming when 'latest' is not text", [*TRAIN, "--name", "r"], 1,
         ["{tmp}/runs/r/checkpoints/latest", "a short UTF-8 text file", "delete it"], _saved_run("runs/r", "latest")),
    Case("eval when 'latest' is a FIFO", ["eval", "{tmp}/runs/r", "--tasks", "world:main"], 1,
         ["{tmp}/runs/r/checkpoints/latest", "a short UTF-8 text file"], _saved_run("runs/r", "latest-fifo")),
    # Numbers a machine cannot hold are refused as they are parsed, naming the key or option.
    Case("train with a batch whose images alone exceed the machine's memory",
         [*TRAIN, "data.batch_size=4611686018427387904", "optim.samples=4611686018427387904"], 2,
         ["data.batch_size=4611686018427387904", "GiB per process", "lower it"]),
    Case("train with a seed beyond 64 bits", [*TRAIN, "train.seed=18446744073709551617"], 2,
         ["train.seed", "within 64 bits"]),
    Case("a study of a billion seeds", ["study", "--recipe", "study-geometries", "--seeds", "1000000000", "--plan"], 2,
         ["--seeds"]),
    Case("download world with a hundred thousand workers", ["download", "world", "--out", "{tmp}/w", "--workers",
                                                           "100000"], 2, ["--workers"]),
    # Recipes that would exhaust Python's recursion.
    Case("train with a recipe whose 'extends' chain is a hundred deep", ["train", "--recipe", "{tmp}/chain/r0.toml",
                                                                         "--runs-dir", "{tmp}/runs"], 2,
         ["'extends' chains more than 32 recipes"],
         _both(*(_write(f"chain/r{i}.toml", f'extends = "{{tmp}}/chain/r{i + 1}.toml"\n') for i in range(100)),
               _write("chain/r100.toml", 'extends = "tiny-clip"\n'))),
    Case("train with a recipe nested thousands deep", ["train", "--recipe", "{tmp}/deep.toml"], 2,
         ["deep.toml: nested too deeply"], _write("deep.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n")),
    Case("study --status of a folder that records no study, without --recipe",
         ["study", "--out", "{tmp}/a-folder", "--status"], 2, ["--recipe is missing", "study.json"],
         _write("a-folder/note.txt", "not a study\n")),
    Case("study --status when the folder's record of its options is damaged",
         ["study", "--out", "{tmp}/s", "--status"], 2, ["{tmp}/s/study.json", "--recipe"],
         _write("s/study.json", '{"recipe": 7}')),
    Case("a study recipe nested thousands deep", ["study", "--recipe", "{tmp}/study-deep.toml", "--plan"], 2,
         ["study-deep.toml: nested too deeply"], _write("study-deep.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n")),
    # Environment variables, checked where first read: named, never a traceback or a wait.
    Case("train with a RANK that is not a number", TRAIN, 2, ["RANK='x'", "torchrun"],
         env={"WORLD_SIZE": "2", "RANK": "x", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}),
    Case("train with a WORLD_SIZE that is not a number", TRAIN, 2, ["WORLD_SIZE='two'"], env={"WORLD_SIZE": "two"}),
    Case("train with a RANK outside WORLD_SIZE", TRAIN, 2, ["RANK='5'", "[0, 1]"],
         env={"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}),
    Case("train with WORLD_SIZE but no MASTER_ADDR", TRAIN, 2, ["MASTER_ADDR is not set"],
         env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "29500"}),
    Case("push with a token pasted with its line break", ["push", "{tmp}/runs/good", "me/model"], 2,
         ["HF_TOKEN", "line break"], _checkpointed_run("runs/good"), env={"HF_TOKEN": "hf_abc\n"}),
    Case("import from the Hub with a token holding a character that is not ASCII",
         ["import", "euclip-export", "hf://me/model", "--name", "x", "--runs-dir", "{tmp}/runs"], 2,
         ["HF_TOKEN", "not ASCII"], env={"HF_TOKEN": "hf_\u00e9t\u00e9", "HF_ENDPOINT": "http://127.0.0.1:9"}),
    Case("download an evaluation set with a token holding a character that is not ASCII",
         ["download", "evalsets", "--tasks", "cifar10", "--root", "{tmp}/e"], 2,
         ["HF_TOKEN", "not ASCII"], env={"HF_TOKEN": "hf_\u00e9t\u00e9"}),
    Case("import from the Hub with an HF_ENDPOINT that is not a URL",
         ["import", "euclip-export", "hf://me/model", "--name", "x", "--runs-dir", "{tmp}/runs"], 2,
         ["HF_ENDPOINT='not a url'"], env={"HF_ENDPOINT": "not a url"}),
    Case("import from the Hub with an HF_ENDPOINT urllib cannot parse",
         ["import", "euclip-export", "hf://me/model", "--name", "x", "--runs-dir", "{tmp}/runs"], 2,
         ["HF_ENDPOINT='http://[bad'"], env={"HF_ENDPOINT": "http://[bad"}),
    # The Hub's edges: a name its validator refuses, a Hub that does not answer.
    Case("push to a repository name the Hub refuses", ["push", "{tmp}/runs/good", "me/re..po"], 2,
         ["'me/re..po' is not a name the Hub accepts", "choose another"], _checkpointed_run("runs/good"),
         env={"HF_TOKEN": "hf_abc", "HF_ENDPOINT": "http://127.0.0.1:9"}),

    # Evaluation sets that cannot be read are named with their folder and the command that fetches them.
    Case("eval on a world whose shapes shard was cut", ["eval", "{tmp}/runs/good", "--tasks", "world/shapes",
                                                        "--world", "{tmp}/w"], 1,
         ["world/shapes: its evaluation set in {tmp}/w/eval/shapes cannot be read", "euclip download world"],
         _both(_checkpointed_run("runs/good"), _world_copy("w", "cut-eval"))),
    Case("eval on a world whose shapes shard holds a member that is not an image",
         ["eval", "{tmp}/runs/good", "--tasks", "world/shapes", "--world", "{tmp}/w"], 1,
         ["world/shapes: its evaluation set in {tmp}/w/eval/shapes cannot be read"],
         _both(_checkpointed_run("runs/good"), _world_copy("w", "text-as-image"))),
    # A world is trusted only finished and whole.
    Case("train on the shared world folder whose generation was cut short",
         ["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs"], 2,
         ["data/world holds no finished embedded world", "euclip download --recipe tiny-clip"],
         _both(lambda tmp, world: _copy_world(world, tmp),
               lambda tmp, world: (tmp / "data" / "world" / "manifest.json").unlink())),
    Case("train on a world whose shard was cut after it was written", [*TRAIN[:-1], "data.train_dir={tmp}/w/train"], 1,
         ["{tmp}/w/train/00000.tar has", "bytes where", "delete {tmp}/w"], _world_copy("w", "cut-shard")),
    Case("train on a world whose manifest was cut", [*TRAIN[:-1], "data.train_dir={tmp}/w/train"], 1,
         ["{tmp}/w/manifest.json is not valid JSON"], _world_copy("w", "cut-manifest")),
    Case("eval of a truncated checkpoint", ["eval", "{tmp}/runs/cut", "--tasks", "world:main"], 1,
         ["step_4.pt"], _real_run("runs/cut", b"PK\x03\x04 cut short")),
    Case("eval of a checkpoint that does not fit", ["eval", "{tmp}/runs/misfit", "--tasks", "world:main"], 1,
         ["step_4.pt does not fit", "1 key(s) the model needs are missing (first: clip.text_projection)"],
         _checkpointed_run("runs/misfit", drop_key=True)),
    Case("eval when 'latest' names a deleted checkpoint and no other exists", ["eval", "{tmp}/runs/gone"], 1,
         ["'latest' names 'step_9.pt', which is missing", "restore one"],
         _both(_real_run("runs/gone", None), _write("runs/gone/checkpoints/latest", "step_9.pt"))),
    Case("eval on a GPU the machine lacks", ["eval", "{tmp}/runs/good", "--device", "cuda:1", "--tasks",
                                             "world:main"], 2, ["device 'cuda:1'", "no CUDA GPU"],
         _checkpointed_run("runs/good")),
    Case("eval of an unknown task", ["eval", "{tmp}/runs/fresh", "--tasks", "no_such_task"], 2, ["no_such_task"],
         _real_run("runs/fresh", None)),
    # ---- report
    Case("report of a file as runs folder", ["report", "--runs-dir", "{tmp}/file", "--out", "{tmp}/tables"], 2,
         ["{tmp}/file is not a folder"], _write("file", "x")),
    Case("report with a cut config.json", ["report", "--runs-dir", "{tmp}/runs", "--out", "{tmp}/tables"], 1,
         ["{tmp}/runs/cut/config.json", "not valid JSON"], _run_dir("runs/cut", '{"recipe"')),
    # A run's files read back: a damaged line or file is named with its line, never a traceback.
    Case("report when config.json is a list", ["report", "--runs-dir", "{tmp}/runs", "--out", "{tmp}/tables"], 1,
         ["{tmp}/runs/lst/config.json is not a run's configuration"], _run_dir("runs/lst", "[1, 2]")),
    Case("report when eval.jsonl holds a null line", ["report", "--runs-dir", "{tmp}/runs", "--out", "{tmp}/tables"], 1,
         ["{tmp}/runs/good/eval.jsonl, line 2", "null where a JSON object belongs", "delete that line"],
         _both(_checkpointed_run("runs/good"),
               _write("runs/good/eval.jsonl", '{"key": "world/shapes", "checkpoint": "c", "step": 4}\nnull\n'))),
    Case("eval when an eval.jsonl line lacks its key", ["eval", "{tmp}/runs/good", "--tasks", "world/shapes"], 1,
         ["{tmp}/runs/good/eval.jsonl, line 1", "'key' is null"],
         _both(_checkpointed_run("runs/good"), _write("runs/good/eval.jsonl", '{"checkpoint": "c", "step": 4}\n'))),
    Case("report when an eval.jsonl step is a string", ["report", "--runs-dir", "{tmp}/runs", "--out", "{tmp}/tables"],
         1, ["eval.jsonl, line 1", "'step' is \"4\", not an integer"],
         _both(_checkpointed_run("runs/good"),
               _write("runs/good/eval.jsonl", '{"key": "world/shapes", "checkpoint": "c", "step": "4"}\n'))),
    Case("report when metrics.jsonl holds bytes that are not UTF-8",
         ["report", "--runs-dir", "{tmp}/runs", "--out", "{tmp}/tables"], 1,
         ["{tmp}/runs/good/metrics.jsonl, line 2", "not UTF-8"],
         _both(_checkpointed_run("runs/good"), _write("runs/good/metrics.jsonl", b'{"step": 1}\n\xff\xfe{"step"\n'))),
    Case("report into a file", ["report", "--runs-dir", "{tmp}/runs", "--out", "{tmp}/tables.md"], 2,
         ["{tmp}/tables.md is a file where a folder is needed"], _write("tables.md", "my notes")),
    Case("report of an unknown table", ["report", "--table", "9"], 2, ["--table '9'"]),
    Case("report in an unknown format", ["report", "--format", "docx"], 2, ["--format 'docx'"]),
    # ---- import
    # ---- export and push
    Case("export of a run without a checkpoint", ["export", "{tmp}/runs/fresh", "{tmp}/out"], 2,
         ["fresh", "checkpoint"], _real_run("runs/fresh", None)),
    Case("export into a folder that holds something", ["export", "{tmp}/runs/good", "{tmp}/busy"], 2,
         ["{tmp}/busy exists and is not empty"], _both(_checkpointed_run("runs/good"), _write("busy/notes.txt", "mine"))),
    Case("export of a damaged checkpoint", ["export", "{tmp}/runs/r", "{tmp}/out"], 1,
         ["step_4.pt is damaged"], _saved_run("runs/r", "cut")),
    Case("push to a name that is not OWNER/NAME", ["push", "{tmp}/runs/good", "just-a-name"], 2,
         ["'just-a-name'", "OWNER/NAME"], _checkpointed_run("runs/good")),
    Case("import of a folder that is not an export", ["import", "euclip-export", "{tmp}/plain", "--name", "x",
                                                      "--runs-dir", "{tmp}/runs"], 2,
         ["{tmp}/plain is not a euclip export", "euclip_config.json"], _write("plain/notes.txt", "mine")),
    Case("import of a missing file", ["import", "euclip-authors", "{tmp}/none.pt", "--name", "x", "--runs-dir",
                                      "{tmp}/runs"], 2, ["{tmp}/none.pt", "no such file"]),
    Case("import of a file that is not a checkpoint", ["import", "euclip-authors", "{tmp}/notes.pt", "--name", "x",
                                                       "--runs-dir", "{tmp}/runs", *AUTHORS], 1, ["notes.pt"],
         _write("notes.pt", "just text, not a checkpoint")),
    Case("import of a malformed Hub path", ["import", "meru", "hf://only-owner", "--name", "x", "--runs-dir",
                                            "{tmp}/runs"], 2, ["hf://only-owner", "hf://OWNER/REPO/PATH"]),
    Case("import of an unknown released format", ["import", "jax", "{tmp}/notes.pt", "--name", "x"], 2, ["jax"],
         _write("notes.pt", "x")),
    # ---- downloads (no network needed to refuse these)
    Case("an unknown DataComp scale", ["download", "datacomp", "--scale", "xl", "--out", "{tmp}/dc"], 2, ["--scale 'xl'"]),
    Case("an unknown filter", ["download", "datacomp", "--scale", "small", "--filter", "best", "--out", "{tmp}/dc"],
         2, ["--filter 'best'"]),
    Case("an unknown distributor", ["download", "datacomp", "--scale", "small", "--distributor", "dask", "--out",
                                    "{tmp}/dc"], 2, ["--distributor 'dask'"]),
    Case("a uid file that does not exist", ["download", "datacomp", "--scale", "small", "--uids", "{tmp}/u.npy",
                                            "--out", "{tmp}/dc"], 2, ["u.npy does not exist"]),
    Case("a uid file of the wrong format", ["download", "datacomp", "--scale", "small", "--uids", "{tmp}/u.npy",
                                            "--out", "{tmp}/dc"], 2, ["u.npy"], _write("u.npy", b"not numpy")),
    Case("a url list that does not exist", ["download", "urls", "--parquet", "{tmp}/l.parquet", "--out", "{tmp}/o"],
         2, ["l.parquet"]),
    Case("a url list that is not parquet", ["download", "urls", "--parquet", "{tmp}/l.parquet", "--out", "{tmp}/o"],
         2, ["--parquet {tmp}/l.parquet is not a readable parquet file"], _write("l.parquet", b"PAR1 cut short")),
    Case("DataComp shards into a file", ["download", "datacomp", "--scale", "small", "--out", "{tmp}/file"], 2,
         ["{tmp}/file is a file where a folder is needed"], _write("file", "x")),
    Case("the embedded world into a file", ["download", "world", "--out", "{tmp}/file"], 2,
         ["{tmp}/file is a file where a folder is needed"], _write("file", "x")),
    Case("a world of objects too small to draw", ["download", "world", "--out", "{tmp}/w", "--object-scale", "0.1"], 2,
         ["--object-scale 0.1 must lie in [0.3, 2]"]),
    Case("a world with more mismatched captions than captions", ["download", "world", "--out", "{tmp}/w",
                                                                 "--mismatch", "1.5"], 2, ["--mismatch 1.5 must lie in [0, 1)"]),
    Case("eval sets into a file", ["download", "evalsets", "--tasks", "imagenet1k", "--root", "{tmp}/file",
                                   "--base-url", "http://127.0.0.1:9"], 2,
         ["--root", "{tmp}/file is a file where a folder is needed"], _write("file", "x")),
    Case("eval sets for an unknown task", ["download", "evalsets", "--tasks", "no_such_task", "--root", "{tmp}/ev"],
         2, ["no_such_task"]),
    Case("eval sets from a host that is not there", ["download", "evalsets", "--tasks", "imagenet1k", "--root",
                                                     "{tmp}/ev", "--base-url", "http://127.0.0.1:9"], 1,
         ["imagenet1k", "could not reach"]),
    # ---- analyses
    Case("analysis of a run that does not exist", ["analyze", "distances", "{tmp}/nothere"], 2, ["{tmp}/nothere"]),
    Case("isotropy of a run without a checkpoint", ["analyze", "isotropy", "{tmp}/runs/fresh"], 2,
         ["fresh", "checkpoint"], _real_run("runs/fresh", None)),
    Case("equilibrium with a bad temperature grid", ["analyze", "equilibrium", "{tmp}/runs/fresh", "--temperatures",
                                                     "1,100"], 2, ["--temperatures"], _real_run("runs/fresh", None)),
    Case("a traversal of a folder holding a non-image", ["analyze", "traverse", "{tmp}/runs/good", "--image-dir",
                                                         "{tmp}/pics", "--captions", "{tmp}/captions.txt",
                                                         "--root-samples", "2"], 2,
         ["{tmp}/pics/notes.jpg is not an image", "remove it"], _both(_checkpointed_run("runs/good"), _pictures)),
    Case("a traversal whose --image-dir is a file", ["analyze", "traverse", "{tmp}/runs/fresh", "--image-dir",
                                                     "{tmp}/file", "--captions", "{tmp}/file"], 2,
         ["--image-dir {tmp}/file is not a folder"], _both(_real_run("runs/fresh", None), _write("file", "x"))),
    # ---- studies
    Case("a study recipe that does not exist", ["study", "--recipe", "study-nothing"], 2, ["study-nothing"]),
    Case("a study written into a file", ["study", "--recipe", "study-geometries", "--out", "{tmp}/file"], 2,
         ["{tmp}/file is a file where a folder is needed"], _write("file", "x")),
    Case("a study with zero seeds", ["study", "--recipe", "study-geometries", "--seeds", "0"], 2,
         ["'--seeds'", "euclip study --help"]),
    # ---- Click's own checks, in euclip's form
    Case("an unknown command", ["trian"], 2, ["No such command 'trian'", "euclip --help"]),
    Case("a missing required option", ["train"], 2, ["'--recipe'", "euclip train --help"]),
    Case("an unknown option", ["report", "--colour"], 2, ["--colour", "euclip report --help"]),
    Case("an option value out of range", ["download", "datacomp", "--scale", "small", "--chunk", "0"], 2,
         ["'--chunk'", "euclip download datacomp --help"]),
    Case("a non-number where a number goes", ["analyze", "equilibrium", "run", "--batches", "many"], 2,
         ["'--batches'", "valid integer"]),
]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def time_limit():
    def expired(signum, frame):
        raise TimeoutError(f"the command did not answer within {TIME_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TIME_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_fault_is_one_line_naming_its_culprit_and_changes_nothing(case, world, tmp_path, monkeypatch, time_limit):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    case.setup(tmp_path, world)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    fill = lambda text: text.replace("{tmp}", str(tmp_path)).replace("{world}", str(world))
    for path in (p for p in tmp_path.rglob("*.toml") if p.is_file()):
        path.write_bytes(path.read_bytes().replace(b"{tmp}", str(tmp_path).encode()))
    before = snapshot(tmp_path)
    result = runner.invoke(app, [fill(a) for a in case.argv])
    output = result.output
    assert result.exit_code == case.code, output
    assert "Traceback" not in output and not (result.exception and not isinstance(result.exception, SystemExit)), \
        repr(result.exception)
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]
    assert len(errors) == 1, output
    text = " ".join(" ".join(lines[errors[0]:]).split())  # Rich wraps long lines
    for fragment in case.culprit:
        assert " ".join(fill(fragment).split()) in text, text
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing already there changed
    if os.environ.get("EUCLIP_FAULTS_STRICT"):
        assert set(after) == set(before), set(after) - set(before)


def test_the_suite_covers_every_command():
    from typer.main import get_command

    commands = set(get_command(app).commands)
    covered = {c.argv[0] for c in CASES}
    assert commands - covered <= {"bench"}, commands - covered  # bench's faults: tests/test_bench.py


def test_a_write_the_disk_cannot_hold_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    import errno

    from euclip_cli.rundir import write_text_atomic

    target = tmp_path / "config.json"
    target.write_text('{"old": true}')
    real = Path.write_text

    def full_disk(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2], *args, **kwargs)  # half of it reached the disk
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError):
        write_text_atomic(target, '{"new": "a longer text than the old one"}')
    monkeypatch.undo()
    assert target.read_text() == '{"old": true}' and sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


@pytest.mark.parametrize("columns", ["0", "-1", "1", "abc"])
def test_an_error_line_shows_whatever_width_columns_names(columns, tmp_path):
    """Rich sizes lines by COLUMNS and printed nothing at all at 0: the consoles are made at import, so a
    real process, with the width set before it starts."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "euclip_cli", "train", "--recipe", "no-such-recipe"], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": columns}, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == ["error: recipe 'no-such-recipe' not found (run 'euclip recipes list' to see "
                                        "the recipes)"], done.stderr


@pytest.mark.parametrize("metrics", ["", '{"step": 0}\n'])
def test_a_report_whose_only_run_was_killed_before_its_first_step_draws_no_curve(metrics, world, tmp_path):
    """A run killed before its first training record leaves a metrics.jsonl with nothing to draw: the report
    and its page are written without a training-curves figure (the figure once asked matplotlib for zero panels
    and gave a traceback)."""
    _both(_real_run("runs/early", None), _write("runs/early/metrics.jsonl", metrics))(tmp_path, world)
    result = CliRunner().invoke(app, ["report", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "tables"),
                                      "--format", "html"])
    assert result.exit_code == 0, result.output
    assert not list((tmp_path).rglob("training_curves*"))


def test_a_malformed_hf_endpoint_is_one_line_before_any_command_starts(tmp_path):
    """huggingface_hub parses HF_ENDPOINT as it is imported, with open_clip, by nearly every command: one that
    urllib cannot parse gave a traceback from that import, before any command's own check. The real CLI process,
    so that the import happens in it."""
    import subprocess
    import sys

    env = dict(os.environ, HF_ENDPOINT="http://[bad")
    done = subprocess.run([sys.executable, "-m", "euclip_cli", "report", "--out", str(tmp_path / "t")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == ["error: environment variable HF_ENDPOINT='http://[bad' is not an "
                                                "http(s) URL such as https://huggingface.co: set it to the Hub's URL, "
                                                "or unset it"]
    assert not (tmp_path / "t").exists()


def test_too_little_memory_to_load_torch_is_one_line(tmp_path):
    """Under a 400 MB address-space limit torch's shared library cannot be mapped, and its import raised an
    ImportError through every command that trains or evaluates: now one line naming memory and the limit."""
    import resource
    import subprocess
    import sys

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (400 * 2 ** 20, resource.RLIM_INFINITY))

    done = subprocess.run([sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--runs-dir",
                           str(tmp_path / "runs")], preexec_fn=limited, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: out of memory while loading a library") and "ulimit -v" in line, line


def test_a_push_to_a_hub_that_does_not_answer_is_one_line_and_uploads_nothing(world, tmp_path, monkeypatch):
    """httpx's connection errors are not the Hub's HTTP errors, and gave a traceback. huggingface_hub reads
    HF_ENDPOINT once, as it is imported, so the endpoint is set where it keeps it: a port nothing listens on."""
    from huggingface_hub import constants

    _checkpointed_run("runs/good")(tmp_path, world)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    result = runner.invoke(app, ["push", str(tmp_path / "runs" / "good"), "me/model"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "could not reach the Hub at http://127.0.0.1:9 to create me/model" in line
    assert "nothing was uploaded" in " ".join(result.output.split())
