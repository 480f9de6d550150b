"""Which device a process computes on, and the autocast context for a precision.

Shared by training, evaluation and the analyses, so each command resolves ``--device`` /
``train.device`` the same way and reports a device it cannot use in one line.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Callable, Optional

import torch

from euclip_cli.errors import UsageError


def resolve_device(name: str, local_rank: int = 0, world: int = 1) -> torch.device:
    """``auto``: this process's GPU under torchrun (``cuda:LOCAL_RANK``) when there is one, else the CPU.

    ``cuda`` without an index is ``cuda:LOCAL_RANK``. An explicit index under several processes
    would put every rank on that one GPU, so it is refused.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"device '{name}' is not a device: use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"device '{name}': euclip runs on cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device '{name}': this machine has no CUDA GPU (torch sees none); use cpu or auto")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        elif world > 1:
            raise UsageError(f"device '{name}' under {world} processes would put every rank on GPU {device.index}; "
                             f"use cuda (each rank takes cuda:LOCAL_RANK) and CUDA_VISIBLE_DEVICES to pick GPUs")
        if device.index >= torch.cuda.device_count():
            raise UsageError(f"device '{device}': this machine has {torch.cuda.device_count()} GPU(s)")
    return device


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 in hardware: a GPU that supports bf16, or a CPU with AMX tiles
    or AVX-512 BF16 instructions. Elsewhere oneDNN emulates bf16 through fp32 and is slower than fp32
    itself (measured: docs/speed.md)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision a run computes in: ``auto`` is bf16 where ``device`` has bf16 units, else fp16 on a
    GPU (with the gradient scaler, as AMP on a V100) and fp32 on a CPU; the others are taken as given."""
    if precision != "auto":
        return precision
    if native_bf16(device):
        return "bf16"
    return "fp16" if device.type == "cuda" else "fp32"


def autocast_factory(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """A fresh autocast context per call: bf16 or fp16 around the encoders, nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)


def cpu_name(info: Optional[Path] = None) -> str:
    """This machine's CPU model as the kernel reports it in ``info`` (/proc/cpuinfo; lscpu's "Model name"),
    with its family and model numbers where the kernel gives them. Speeds and the last bits of results
    differ between CPUs of one kind, so every published number names its CPU; and a virtual machine's
    name can cover several: two "AMD EPYC" machines of this project's kind, one without bf16 units
    (family 23, model 49) and one with them, train a recipe at speeds twice apart, and in different
    precisions under ``precision = "auto"``."""
    import platform

    info = Path("/proc/cpuinfo") if info is None else info
    if info.exists():
        first = {}
        for line in info.read_text().splitlines():
            if not line.strip():
                break  # the first processor's block: every core of a machine is the same model here
            key, _, value = line.partition(":")
            first.setdefault(key.strip(), value.strip())
        if "model name" in first:
            numbers = [f"{label} {first[key]}" for label, key in (("family", "cpu family"), ("model", "model"))
                       if first.get(key)]
            return first["model name"] + (f" ({', '.join(numbers)})" if numbers else "")
    return platform.processor() or "unknown"


def git_state(code_only: bool = False) -> tuple[str, bool]:
    """``(commit, whether tracked files differ from it)`` of the euclip checkout this code runs from,
    ``code_only``: the package's files alone (a table recomputed from committed values depends on the
    code, not on the other tables being rewritten beside it); ("unknown", False) outside a checkout, or
    without git: what a run's or a table's provenance records."""
    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip() or "unknown"
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no",
                                     *(["--", str(Path(__file__).resolve().parent)] if code_only else [])],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    return rev, dirty


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is the machine running out of memory: torch's for a GPU, Python's, or the CPU
    allocator's (a RuntimeError whose message says so, as torch raises it)."""
    return (isinstance(err, (torch.OutOfMemoryError, MemoryError))
            or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err)))


def host_memory_bytes() -> int:
    """The machine's physical memory."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
