"""What every pool of worker processes shares: the cores they may use, their open files, and their end
with the process that started them (the trainer's loader workers, the world generator's, the photo-shard
writer's, a study's runs).

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Iterator

from euclip_cli.errors import UsageError

# Open files a worker costs its pool, measured on the embedded world. The trainer held 6 before 3
# loader workers started and 22 with them, each worker 18 to 26; the world generator held 5 before 4
# workers and 20 with them, each worker 15 to 22. A worker inherits its parent's descriptors at fork,
# with the pipes of the workers forked before it, and adds its own files (and, for the loader, the
# batches it hands over as descriptors).
DESCRIPTORS_PER_WORKER = 8
DESCRIPTOR_MARGIN = 16


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a SLURM allocation's, taskset's, a container's
    cpuset), which ``os.cpu_count()``, the machine's, ignores."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_each(processes: int) -> int:
    """Compute threads for each of ``processes`` processes sharing this one's cores: ``OMP_NUM_THREADS``
    where it is a positive whole number (the user's word, or a launcher's), else the usable cores shared
    out, at least one. More threads than cores make OpenMP's threads spin at each barrier for a core that
    another process holds: the work slows many times over, and burns the CPU it waits for."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, usable_cores() // processes)


def make_room_for_workers(workers: int, option: str) -> None:
    """Raise this process's soft limit of open files, within its hard limit, to what ``workers`` workers
    need (a soft limit is a default each process may raise, and a low one is common); a hard limit below
    that is a UsageError naming ``option`` before any worker starts. Running out later is worse than
    a refusal: a pool whose workers cannot all start hangs, and torch's loader workers print
    tracebacks of their descriptor hand-over."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = len(os.listdir("/proc/self/fd")) + DESCRIPTORS_PER_WORKER * workers + DESCRIPTOR_MARGIN
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise UsageError(f"{option}={workers} needs about {need} open files, more than this process may hold "
                         f"({hard}, ulimit -n): lower {option}, or raise the limit (ulimit -n {max(4096, need)})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def die_with_parent() -> None:
    """Ask Linux to end this process (SIGTERM) when the process that started it dies: a pool worker's first
    act, and a torchrun rank's. A command or launcher killed outright (SIGKILL) runs no cleanup, and its
    workers would write on, or its ranks train on, orphaned."""
    import ctypes
    import signal
    import sys

    if sys.platform == "linux":
        parent = os.getppid()
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the request took hold: as if just after
            os.kill(os.getpid(), signal.SIGTERM)


def stop_dying_with_parent() -> None:
    """Withdraw ``die_with_parent``'s request, once its notice has been taken. Linux sends the signal again as the
    orphan is passed on (prctl(2): at the end of the thread that started it, then of each subreaper it is given
    to): a rank that had stopped for its agent's death, checkpointed and restored the command line's handlers died
    of a later one, printing "error: terminated (SIGTERM)" beside rank 0's stop, in 8 of 47 tries here."""
    import ctypes
    import sys

    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, 0)  # PR_SET_PDEATHSIG: none


def _pool_worker() -> None:
    """A pool worker's start: it dies with its parent, and leaves Ctrl-C to it. A terminal's Ctrl-C reaches
    the whole foreground process group; a worker that took it would print its own traceback, and the command
    its one line after that."""
    import signal

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A worker must die of SIGTERM quietly, as PR_SET_PDEATHSIG means it to, whatever its parent's handler was
    # (the CLI's raises an exception: cli.stops).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def pool_size(workers: int, pieces: int) -> int:
    """The processes a pool of ``workers`` starts for ``pieces`` of independent work: at most one per piece,
    since a forked pool starts every process at once, and at least one."""
    return max(1, min(workers, pieces))


@contextlib.contextmanager
def worker_pool(workers: int, pieces: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``pool_size(workers, pieces)`` processes for ``pieces`` of independent work (shards): 200
    workers for 11 pieces would start 189 that never work. When the block raises
    (KeyboardInterrupt, SIGTERM's exception, a piece that failed), the pieces not yet started are cancelled
    and the running ones stopped (a piece may take a minute): the caller's cleanup then removes what they
    wrote, and no worker writes after it."""
    pool = ProcessPoolExecutor(max_workers=pool_size(workers, pieces), initializer=_pool_worker)
    try:
        yield pool
    except BaseException:
        # concurrent.futures has no public way to stop a running piece: its worker processes are terminated
        # (SIGTERM, which they take by default), and the pool, broken, shuts down at once.
        for process in list((pool._processes or {}).values()):
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
