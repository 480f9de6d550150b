"""The run directory: the one owner of its layout, its files and how they are read and written.

::

    RUN/config.json          the resolved config (every key), written once when the run starts
    RUN/meta.json            the run's id, git revision, package versions, seed, argv, host; the data's manifest
    RUN/metrics.jsonl        one training record per logged step
    RUN/tensorboard/         the same records for TensorBoard
    RUN/checkpoints/         step_N.pt (plain tensors + JSON-able metadata, the run's id), step_N.pt.sha256
                             (its digest and size as written) and ``latest`` (a file naming one)
    RUN/eval.jsonl           one line per (task, checkpoint): DataComp's fields plus checkpoint, step, protocol
    RUN/eval_results.jsonl   DataComp's own results file for the latest evaluated checkpoint
    RUN/features/            cached image embeddings, one folder per checkpoint
    RUN/analysis/            what ``euclip analyze`` writes (JSON, PNG, PDF)
    RUN/.lock                held (flock) by the process training the run; names its pid

Everything else asks this module where a file is and how to read it. It imports the standard
library only; torch is imported inside the checkpoint functions, so ``euclip report`` (which
reads JSON alone) never loads it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import unicodedata
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

from euclip_cli import readers
from euclip_cli.errors import DamagedLines, Failure, UsageError, out_of_file_descriptors

RUNS_DIR = Path("results") / "runs"
# Where `euclip study` keeps each study (its runs are run directories too).
STUDIES_DIR = Path("results") / "studies"
CHECKPOINT_PREFIX = "step_"
# Beside each checkpoint: "<sha256> <bytes>" of the file as it was written.
DIGEST_SUFFIX = ".sha256"
# The longest name most filesystems give one folder, in bytes.
NAME_BYTES = 255


def plain_name(name: str, option: str) -> str:
    """``name`` if it can name one folder inside another (a run under the runs folder), else a UsageError
    naming ``option``: empty, ``.``, ``..``, a name with a path separator, a NUL or another control
    character (a tab or line break would garble every listing that shows the run), one that starts
    with ``-`` (it reads as an option) or one too long for a folder would put the run elsewhere, or
    nowhere."""
    problem = None
    if not name or name in (".", ".."):
        problem = "is not a folder name"
    elif "/" in name or "\\" in name or "\0" in name:
        problem = "is a path, not a name"
    elif any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in name):
        problem = "holds a control character or line break"
    elif name.startswith("-"):
        problem = "starts with '-'"
    elif len(name.encode("utf-8", "surrogateescape")) > NAME_BYTES:
        problem = f"is longer than {NAME_BYTES} bytes"
    if problem:
        raise UsageError(f"{option} {name!r} {problem}: give a plain name such as tiny-clip-seed1 (the run goes "
                         f"into --runs-dir)")
    return name


# The longest path the operating system takes (Linux's PATH_MAX, with its closing NUL).
PATH_BYTES = 4095


def path_problem(path: Path) -> Optional[str]:
    """Why no file system could hold ``path`` (a name in it longer than ``NAME_BYTES``, or the whole longer
    than ``PATH_BYTES``), or None."""
    if len(os.fsencode(path)) > PATH_BYTES:
        return f"{str(path)[:60]}... is longer than {PATH_BYTES} bytes: give a shorter path"
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_BYTES:
            return f"a name in {path} ({part[:40]}...) is longer than {NAME_BYTES} bytes: give a shorter one"
    return None


def folder_problem(path: Path) -> Optional[str]:
    """Why a command cannot write a folder at ``path`` (``path_problem``, or it, or a folder it would be
    made under, is a file), or None: an absent path is made on the first write."""
    problem = path_problem(path)
    if problem:
        return problem
    for part in (path, *path.parents):
        if part.exists():
            if part.is_dir():
                return None
            within = f" (in the path {path})" if part != path else ""
            return f"{part} is a file where a folder is needed{within}: give a folder path, or move the file away"
    return None


# The lock files this process holds (folder_lock). A child forked without exec (a DataLoader worker)
# inherits their descriptors, and an flock lives while any descriptor of it is open: the child would hold
# its parent's run after a SIGKILL of the parent until it noticed the death (seconds), and the same
# command restarted at once would be refused as busy. The child closes its copies as it starts; exec'd
# children never get them (Python opens files close-on-exec).
_HELD_LOCKS: set = set()


def _close_inherited_locks() -> None:
    for handle in list(_HELD_LOCKS):
        handle.close()  # the child's copy only: the parent's descriptor keeps the lock
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)


@contextlib.contextmanager
def folder_lock(folder: Path, busy: Callable[[str], Exception]):
    """Hold ``folder`` for this process, or raise ``busy(holder's pid)`` when another holds it. The lock is
    the kernel's (flock on ``folder/.lock``), so it dies with its process, forked children included
    (``_HELD_LOCKS``): nothing stale is left to remove."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise busy(handle.read().strip() or "unknown") from None
        _HELD_LOCKS.add(handle)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            _HELD_LOCKS.discard(handle)
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def whole_folder(out: Path, busy: Callable[[str], Exception]) -> Iterator[Path]:
    """A folder written whole or not at all. Yields ``.<name>.partial`` beside ``out``, held by this process
    (``busy(pid)`` for another) and cleared of what an attempt killed earlier left; once the body returns it is
    renamed to ``out`` (absent, or an empty folder). An exception removes it: ``out`` never holds half a world."""
    import shutil

    staging = out.parent / f".{out.name}.partial"
    with folder_lock(staging, busy):
        try:
            for left in (p for p in staging.iterdir() if p.name != ".lock"):
                shutil.rmtree(left) if left.is_dir() else left.unlink()
            yield staging
            (staging / ".lock").unlink()
            if out.exists():
                out.rmdir()
            os.rename(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def wait_until_free(folder: Path, seconds: float, every: float = 1.0) -> bool:
    """Wait until no process holds ``folder`` (``folder_lock``), at most ``seconds``; True when free.
    A requeued job may start while its predecessor's trainer still writes its last checkpoint."""
    import fcntl
    import time

    deadline = time.monotonic() + seconds
    while (folder / ".lock").exists():
        with (folder / ".lock").open("a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
                return True
            except BlockingIOError:
                pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


class RunConflict(UsageError):
    """The run directory holds a run with another configuration."""


class RunBusy(UsageError):
    """Another process is training into the run directory."""


def read_json(path: Path) -> Any:
    """A JSON file, or a one-line failure naming it (a truncated file is not a bug of ours); a path that is not
    a regular file, or one larger than any JSON of ours, is refused before it is read (``readers``)."""
    if not path.exists():  # callers tell a missing file apart as they always have
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
    data = readers.read_bytes(path, "JSON file", readers.JSON_LIMIT)
    try:
        return json.loads(data.decode("utf-8"))
    except json.JSONDecodeError as err:
        raise Failure(f"{path} is not valid JSON ({err.msg} at line {err.lineno}); restore or delete it") from None
    except UnicodeDecodeError:
        raise Failure(f"{path} is not UTF-8 text; restore or delete it") from None


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for one writer to fill, renamed onto ``path`` when the block ends: a
    reader never sees half a file, a write that fails (a full disk) removes its temporary file and leaves the
    old one in place, and two writers at once (two evaluations of one run) each fill a file of their own,
    the last rename winning whole, where one shared temporary name would mix or lose their bytes."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def held_stops() -> Iterator[None]:
    """SIGINT and SIGTERM held for the block (in the main thread, where Python runs signal handlers): one that
    arrives in it takes effect, through the handler it would have met, as the block ends. For a few quick
    steps that must happen all or none."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread alone
        yield
        return
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda got, frame: received.append(got))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # None: a handler installed outside Python, which Python cannot reinstall; the default then.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if received:
            signal.raise_signal(received[0])


@contextlib.contextmanager
def files_together(folder: Path) -> Iterator[Path]:
    """A staging folder inside ``folder`` for files that belong together (a study's tables and figures),
    moved into ``folder`` when the block ends, with stops held while they move: a stop or a failure leaves
    all of them or none, and the previous set, where there was one, whole. The staging folder is removed
    either way."""
    import shutil
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".together-", suffix=".partial", dir=folder))
    try:
        yield staging
        with held_stops():
            for path in sorted(p for p in staging.rglob("*") if p.is_file()):
                target = folder / path.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through ``atomic_path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


# What every record of a run's JSON-lines file must hold, by file: the fields its readers index.
TRAINING_RECORD = {"step": int}
EVAL_LINE = {"key": str, "checkpoint": str, "step": int, "metrics": (dict, type(None))}  # no metrics: a failed task


def parse_record(line: bytes, where: str, fields: dict[str, Any]) -> Optional[dict]:
    """One line of a JSON-lines file (``where``: the file and line, for messages): the record, or None for a line
    cut short by a crash mid-write, or a blank one. A whole line that is not such a record is damage no crash of
    euclip's leaves (euclip writes ASCII JSON objects): a Failure naming the file, the line and what to do."""
    def damaged(why: str) -> Failure:
        return Failure(f"{where}: {why}; restore the file, or delete that line")

    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise damaged("not UTF-8 text") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        raise damaged(f"{json.dumps(record)[:40]} where a JSON object belongs")
    for key, kind in fields.items():
        value = record.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            wanted = {int: "an integer", str: "a string"}.get(kind, "an object")
            raise damaged(f"'{key}' is {json.dumps(value)[:40]}, not {wanted}")
    return record


def iter_jsonl(path: Path, fields: Optional[dict[str, Any]] = None) -> Iterator[dict]:
    """The records of a JSON-lines file, one at a time (a file of any length in constant memory), each checked
    to hold ``fields`` (``parse_record``). A line cut short by a crash mid-write is skipped: said once per file
    and read (a ``DamagedLines`` warning) where a later line ended it, silently where it is the file's last,
    which may be a record still being written."""
    if not path.exists():
        return
    skipped = 0
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            record = parse_record(line, f"{path}, line {number}", fields or {})
            if record is not None:
                yield record
            elif line.strip() and line.endswith(b"\n"):
                skipped += 1
    if skipped:
        warnings.warn(DamagedLines(f"{path}: skipped {skipped} line(s) cut short by a crash mid-write (their "
                                   f"records are lost; the others were read)"), stacklevel=2)


def read_jsonl(path: Path, fields: Optional[dict[str, Any]] = None) -> list[dict]:
    """Every record of a JSON-lines file (``iter_jsonl``), as a list."""
    return list(iter_jsonl(path, fields))


def last_jsonl(path: Path, block: int = 1 << 16, fields: Optional[dict[str, Any]] = None) -> Optional[dict]:
    """The last complete record of a JSON-lines file, read backwards from its end in ``block``-byte reads
    (a file of any length in the time of its tail); a line cut short by a crash is skipped, as
    ``iter_jsonl`` skips it."""
    if not path.exists():
        return None
    with path.open("rb") as f:
        start = f.seek(0, os.SEEK_END)
        tail = b""
        while start > 0:
            step = min(block, start)
            start -= step
            f.seek(start)
            tail = f.read(step) + tail
            lines = tail.split(b"\n")
            # The first piece may be the end of a line that starts before ``start``: not yet complete.
            for line in reversed(lines if start == 0 else lines[1:]):
                record = parse_record(line, f"{path}, its last complete line", fields or {})
                if record is not None:
                    return record
    return None


def thinned(records: Iterable[dict], most: int) -> list[dict]:
    """At most about ``most`` of ``records``, evenly spaced (every k-th, k doubling whenever more than
    ``most`` are held) and the last always among them: a curve of any length in bounded memory."""
    kept: list[dict] = []
    stride, last = 1, None
    for i, record in enumerate(records):
        last = record
        if i % stride == 0:
            kept.append(record)
            if len(kept) > most:
                kept, stride = kept[::2], 2 * stride
    if last is not None and (not kept or kept[-1] is not last):
        kept.append(last)
    return kept


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record and flush; a line left without its newline by a crash is ended first."""
    with path.open("a+b") as f:  # appends always go to the end, whatever was read
        cut_short = False
        if f.tell() > 0:
            f.seek(-1, 2)
            cut_short = f.read(1) != b"\n"
        f.write((("\n" if cut_short else "") + json.dumps(record) + "\n").encode())


# A checkpoint pointer holds one file name: anything longer is not one.
POINTER_LIMIT = 4096


@dataclass(frozen=True)
class RunDir:
    """One run directory; every path inside it comes from here."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def meta_file(self) -> Path:
        return self.path / "meta.json"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"

    @property
    def wandb_id_file(self) -> Path:
        return self.path / "wandb_id"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def eval_file(self) -> Path:
        return self.path / "eval.jsonl"

    @property
    def datacomp_results_file(self) -> Path:
        return self.path / "eval_results.jsonl"

    @property
    def features_dir(self) -> Path:
        return self.path / "features"

    @property
    def analysis_dir(self) -> Path:
        return self.path / "analysis"

    @property
    def hierarchy_file(self) -> Path:
        """``euclip analyze hierarchy``'s result."""
        return self.analysis_dir / "hierarchy.json"

    @property
    def wordnet_hierarchy_file(self) -> Path:
        """``euclip analyze hierarchy --tree wordnet``'s result (ImageNet's classes in WordNet)."""
        return self.analysis_dir / "hierarchy_wordnet.json"

    def distances_file(self, split: str = "eval", at_init: bool = False) -> Path:
        """``euclip analyze distances``'s result (figures share its stem): of the trained model, or
        of the untrained one the run started from."""
        return self.analysis_dir / f"distances{'' if split == 'eval' else '_' + split}{'_init' if at_init else ''}.json"

    def exists(self) -> bool:
        return self.config_file.exists()

    # ---- config and meta

    def config(self) -> dict:
        found = read_json(self.config_file)
        if not isinstance(found, dict):
            raise Failure(f"{self.config_file} is not a run's configuration (a JSON {type(found).__name__}, not an "
                          f"object); restore it, or delete the run")
        return found

    def meta(self) -> dict:
        found = read_json(self.meta_file) if self.meta_file.exists() else {}
        if not isinstance(found, dict):
            raise Failure(f"{self.meta_file} is not a run's metadata (a JSON {type(found).__name__}, not an object); "
                          f"restore it, or delete it (the run's provenance is then unknown)")
        return found

    def difference(self, config: dict, complete: Callable[[dict], dict] = lambda stored: stored) -> Optional[list[str]]:
        """The ``section.key`` names in which the run's stored configuration (read as ``complete`` fills it
        in) differs from ``config`` (``["recipe"]`` when only that does), or None: no run yet, or the same."""
        if not self.exists():
            return None
        stored = complete(self.config())
        if stored == config:
            return None
        return sorted(f"{s}.{k}" for s, v in stored.items() if isinstance(v, dict)
                      for k in v if v[k] != config.get(s, {}).get(k)) or ["recipe"]

    def claim(self, config: dict, meta: dict, complete: Callable[[dict], dict] = lambda stored: stored) -> bool:
        """Create the run with ``config`` and ``meta``, or check that it already holds ``config``.

        ``complete`` fills a stored config in as the current version reads it (keys added since it
        was written take their defaults, which keep the old behaviour), so an older run still resumes.
        Returns True when the directory was created. Raises RunConflict, naming the keys that
        differ, when it holds another configuration.
        """
        changed = self.difference(config, complete)
        if changed:
            raise RunConflict(f"{self.path} holds a run with another configuration (differs in: "
                              f"{', '.join(changed)}); pass --name NEW to start a separate run")
        if self.exists():
            return False
        self.path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.meta_file, json.dumps({**meta, "run_id": uuid.uuid4().hex}, indent=2))
        # config.json last: a directory with it is a complete run directory.
        write_text_atomic(self.config_file, json.dumps(config, indent=2, sort_keys=True))
        return True

    def lock(self):
        """Hold the run for one training process: a second one on the same directory would interleave
        its steps and checkpoints with the first."""
        return folder_lock(self.path, lambda pid: RunBusy(
            f"{self.path} is being trained by another process (pid {pid}): wait for it to finish or stop it, "
            f"or pass --name NEW for a separate run"))

    # ---- checkpoints

    def checkpoint_file(self, step: int) -> Path:
        return self.checkpoints_dir / f"{CHECKPOINT_PREFIX}{step}.pt"

    def checkpoints(self) -> list[Path]:
        """Every ``step_N.pt``, oldest first."""
        found = [p for p in self.checkpoints_dir.glob(f"{CHECKPOINT_PREFIX}*.pt")
                 if p.stem[len(CHECKPOINT_PREFIX):].isdigit()]
        return sorted(found, key=checkpoint_step)

    def latest_name(self) -> Optional[str]:
        """The checkpoint name ``latest`` holds, None without it; a pointer that is not a short UTF-8 text file
        (a FIFO, a device, other bytes) is a Failure naming it, read by every reader of it alike."""
        pointer = self.checkpoints_dir / "latest"
        if not pointer.exists():
            return None
        try:
            return readers.read_bytes(pointer, "checkpoint pointer", POINTER_LIMIT).decode("utf-8").strip()
        except (readers.UnreadableFile, UnicodeDecodeError):
            raise Failure(f"{pointer} is not a checkpoint's name (a short UTF-8 text file): delete it to use the "
                          f"newest checkpoint there") from None

    def latest_checkpoint(self) -> Optional[Path]:
        """The checkpoint ``latest`` names, or None when there is none yet."""
        name = self.latest_name()
        if name is None:
            return None
        path = self.checkpoints_dir / name
        return path if path.is_file() else None

    def run_id(self) -> Optional[str]:
        """The run's identity, drawn when it was created (``meta.json``'s ``run_id``) and written into each of its
        checkpoints: a checkpoint copied in from another run carries another. None for a run created before
        runs had one."""
        return self.meta().get("run_id") if self.meta_file.exists() else None

    def readable_checkpoint(self) -> tuple[Optional[Path], Optional[dict]]:
        """``(path, state)`` of the checkpoint ``latest`` names (without ``latest``, the newest), verified
        (``verified_checkpoint``); ``(None, None)`` when the run has none. A missing, damaged or foreign file
        is a Failure naming it and what to do, never a quiet fall-back to an older one: that would score,
        analyse or resume another step as the run's."""
        pointer = self.checkpoints_dir / "latest"
        name = self.latest_name()
        if name is not None:
            path = self.checkpoints_dir / name
            if not path.is_file() or path.parent != self.checkpoints_dir:
                newest = self.checkpoints()
                raise Failure(f"'latest' names '{name}', which is missing from {self.checkpoints_dir}: restore it, "
                              f"or delete {pointer} to use the newest checkpoint there "
                              f"({newest[-1].name if newest else 'there is none: restore one or start over'})")
        else:
            found = self.checkpoints()
            if not found:
                return None, None
            path = found[-1]
        return path, self.verified_checkpoint(path)

    def verified_checkpoint(self, path: Path) -> dict:
        """The state of ``path``, once it is shown whole (the size and sha256 recorded when it was written),
        readable, and this run's (its run id); otherwise a Failure naming the file and the remedy."""
        older = [p.name for p in self.checkpoints() if checkpoint_step(p) < checkpoint_step(path)]
        remedy = (f"restore it, or delete it (and {self.checkpoints_dir / 'latest'}) to use the newest one before it"
                  f" ({older[-1] if older else 'there is none: the run starts over'})")
        digest = path.with_name(path.name + DIGEST_SUFFIX)
        if digest.is_file():
            recorded = digest.read_text(errors="replace").split()
            size = path.stat().st_size
            if len(recorded) == 2 and recorded[1].isdigit() and int(recorded[1]) != size:
                raise Failure(f"{path} is damaged: {size:,} bytes where {int(recorded[1]):,} were written; {remedy}")
            if recorded and sha256_of_file(path) != recorded[0]:
                raise Failure(f"{path} is damaged: its sha256 is not the one recorded when it was written "
                              f"({digest.name}); {remedy}")
        try:
            state = load_checkpoint(path)
        except Exception as err:  # truncated or corrupt: torch raises several kinds
            raise Failure(f"{path} does not load ({type(err).__name__}: {str(err).splitlines()[0][:80]}); "
                          f"{remedy}") from None
        theirs = state.get("run_id") if isinstance(state, dict) else None
        if theirs is not None and theirs != self.run_id():
            raise Failure(f"{path} belongs to another run (its run id is not {self.meta_file}'s): it was copied in; "
                          f"{remedy}")
        return state

    def save_checkpoint(self, state: dict, step: int, keep: int) -> Path:
        """Write ``step_N.pt`` atomically, point ``latest`` at it, and keep the newest ``keep``."""
        import torch

        self.checkpoints_dir.mkdir(parents=True, exist_ok=True)
        path = self.checkpoint_file(step)
        tmp = self.checkpoints_dir / f".{path.name}.tmp"
        digest = path.with_name(path.name + DIGEST_SUFFIX)
        state = {**state, "run_id": self.run_id()}
        try:
            # Through a Python file: torch's own writer reports a full disk as a RuntimeError that
            # names neither the file nor the cause; the file object raises the OSError itself. The
            # digest is taken from the bytes as they go out, so the file is not read back.
            with tmp.open("wb") as handle:
                writer = _DigestingWriter(handle)
                torch.save(state, writer)
            write_text_atomic(digest, f"{writer.digest.hexdigest()} {writer.size}\n")
        except BaseException as err:
            tmp.unlink(missing_ok=True)  # a full disk must not keep a half-written file on it
            if isinstance(err, OSError):
                previous = self.latest_checkpoint()
                remedy = ("free space" if err.errno == errno.ENOSPC
                          else "raise the limit of open files (ulimit -n)" if out_of_file_descriptors(err)
                          else f"make {self.checkpoints_dir} writable"
                          if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "fix the cause")
                raise Failure(f"could not write the checkpoint {path} ({err.strerror or err}): {remedy} and rerun "
                              f"the same command; it resumes from "
                              f"{previous.name if previous else 'the start (no checkpoint yet)'}") from None
            raise
        os.replace(tmp, path)
        write_text_atomic(self.checkpoints_dir / "latest", path.name)
        for old in self.checkpoints()[:-keep]:
            old.unlink()
            old.with_name(old.name + DIGEST_SUFFIX).unlink(missing_ok=True)
        return path

    # ---- evaluation results

    def eval_lines(self) -> list[dict]:
        return read_jsonl(self.eval_file, EVAL_LINE)

    def append_eval(self, line: dict) -> None:
        append_jsonl(self.eval_file, line)

    def home_world(self, lines: Optional[list[dict]] = None) -> Optional[str]:
        """The fingerprint of the embedded world whose scores stand for this run: the one it trained on
        (``meta.json``'s data), else the first one it was evaluated on (``lines``: its eval lines, if read
        already); None before any world task."""
        recorded = (self.meta().get("data") or {}).get("fingerprint")
        lines = self.eval_lines() if lines is None and not recorded else lines
        return recorded or next((line["world"] for line in lines if "world" in line), None)

    def _scored_lines(self, world: Optional[str], lines: Optional[list[dict]] = None) -> list[dict]:
        """The successful lines of one embedded world (``world``, else ``home_world``) and of tasks of none
        (``lines``: the eval lines, if read already)."""
        lines = self.eval_lines() if lines is None else lines
        world = world or self.home_world(lines)
        return [line for line in lines if not line.get("failed") and line.get("world", world) == world]

    def latest_results(self, world: Optional[str] = None, lines: Optional[list[dict]] = None) -> list[dict]:
        """One successful line per task, the last written, of the newest checkpoint scored, on one embedded
        world (``world``, a fingerprint; by default the run's own, ``home_world``): another world shares its
        task names, not its images, and another checkpoint is another model, so neither is mixed into one
        row or average (``earlier_only`` names the tasks left out). Tasks of no world (DataComp's, MERU's)
        are read whatever world."""
        scored = self._scored_lines(world, lines)
        newest = max((line.get("step", 0) for line in scored), default=0)
        return list({line["key"]: line for line in scored if line.get("step", 0) == newest}.values())

    def earlier_only(self, world: Optional[str] = None, lines: Optional[list[dict]] = None) -> dict[str, int]:
        """{task: its newest step} for the tasks scored only at checkpoints older than ``latest_results``'."""
        scored = self._scored_lines(world, lines)
        newest = max((line.get("step", 0) for line in scored), default=0)
        older: dict[str, int] = {}
        for line in scored:
            older[line["key"]] = max(older.get(line["key"], 0), line.get("step", 0))
        return {key: step for key, step in sorted(older.items()) if step < newest}

    def other_worlds(self, lines: Optional[list[dict]] = None) -> list[str]:
        """The fingerprints of the embedded worlds besides the run's own that it has scores on."""
        lines = self.eval_lines() if lines is None else lines
        return sorted({line["world"] for line in lines if "world" in line and not line.get("failed")}
                      - {self.home_world(lines)})

    def write_datacomp_results(self) -> Optional[Path]:
        """``eval_results.jsonl`` exactly as DataComp's ``evaluate.py`` writes it, for the newest
        evaluated checkpoint, on the run's own world: one ``{"key", "dataset", "metrics"}`` line per task,
        so DataComp's ``aggregate_scores.py`` and leaderboard tools read it unchanged. None when nothing
        is scored."""
        lines = self._scored_lines(None)
        if not lines:
            return None
        newest = max(lines, key=lambda line: line.get("step", 0))["checkpoint"]
        chosen: dict[str, dict] = {}
        for line in lines:
            if line["checkpoint"] == newest:
                chosen[line["key"]] = {"key": line["key"], "dataset": line["dataset"], "metrics": line["metrics"]}
        write_text_atomic(self.datacomp_results_file, "".join(json.dumps(v) + "\n" for v in chosen.values()))
        return self.datacomp_results_file

    def training_records(self, most: Optional[int] = None) -> list[dict]:
        """The ``metrics.jsonl`` records; with ``most``, at most about that many, evenly spaced, and the last."""
        return (read_jsonl(self.metrics_file, TRAINING_RECORD) if most is None
                else thinned(iter_jsonl(self.metrics_file, TRAINING_RECORD), most))

    def last_training_record(self) -> Optional[dict]:
        """The newest ``metrics.jsonl`` record (``last_jsonl``)."""
        return last_jsonl(self.metrics_file, fields=TRAINING_RECORD)


class _DigestingWriter:
    """A file object's ``write`` that also feeds a sha256 and counts the bytes."""

    def __init__(self, handle):
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_step(path: Path) -> int:
    return int(path.stem[len(CHECKPOINT_PREFIX):])


def load_checkpoint(path: Path) -> dict:
    """A checkpoint's state on the CPU; moving tensors to a device is the caller's choice (the RNG
    state, for one, must stay a CPU tensor)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def checkpoint_meta(config: dict, logit: str, embed_dim: int) -> dict:
    """What a checkpoint is: evaluation reads this, never a directory name."""
    return {"arch": config["model"]["arch"], "final_ln": config["model"]["final_ln"],
            "geometry": config["geometry"]["name"], "logit": logit, "blocks": config["geometry"]["blocks"],
            "embed_dim": embed_dim}


def resolve(name_or_path: str, runs_dir: Path = RUNS_DIR) -> RunDir:
    """A run given as a path or as a name under ``runs_dir``."""
    path = Path(name_or_path)
    for candidate in (RunDir(path), RunDir(runs_dir / name_or_path)):
        if candidate.exists():
            return candidate
    raise UsageError(f"no run '{name_or_path}' (looked for {path}/config.json and "
                     f"{runs_dir / name_or_path}/config.json); 'euclip train --recipe RECIPE' creates one")


def all_runs(runs_dir: Path = RUNS_DIR) -> list[RunDir]:
    return [RunDir(p.parent) for p in sorted(runs_dir.glob("*/config.json"))]


def runs_of_recipe(recipe: str, runs_dir: Path = RUNS_DIR) -> list[RunDir]:
    return [run for run in all_runs(runs_dir) if run.config().get("recipe") == recipe]


def select_runs(names: list[str], recipe: Optional[str] = None, runs_dir: Path = RUNS_DIR) -> list[RunDir]:
    """The runs a command names: each of ``names`` (paths or names under ``runs_dir``), then every run
    of ``recipe``; a recipe with no run is a usage error naming the command that makes one."""
    found = [resolve(name, runs_dir) for name in names]
    if recipe:
        of_recipe = runs_of_recipe(recipe, runs_dir)
        if not of_recipe:
            raise UsageError(f"no runs of recipe '{recipe}' in {runs_dir}: run 'euclip train --recipe {recipe}'")
        found += of_recipe
    return found
