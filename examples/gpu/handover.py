"""How the loader's batches reach the trainer: torch's two ways of sharing a worker's tensors, timed.

torch's default (``file_descriptor``) hands each tensor's shared memory over as a file descriptor
that the receiving process fetches from the worker through a handshake served by a Python thread of
the worker; ``file_system`` hands over a name to open instead. The handshake needs the worker's
interpreter lock, and the receiving thread needs its own process's. Three cases, each with both:

  steady   the loader alone, one segment of the stream
  segment  the timed batches end a segment, so each worker refills its shuffle buffer (Python
           reading the shard) while its last batch is handed over (a run does so at every checkpoint)
  busy     another thread of the receiving process runs pure Python all the while, as a GPU
           trainer's main thread does while launching kernels and the DataLoader's pin thread receives

  python examples/gpu/handover.py                                  # ViT-B/32's 224 px, batch 256, 2 workers
  python examples/gpu/handover.py --workers 8 --batches 32         # on a GPU machine's 16 cores

Prints the samples/s delivered beside what the loaders could give (``LoaderWork``): delivered well
below it, the handover, not the loaders, sets the pace. A research aid for the GPU gap in
docs/training.md, not a benchmark with a target.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from pathlib import Path

import torch.multiprocessing as mp

from euclip_cli.bench import ensure_world, time_loader
from euclip_cli.data.loader import list_shards
from euclip_cli.model import build_clip, tokenizer_for, transforms_for

STRATEGIES = ("file_descriptor", "file_system")
CASES = ("steady", "segment", "busy")


@contextlib.contextmanager
def python_running_beside():
    """Another thread of this process running pure Python until the block ends: it holds the
    interpreter lock but at forced switches."""
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    threading.Thread(target=spin, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def measure(shards: list[str], parts: tuple, args: argparse.Namespace, case: str) -> tuple[float, float]:
    """(samples/s delivered, samples/s the loaders could give) over ``args.batches`` after the warm-up."""
    segment = args.warmup + args.batches if case == "segment" else sys.maxsize
    timed = time_loader(shards, parts, args.batch_size, args.workers, args.batches, args.warmup, segment_steps=segment,
                        while_timed=python_running_beside if case == "busy" else contextlib.nullcontext)
    return timed["samples_per_s"], timed["loader_samples_per_s"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="ViT-B-32", help="whose training transforms and tokenizer the loader runs")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8, help="timed per measurement")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved: every case and strategy once a round")
    parser.add_argument("--scratch", type=Path, default=Path("results") / "bench" / "scratch",
                        help="where the bench's world is (made if missing)")
    args = parser.parse_args(argv)
    shards = list_shards(ensure_world(args.scratch), "euclip bench loader")
    parts = transforms_for(build_clip(args.arch))[0], tokenizer_for(args.arch)
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for case in CASES:
            for strategy in STRATEGIES:
                # Process-wide, read when a tensor is handed over: the workers fork after this.
                mp.set_sharing_strategy(strategy)
                results.setdefault((case, strategy), []).append(measure(shards, parts, args, case))
    mp.set_sharing_strategy(STRATEGIES[0])
    print(f"{args.arch}'s transforms, batch {args.batch_size}, {args.workers} workers, {args.batches} batches timed, "
          f"{args.rounds} rounds: samples/s delivered per round (what the loaders could give)")
    for (case, strategy), rounds in results.items():
        cells = ", ".join(f"{got:.0f} ({could:.0f})" for got, could in rounds)
        print(f"{case:8s} {strategy:16s} {cells}")


if __name__ == "__main__":
    main()
