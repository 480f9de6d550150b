"""``euclip train --recipe NAME [section.key=value ...]``."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli.common import NEW_RUNS_DIR_OPTION, console, errors, fail
from euclip_cli.rundir import plain_name

# Seconds torchrun waits, after forwarding SIGTERM, for the ranks to finish their step and
# checkpoint before it kills them: its own default (30 s) is shorter than writing a large
# checkpoint, and SLURM's usual warning (``--signal=TERM@120``) leaves 120 s.
SHUTDOWN_GRACE_S = 110


def default_run_name(recipe: str, overrides: list[str]) -> str:
    seeds = [o.split("=", 1)[1] for o in overrides if o.replace(" ", "").startswith("train.seed=")]
    return recipe + (f"-seed{seeds[-1]}" if seeds else "")


def train(recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (euclip recipes list) or path."),
          overrides: Optional[list[str]] = typer.Argument(None, help="section.key=value overrides, e.g. optim.lr=1e-3.",
                                                           show_default=False),
          name: Optional[str] = typer.Option(None, help="Run name under --runs-dir (default: the recipe, "
                                                        "plus -seedN when train.seed is overridden)."),
          runs_dir: Path = NEW_RUNS_DIR_OPTION,
          nproc_per_node: int = typer.Option(1, "--nproc-per-node", min=1,
                                             help="Processes on this machine (one per GPU, or CPU processes with "
                                                  "gloo), started through torchrun; data.batch_size stays global."),
          plan: bool = typer.Option(False, "--plan", help="Print the GPU memory the recipe's step needs, with and "
                                                         "without train.grad_checkpointing, and the GPUs that "
                                                         "fit it; train nothing.")
          ) -> None:
    """Train a model; re-running the same command resumes it.

    Examples:
      euclip train --recipe tiny-clip
      euclip train --recipe tiny-euclip loss.entail_weight=0.2 --name tiny-euclip-l02
      euclip train --recipe medium-euclip --nproc-per-node 8
      euclip train --recipe medium-euclip --plan        # memory per GPU, with and without checkpointing
    """
    from euclip_cli import config as C

    overrides = overrides or []
    with errors():
        cfg = C.load_config(recipe, overrides, each_key_once=True)
        if plan:
            print_memory_plan(cfg)
            return
        name = plain_name(name if name is not None else default_run_name(cfg.recipe, overrides), "--name")
    if nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        # Become torchrun (exec, so preemption signals reach it and it forwards them to every rank).
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc_per_node}",
                   f"--shutdown-timeout={SHUTDOWN_GRACE_S}", "-m", "euclip_cli", "train", "--recipe", recipe,
                   "--name", name, "--runs-dir", str(runs_dir), *overrides]
        console.print(" ".join(command[1:]), highlight=False)
        sys.stdout.flush()
        # SIGUSR2, a SLURM time limit's warning (submitit's), reaches torchrun as it reaches every rank:
        # torchrun would die of it and orphan the ranks it waits for. Ignored here (a disposition exec
        # keeps), torchrun outlives it; each rank's trainer sets its own handler and checkpoints.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        os.execv(sys.executable, command)
    run_dir = runs_dir / name
    from euclip_cli.train import distributed

    with errors():
        rank = distributed.launched_rank()
    if rank != 0:
        from euclip_cli.train.loop import run

        with errors():
            run(cfg, run_dir, argv=sys.argv)
        distributed.shutdown()
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from euclip_cli.train.loop import run, waits_for_data

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[info]}"), TimeRemainingColumn()]
    # The bar is drawn from the first step on: a refusal that comes once the run has begun (a stored config it
    # cannot read, another world) is then the only line on the terminal.
    progress = Progress(*columns, console=console)
    bar = progress.add_task(run_dir.name, total=C.total_steps(cfg), info="starting")
    with errors(), contextlib.ExitStack() as drawn:
        def on_step(step: int, total: int, record: dict) -> None:
            if not progress.live.is_started:
                drawn.enter_context(progress)
            info = f"loss {record['loss']:.3f}"
            if "entailment" in record:
                info += f" (contrastive {record['contrastive']:.3f}, entailment {record['entailment']:.3f})"
            info += f"  {record['samples_per_s']:.0f} samples/s  beta {record['logit_scale']:.2f}"
            if waits_for_data(record):
                info += f"  waiting for data {record['data_wait_share']:.0%}"
                if "loader_samples_per_s" in record:
                    info += (f" (loaders {record['loader_samples_per_s']:.0f}/s, "
                             f"{record['loader_cpu_share']:.0%} CPU)")
            if "curvature" in record:
                info += f"  c {record['curvature']:.3f}"
            progress.update(bar, completed=step, info=info)

        result = run(cfg, run_dir, argv=sys.argv, on_step=on_step)
    from euclip_cli.train import distributed

    distributed.shutdown()
    if result["interrupted"]:
        fail(f"stopped at step {result['steps']}; checkpoint {result['checkpoint']}; run the same command to resume", 1)
    console.print(f"{result['branch']}: {result['steps']} steps in {result['precision']}, checkpoint {result['checkpoint']}")
    if result["skipped_samples"]:
        console.print(f"warning: {result['skipped_samples']:,} samples ({result['skipped_fraction']:.1%} of those read) "
                      f"could not be decoded and were skipped (limit: data.max_skipped_fraction)", highlight=False)
    console.print(f"next: euclip eval {run_dir}")


# GPU memory of the kinds a plan names (GiB as the vendors sell them, usable a little less).
GPU_MEMORY_GIB = {"H100 80GB": 80, "A100 40GB": 40, "H200": 141}
# Room under the 90% bound below which a plan calls its fit tight (GiB).
TIGHT_GIB = 2.0


def print_memory_plan(cfg) -> None:
    """``euclip train --plan``: the recipe's memory per GPU over GPU counts, with and without checkpointing."""
    from rich.table import Table

    from euclip_cli.train.memory import plan

    with console.status(f"measuring what {cfg.model.arch}'s towers keep for backward (on the CPU)"):
        p = plan(cfg)
    gib = 2 ** 30
    console.print(f"{cfg.recipe}: {cfg.model.arch}, {p.parameters / 1e6:.1f}M parameters, global batch {p.global_batch}, "
                  f"{p.precision} on a GPU", highlight=False)
    console.print(f"  kept for backward per sample: {p.towers.per_sample / 2 ** 20:.2f} MiB, with checkpointing "
                  f"{p.towers_checkpointed.per_sample / 2 ** 20:.2f} MiB "
                  f"({p.towers_checkpointed.per_sample / p.towers.per_sample:.2f}x); weights, gradients and AdamW "
                  f"{p.static_bytes / gib:.2f} GiB; the global batch's loss {p.loss_bytes / gib:.2f} GiB"
                  + (", a GPU's share of it with loss.local_loss" if p.local_loss else
                     " on every GPU (loss.local_loss=true keeps a GPU's share)"), highlight=False)
    table = Table(title="GiB per GPU for one step (CUDA context and allocator slack not included)")
    table.add_column("GPUs", justify="right")
    table.add_column("per-GPU batch", justify="right")
    table.add_column("without checkpointing", justify="right")
    table.add_column("with checkpointing", justify="right")
    gpus = 1
    while gpus <= 64 and p.global_batch % gpus == 0:
        table.add_row(str(gpus), str(p.global_batch // gpus), f"{p.per_gpu(gpus, False) / gib:.1f}",
                      f"{p.per_gpu(gpus, True) / gib:.1f}")
        gpus *= 2
    console.print(table)
    # One GPU's figure also as a plain line: a table's box drawing is no format for a script to parse.
    console.print(f"  one GPU at batch {p.global_batch}: {p.per_gpu(1, False) / gib:.2f} GiB without checkpointing, "
                  f"{p.per_gpu(1, True) / gib:.2f} GiB with", highlight=False)
    for kind, size in GPU_MEMORY_GIB.items():
        # 10% kept back for the CUDA context, the allocator's slack and transient peaks.
        bound = 0.9 * size * gib
        fits = [p.gpus_needed(bound, ckpt) for ckpt in (False, True)]
        words = []
        for n, ckpt in zip(fits, (False, True)):
            word = f"{n} GPU{'s' if n > 1 else ''}" if n else "more than fit a node's share of the batch"
            spare = bound - p.per_gpu(n, ckpt) if n else None
            # A fit with less room than a CUDA context (about 0.5 GiB) and the allocator's fragmentation
            # take is a fit on paper only.
            if spare is not None and spare < TIGHT_GIB * gib:
                word += f" (only {spare / gib:.1f} GiB left under the 90% bound: tight)"
            words.append(word)
        console.print(f"  {kind}: the fewest that fit: {words[0]} without checkpointing, {words[1]} with "
                      f"(train.grad_checkpointing=true)", highlight=False)
