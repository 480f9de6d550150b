"""Where training records go: ``metrics.jsonl``, TensorBoard and Weights & Biases (rank 0 only).

The trainer hands each record to ``MetricsWriters.write`` and never names a backend itself.
"""

from __future__ import annotations

import json
import time
from typing import Optional

from euclip_cli.errors import Failure
from euclip_cli.rundir import RunDir, write_text_atomic


def truncate_records(run: RunDir, step: int) -> None:
    """Drop ``metrics.jsonl`` records after ``step``: a run resumed from the checkpoint at ``step``
    logs those steps again, and a log must hold each step once."""
    path = run.metrics_file
    if not path.exists():
        return
    kept = [r for r in run.training_records() if r["step"] <= step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


def start_wandb(run: RunDir, project: str, config: dict):
    """A W&B run that resumes with the training run (its id is kept in the run directory)."""
    try:
        import wandb
    except ImportError:
        raise Failure("train.wandb=true but the wandb package is not installed: pip install wandb, "
                      "or set train.wandb=false") from None
    id_file = run.wandb_id_file
    if not id_file.exists():
        id_file.write_text(f"{run.name}-{time.strftime('%Y%m%d%H%M%S')}")
    return wandb.init(project=project, name=run.name, id=id_file.read_text().strip(), resume="allow",
                      dir=str(run.path), config=config)


class MetricsWriters:
    """Every configured destination of the training records."""

    def __init__(self, run: RunDir, resumed_step: int, tensorboard: bool, wandb_project: Optional[str], config: dict):
        truncate_records(run, resumed_step)
        self.jsonl = run.metrics_file.open("a")
        self.tensorboard = self.wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(run.tensorboard_dir))
        if wandb_project:
            self.wandb = start_wandb(run, wandb_project, config)

    def write(self, record: dict, step: int) -> None:
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tensorboard:
            for key, value in record.items():
                self.tensorboard.add_scalar(f"train/{key}", value, step)
        if self.wandb:
            self.wandb.log({f"train/{k}": v for k, v in record.items()}, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tensorboard:
            self.tensorboard.close()
        if self.wandb:
            self.wandb.finish()
