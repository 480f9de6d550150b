"""The trainer survives bad data and non-finite steps, and says so."""

import io
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from euclip_cli import config as C
from euclip_cli.data.loader import LoaderWork
from euclip_cli.errors import Failure
from euclip_cli.rundir import RunDir, load_checkpoint
from euclip_cli.train.metrics import start_wandb
from euclip_cli.train import loop

TINY = ["data.batch_size=16", "optim.warmup_steps=1", "train.precision=fp32", "train.log_every=1",
        "train.tensorboard=false", "data.shuffle_buffer=50"]


def test_corrupt_samples_and_truncated_shards_are_skipped_and_counted(world, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    def write(path, members):
        with tarfile.open(path, "w") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    with tarfile.open(world / "train" / "00000.tar") as src:  # a small good shard: 10 pairs
        members = [(m.name, src.extractfile(m).read()) for m in src.getmembers()[:30]]
    write(shards / "00000.tar", members)
    good = (shards / "00000.tar").read_bytes()
    (shards / "00001.tar").write_bytes(good[: len(good) // 2])  # truncated mid-file
    write(shards / "00002.tar", [("bad.jpg", b"not a jpeg"), ("bad.txt", b"a caption"),  # undecodable image
                                 ("lonely.jpg", members[0][1])])  # an image with no caption
    cfg = C.load_config("tiny-clip", [f"data.train_dir={shards}", "optim.samples=64", *TINY])
    result = loop.run(cfg, tmp_path / "run")
    # The truncated tar, the undecodable JPEG and the caption-less image each raise and are skipped.
    assert result["steps"] == 4 and result["skipped_samples"] >= 3


@pytest.mark.parametrize("log_every, stop_at", [
    (1, 10),  # read every step: the fifth NaN in a row (steps 6 to 10) stops the run at once
    (4, 12),  # read at logging and checkpoint steps only (1, 4, 8, 12, 16): the steps between never wait
])
def test_a_nan_step_is_skipped_and_repeated_nans_stop_with_the_checkpoint_intact(world, tmp_path, monkeypatch,
                                                                                 log_every, stop_at):
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=256", "train.checkpoints=2",
                                      "train.keep_checkpoints=3", *TINY, f"train.log_every={log_every}"])
    real = loop.forward_backward
    calls, after_step_5 = {"n": 0}, {}

    def poisoned(model, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:
            after_step_5.update({k: v.clone() for k, v in model.state_dict().items()})
        terms = real(model, *args, **kwargs)
        if calls["n"] == 3 or calls["n"] >= 6:  # one isolated NaN, then NaNs forever
            next(model.parameters()).grad.fill_(float("nan"))
        return terms

    monkeypatch.setattr(loop, "forward_backward", poisoned)
    with pytest.raises(loop.RunError, match=f"in a row by step {stop_at}"):
        loop.run(cfg, tmp_path / "run")
    assert calls["n"] == stop_at  # a step whose update was skipped still took its batch
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # The isolated NaN was skipped and counted, and training went on.
    assert [r["nonfinite_steps"] for r in records if 3 <= r["step"] <= 5] == [1] * len([r for r in records
                                                                                      if 3 <= r["step"] <= 5])
    # A checkpoint every 8 steps: the one at step 8 (6 to 8 skipped) holds exactly the weights step 5 left.
    state = load_checkpoint(RunDir(tmp_path / "run").latest_checkpoint())
    assert state["step"] == 8 and state["model"].keys() == after_step_5.keys()
    for name, value in after_step_5.items():
        assert torch.equal(state["model"][name], value), name


def test_sigterm_checkpoints_the_finished_step_and_the_same_command_resumes(world, tmp_path, monkeypatch):
    import os
    import signal

    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=96", "train.checkpoints=1", *TINY])
    real = loop.forward_backward
    calls = {"n": 0}

    def preempted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # a cluster preempting the job mid-step
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "forward_backward", preempted)
    first = loop.run(cfg, tmp_path / "run")
    assert first["interrupted"] and first["steps"] == 2
    assert load_checkpoint(RunDir(tmp_path / "run").latest_checkpoint())["step"] == 2
    monkeypatch.setattr(loop, "forward_backward", real)
    second = loop.run(cfg, tmp_path / "run")
    assert second["branch"] == "resumed from step_2.pt" and second["steps"] == 6 and not second["interrupted"]
    # Resumed mid-segment (the data position is replayed), it ends bitwise where an uninterrupted run ends.
    straight = loop.run(cfg, tmp_path / "straight")
    resumed_state = load_checkpoint(Path(second["checkpoint"]))
    straight_state = load_checkpoint(Path(straight["checkpoint"]))
    for name, tensor in straight_state["model"].items():
        assert torch.equal(resumed_state["model"][name], tensor), name


def test_fp16_scales_the_loss_and_checkpoints_the_scaler(world, tmp_path):
    overrides = [f"data.train_dir={world / 'train'}", "optim.samples=64", *TINY]
    cfg = C.load_config("tiny-clip", [o for o in overrides if not o.startswith("train.precision")] +
                        ["train.precision=fp16"])
    result = loop.run(cfg, tmp_path / "run")
    assert result["steps"] == 4
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # GradScaler starts at 2**16 and halves on every overflow (an overflowing step is skipped and counted).
    assert all(r["loss_scale"] == 2.0 ** 16 / 2 ** r["nonfinite_steps"] for r in records)
    state = load_checkpoint(RunDir(tmp_path / "run").latest_checkpoint())
    assert state["scaler"]["scale"] == records[-1]["loss_scale"]


class FakeWandb:
    """Records what the trainer sends to W&B."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished += 1


def test_wandb_gets_every_logged_record_and_resumes_the_same_wandb_run(world, tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=32", "train.wandb=true",
                                      "train.wandb_project=geom", *TINY])
    loop.run(cfg, tmp_path / "run")
    assert [step for step, _ in fake.logged] == [1, 2] and fake.finished == 1
    assert fake.logged[0][1]["train/loss"] > 0 and "train/logit_scale" in fake.logged[0][1]
    assert fake.inits[0]["project"] == "geom" and fake.inits[0]["resume"] == "allow"
    assert fake.inits[0]["config"]["model"]["arch"] == "tiny-vit-c16"
    start_wandb(RunDir(tmp_path / "run"), "geom", C.to_dict(cfg))  # what a resumed run does: it continues the same W&B run
    assert fake.inits[1]["id"] == fake.inits[0]["id"] == (tmp_path / "run" / "wandb_id").read_text()


def test_wandb_asked_for_but_missing_is_a_clear_error(world, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=32", "train.wandb=true", *TINY])
    with pytest.raises(Failure, match="pip install wandb"):
        loop.run(cfg, tmp_path / "run")


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_with_loader_workers_checkpoints_and_resumes(world, tmp_path):
    """As SLURM preempts: SIGTERM reaches the trainer and its loader worker alike. The worker must
    not die of it; the trainer finishes the step, checkpoints, exits 1; the same command resumes,
    and metrics.jsonl ends with every step once."""
    import os
    import signal
    import subprocess
    import time

    command = [sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--runs-dir", str(tmp_path),
               "--name", "run", f"data.train_dir={world / 'train'}", "optim.samples=640", "data.workers=1",
               "train.checkpoints=2", *TINY]
    child = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.1)
    os.killpg(child.pid, signal.SIGTERM)
    output, _ = child.communicate(timeout=120)
    assert child.returncode == 1, output
    assert "stopped at step" in output and "Traceback" not in output
    stopped = load_checkpoint(RunDir(tmp_path / "run").latest_checkpoint())["step"]
    assert 2 <= stopped < 40
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 41))


def test_a_damaged_missing_or_foreign_checkpoint_is_named_never_passed_over(world, tmp_path):
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=64", "train.checkpoints=4",
                                      "train.keep_checkpoints=3", *TINY])
    loop.run(cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    newest = run.latest_checkpoint()
    assert [p.name for p in run.checkpoints()] == ["step_2.pt", "step_3.pt", "step_4.pt"]
    whole = newest.read_bytes()
    newest.write_bytes(whole[:1000])  # truncated, as a full disk or a kill mid-copy leaves it
    with pytest.raises(Failure, match=r"step_4.pt is damaged: 1,000 bytes where .* were written; restore it, or "
                                      r"delete it .* \(step_3.pt\)"):
        loop.run(cfg, tmp_path / "run")
    flipped = bytearray(whole)
    flipped[len(whole) // 2] ^= 0xFF  # one byte changed, the size kept: only the digest can tell
    newest.write_bytes(bytes(flipped))
    with pytest.raises(Failure, match="step_4.pt is damaged: its sha256"):
        run.readable_checkpoint()
    newest.write_bytes(whole)
    other = tmp_path / "other"
    loop.run(C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=64", "train.seed=5",
                                         "train.checkpoints=4", *TINY]), other)
    for suffix in ("", ".sha256"):  # a checkpoint copied in from another run, with its own digest
        (newest.parent / (newest.name + suffix)).write_bytes((other / "checkpoints" / ("step_4.pt" + suffix)).read_bytes())
    with pytest.raises(Failure, match="step_4.pt belongs to another run"):
        run.readable_checkpoint()
    newest.unlink()  # 'latest' now names a file that is gone
    with pytest.raises(Failure, match=r"'latest' names 'step_4.pt', which is missing .* \(step_3.pt\)"):
        run.readable_checkpoint()
    (run.checkpoints_dir / "latest").unlink()  # the remedy the message gives: the newest whole one is used
    resumed = loop.run(cfg, tmp_path / "run")
    assert resumed["branch"] == "resumed from step_3.pt" and resumed["steps"] == 4


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def good_members(world: Path, pairs: int) -> list[tuple[str, bytes]]:
    with tarfile.open(world / "train" / "00000.tar") as src:
        chosen = [m for m in src.getmembers() if m.name.endswith((".jpg", ".txt"))][:2 * pairs]
        return [(m.name, src.extractfile(m).read()) for m in chosen]


def unusable(kind: str, folder: Path, world: Path) -> None:
    folder.mkdir()
    if kind == "random bytes":
        (folder / "00000.tar").write_bytes(bytes(range(256)) * 64)
    elif kind == "corrupt images":
        write_tar(folder / "00000.tar", [(f"{i}.{ext}", b"not a jpeg" if ext == "jpg" else b"a caption")
                                         for i in range(20) for ext in ("jpg", "txt")])
    else:  # captions missing
        write_tar(folder / "00000.tar", [(n, d) for n, d in good_members(world, 10) if n.endswith(".jpg")])


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("kind", ["random bytes", "corrupt images", "captions missing"])
def test_shards_from_which_nothing_decodes_stop_with_one_line_not_a_hang(kind, workers, world, tmp_path):
    from typer.testing import CliRunner

    from euclip_cli.cli.main import app
    from tests.conftest import watchdog

    unusable(kind, tmp_path / "shards", world)
    # In this process (a fresh one spent seconds importing torch); a hang ends the worker, naming where it hung.
    with watchdog(180):
        done = CliRunner().invoke(app, ["train", "--recipe", "tiny-clip", "--runs-dir", str(tmp_path), "--name", "run",
                                        f"data.train_dir={tmp_path / 'shards'}", "optim.samples=64",
                                        f"data.workers={workers}", *TINY])
    output = " ".join(done.output.split())
    assert done.exit_code == 2, output  # a traceback would be an exception caught by the runner: exit 1
    assert f"the training shards in {tmp_path / 'shards'} look unusable" in output
    assert "1000 samples or shards in a row could not be read" in output
    assert not list((tmp_path / "run").glob("checkpoints/*.pt"))


def test_mostly_bad_data_stops_at_the_skip_limit_with_a_checkpoint_and_a_warning_below_it(world, tmp_path):
    from typer.testing import CliRunner

    from euclip_cli.cli.main import app

    shards = tmp_path / "shards"
    shards.mkdir()
    write_tar(shards / "00000.tar", good_members(world, 10))
    write_tar(shards / "00001.tar", [(f"{i}.{ext}", b"not a jpeg" if ext == "jpg" else b"a caption")
                                     for i in range(30) for ext in ("jpg", "txt")])
    base = ["train", "--recipe", "tiny-clip", "--runs-dir", str(tmp_path), f"data.train_dir={shards}",
            "optim.samples=64", *TINY]
    stopped = CliRunner().invoke(app, [*base, "--name", "strict", "data.max_skipped_fraction=0.2"])
    text = " ".join(stopped.output.split())
    assert stopped.exit_code == 1 and "Traceback" not in text, text
    assert "more than data.max_skipped_fraction=0.2; stopped at step 1 with a checkpoint" in text
    assert f"Check the shards in {shards}" in text
    assert load_checkpoint(RunDir(tmp_path / "strict").latest_checkpoint())["step"] == 1
    tolerated = CliRunner().invoke(app, [*base, "--name", "lenient", "data.max_skipped_fraction=1"])
    assert tolerated.exit_code == 0, tolerated.output
    skipped = json.loads((tmp_path / "lenient" / "metrics.jsonl").read_text().splitlines()[-1])["skipped_samples"]
    assert skipped > 16 and f"warning: {skipped:,} samples" in " ".join(tolerated.output.split())


def test_a_second_trainer_on_the_same_run_is_refused_while_the_first_holds_it(world, tmp_path):
    import os

    from typer.testing import CliRunner

    from euclip_cli.cli.main import app

    command = ["train", "--recipe", "tiny-clip", "--runs-dir", str(tmp_path), "--name", "run",
               f"data.train_dir={world / 'train'}", "optim.samples=32", *TINY]
    with RunDir(tmp_path / "run").lock():  # the first trainer, as far as the lock can tell
        refused = CliRunner().invoke(app, command)
    text = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "Traceback" not in text, text
    assert f"is being trained by another process (pid {os.getpid()})" in text and "--name NEW" in text
    assert not (tmp_path / "run" / "config.json").exists()  # the refused one wrote nothing
    trained = CliRunner().invoke(app, command)  # released: the same command now runs
    assert trained.exit_code == 0, trained.output
    again = CliRunner().invoke(app, command)  # and a finished run's lock was released too
    assert again.exit_code == 0 and "already complete" in again.output


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to fill a disk without root")
def test_a_full_disk_while_checkpointing_stops_with_one_line_and_the_same_command_resumes(world, tmp_path):
    """The checkpoint's temporary file is a link to /dev/full, where every write fails with ENOSPC,
    as on a full disk: no half-written file is left, 'latest' still names the last good checkpoint,
    and once space is back the same command resumes from it and logs every step once."""
    from typer.testing import CliRunner

    from euclip_cli.cli.main import app

    command = ["train", "--recipe", "tiny-clip", "--runs-dir", str(tmp_path), "--name", "run",
               f"data.train_dir={world / 'train'}", "optim.samples=64", "train.checkpoints=2", *TINY]
    run = RunDir(tmp_path / "run")
    run.checkpoints_dir.mkdir(parents=True)
    full = run.checkpoints_dir / ".step_4.pt.tmp"
    full.symlink_to("/dev/full")
    stopped = CliRunner().invoke(app, command)
    text = " ".join(stopped.output.split())
    assert stopped.exit_code == 1 and "Traceback" not in text, text
    assert sum(line.startswith("error:") for line in stopped.output.splitlines()) == 1, stopped.output
    assert f"could not write the checkpoint {run.checkpoint_file(4)} (No space left on device)" in text
    assert "it resumes from step_2.pt" in text
    assert not list(run.checkpoints_dir.glob(".*.tmp")) and not full.is_symlink()
    assert [p.name for p in run.checkpoints()] == ["step_2.pt"] and run.latest_checkpoint().name == "step_2.pt"
    resumed = CliRunner().invoke(app, command)  # space is back
    assert resumed.exit_code == 0 and "resumed from step_2.pt" in resumed.output, resumed.output
    assert [r["step"] for r in run.training_records()] == [1, 2, 3, 4]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder whatever its mode; an unwritable "
                                               "folder cannot be made without root tricks (a read-only mount)")
@pytest.mark.parametrize("locked", ["runs", "checkpoints"])
def test_an_unwritable_runs_or_checkpoints_folder_is_one_line_naming_it(locked, world, tmp_path):
    from typer.testing import CliRunner

    from euclip_cli.cli.main import app

    runs = tmp_path / "runs"
    folder = runs if locked == "runs" else runs / "run" / "checkpoints"
    folder.mkdir(parents=True)
    folder.chmod(0o555)
    try:
        result = CliRunner().invoke(app, ["train", "--recipe", "tiny-clip", "--runs-dir", str(runs), "--name", "run",
                                          f"data.train_dir={world / 'train'}", "optim.samples=32", *TINY])
    finally:
        folder.chmod(0o755)
    text = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in text, text
    assert sum(line.startswith("error:") for line in result.output.splitlines()) == 1, result.output
    assert f"{folder}" in text and "permission denied" in text.lower() and "writable" in text


def test_the_fused_finite_check_agrees_with_an_element_by_element_check():
    from euclip_cli.step import nonfinite

    def all_finite(loss, grads):
        flag = nonfinite(loss, grads)
        assert flag.shape == () and flag.dtype == torch.bool  # a device flag, read here only to compare
        return not bool(flag)

    torch.manual_seed(0)
    for trial in range(40):
        grads = [torch.randn(int(n)) * 10.0 ** float(torch.randint(-30, 38, ())) for n in torch.randint(1, 50, (5,))]
        grads.append(torch.randn(7).bfloat16())
        loss = torch.tensor(float(torch.randn(())))
        if trial % 4 == 1:
            grads[trial % 6].view(-1)[0] = float("nan")
        elif trial % 4 == 2:
            grads[trial % 6].view(-1)[-1] = -float("inf")
        elif trial % 4 == 3:
            loss = torch.tensor(float("inf"))
        expected = bool(torch.isfinite(loss)) and all(bool(torch.isfinite(g).all()) for g in grads)
        assert all_finite(loss, grads) == expected, trial
    assert all_finite(torch.tensor(1.0), [torch.full((3,), 3e38)])  # huge but finite: no overflow to inf
    assert all_finite(torch.tensor(1.0), [])


def test_the_log_says_how_much_of_a_step_went_to_waiting_for_data(world, tmp_path, monkeypatch):
    """On a clock that moves only when the loader (0.3 s a batch) or the step (0.1 s) spends time,
    each logged window has waited 0.3 of every 0.4 s for data, whatever the machine's real speed;
    and what the loader reports its batches cost becomes the window's loader fields."""
    import time
    import types

    clock = {"now": 0.0}
    fake_time = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    fake_time.time = fake_time.perf_counter = lambda: clock["now"]
    monkeypatch.setattr(loop, "time", fake_time)

    def taking(seconds, real):
        def timed(*args, **kwargs):
            clock["now"] += seconds
            return real(*args, **kwargs)
        return timed

    monkeypatch.setattr(loop.TrainBatches, "__next__", taking(0.3, loop.TrainBatches.__next__))
    monkeypatch.setattr(loop, "forward_backward", taking(0.1, loop.forward_backward))
    # Two batches in 0.5 s of a loader's time, 0.2 s of it on the CPU.
    monkeypatch.setattr(loop.TrainBatches, "take_work", lambda self: LoaderWork(2, 0.5, 0.2))
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=64", "data.workers=2",
                                      *TINY])
    loop.run(cfg, tmp_path / "run")
    records = RunDir(tmp_path / "run").training_records()
    assert [r["data_wait_share"] for r in records] == pytest.approx([0.75] * 4)
    assert [r["samples_per_s"] for r in records] == pytest.approx([16 / 0.4] * 4)
    assert [r["loader_batch_s"] for r in records] == pytest.approx([0.25] * 4)
    assert [r["loader_samples_per_s"] for r in records] == pytest.approx([2 * 16 / 0.25] * 4)  # two workers
    assert [r["loader_cpu_share"] for r in records] == pytest.approx([0.4] * 4)


def test_running_out_of_memory_is_said_as_such_with_the_settings_to_change(world, tmp_path, monkeypatch):
    """The CPU allocator's RuntimeError, a GPU's OutOfMemoryError and Python's MemoryError alike; never a
    traceback, and never blamed on the data."""
    from euclip_cli.train.loop import RunError

    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=64", *TINY])
    for err in (RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                             "tried to allocate 1125899906842624 bytes"), torch.OutOfMemoryError("CUDA out of memory"),
                MemoryError()):
        def out_of_memory(*args, err=err, **kwargs):
            raise err

        monkeypatch.setattr(loop, "_train", out_of_memory)
        with pytest.raises(RunError, match=r"out of memory on cpu with data.batch_size=16 .*in a new run \(--name NEW\)"):
            loop.run(cfg, tmp_path / "run")
    monkeypatch.setattr(loop, "_train", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug of ours")))
    with pytest.raises(RuntimeError, match="a bug of ours"):  # anything else stays a bug, with its traceback
        loop.run(cfg, tmp_path / "run")


def _with_open_files(limit: str, command: list[str]) -> list[str]:
    """``command`` under ``ulimit -n LIMIT`` (``-S`` first for the soft limit alone)."""
    import shlex

    return ["bash", "-c", f"ulimit {limit} && exec {shlex.join(command)}"]


@pytest.mark.slow
def test_too_few_open_files_for_the_loader_workers_is_refused_before_they_start_or_raised_within_the_hard_limit(
        world, tmp_path):
    """Loader workers hand batches over as file descriptors; below what they need torch's workers print
    tracebacks, or hang. A hard limit too low is one line naming data.workers before any worker starts;
    a soft limit too low is raised within the hard one, and the run trains."""
    import subprocess

    command = [sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--runs-dir", str(tmp_path),
               "--name", "run", f"data.train_dir={world / 'train'}", "optim.samples=64", "data.workers=3", *TINY]
    refused = subprocess.run(_with_open_files("-n 24", command), capture_output=True, text=True, timeout=120)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert len(errors) == 1 and "data.workers=3" in errors[0] and "ulimit -n" in errors[0], refused.stderr
    assert not RunDir(tmp_path / "run").checkpoints()
    trained = subprocess.run(_with_open_files("-S -n 24", command), capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0 and "Traceback" not in trained.stderr, trained.stderr


@pytest.mark.slow
def test_running_out_of_open_files_anywhere_is_one_line_and_resumable(world, tmp_path):
    """The class beyond the workers' check: wherever a command runs out of descriptors (opening a shard, a
    checkpoint's temporary file) it says which limit to raise, in one line, and keeps no partial file."""
    import subprocess

    outcomes = {}
    for limit in (5, 6, 7, 8):
        command = [sys.executable, "-m", "euclip_cli", "train", "--recipe", "tiny-clip", "--runs-dir", str(tmp_path),
                   "--name", f"run{limit}", f"data.train_dir={world / 'train'}", "optim.samples=32", *TINY]
        result = subprocess.run(_with_open_files(f"-n {limit}", command), capture_output=True, text=True, timeout=120)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert "Traceback" not in result.stderr and result.returncode in (0, 1), result.stderr
        assert result.returncode == 0 or (len(errors) == 1 and "ulimit -n" in errors[0]), result.stderr
        assert not list((tmp_path / f"run{limit}").rglob("*.tmp"))
        outcomes[limit] = result.returncode
    assert 1 in outcomes.values() and outcomes[8] == 0, outcomes  # some limits are too low, and 8 is enough
