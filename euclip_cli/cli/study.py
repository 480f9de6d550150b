"""``euclip study --recipe NAME [--seeds N] [--jobs J]``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from euclip_cli.cli.common import checked_path, console, errors, writable_folder


def study(recipe: Optional[str] = typer.Option(None, "--recipe", "-r",
                                              help="A study recipe (recipes/study-*.toml); without it, the "
                                                   "recipe and options --out's study was last started with."),
          overrides: Optional[list[str]] = typer.Argument(None, help="section.key=value overrides for every "
                                                                      "configuration, after its own (e.g. "
                                                                      "optim.samples=131072 for 4x the budget).",
                                                           show_default=False),
          configs: Optional[str] = typer.Option(None, help="Comma-separated configurations to keep (default: all)."),
          seeds: Optional[int] = typer.Option(None, min=1, max=10_000, help="Seeds 0..N-1 instead of the recipe's count."),
          jobs: int = typer.Option(1, min=1, help="Runs trained at once (each gets OMP_NUM_THREADS threads where it is set, else cores / jobs)."),
          out: Optional[Path] = typer.Option(None, callback=writable_folder,
                                             help="Study folder (default: results/studies/NAME)."),
          world: Optional[Path] = typer.Option(None, callback=checked_path,
                                               help="Embedded world to evaluate on (default: the one trained on)."),
          publish: Optional[Path] = typer.Option(None, callback=writable_folder,
                                                 help="Also copy the tables (study.md, study.csv, claims.csv, "
                                                      "noise.csv, regime.json) with their provenance to this "
                                                      "folder, for committing: euclip report --readme "
                                                      "renders the README's results from it."),
          launcher: str = typer.Option("local", help="local (child processes here), slurm (a SLURM job per run, "
                                                     "through submitit), ray (a Ray task per run; RAY_ADDRESS "
                                                     "names the cluster) or submitit-local (submitit's jobs on "
                                                     "this machine)."),
          resource: Optional[list[str]] = typer.Option(None, help="KEY=VALUE: what each run's job asks for, after "
                                                                  "the recipe's [study.resources] (gpus, cpus, mem_gb, "
                                                                  "hours, partition, warning_s, retries); repeatable."),
          show_plan: bool = typer.Option(False, "--plan", help="Print the runs, the samples each sees and the GPU "
                                                               "hours they take; run nothing."),
          throughput: Optional[list[str]] = typer.Option(None, help="Training samples/s per GPU for the plan: "
                                                                    "ARCH=N, or an 'euclip bench train' result file "
                                                                    "(default: OpenCLIP's published ViT-B figures)."),
          max_gpu_hours: Optional[float] = typer.Option(None, min=0, help="Refuse the study, before submitting "
                                                                          "anything, above this many GPU hours."),
          show_status: bool = typer.Option(False, "--status", help="Print each run's state, job and log; run "
                                                                   "nothing."),
          wait: bool = typer.Option(True, help="With a cluster launcher: follow the jobs until every run has "
                                               "ended, then summarise (--no-wait: submit and return)."),
          poll: float = typer.Option(60.0, min=0.1, help="Seconds between looks at a cluster's jobs."),
          stalled_after: float = typer.Option(60.0, min=0.01, help="Minutes a running job's run may write "
                                                                  "nothing (its log, training records) before "
                                                                  "it is called stalled and, on SLURM, "
                                                                  "requeued to resume from its checkpoint."),
          republish: Optional[Path] = typer.Option(None, callback=checked_path,
                                                   help="A published study's folder: recompute its tables, claims "
                                                        "and study.md from its seeds.csv with this euclip's "
                                                        "statistics; trains nothing (alone, without --recipe)."),
          ) -> None:
    """Train and evaluate every (configuration, seed) of a study, then compare them with intervals.

    Re-running the same command skips finished runs and resumes interrupted ones. Writes
    study.md, study.csv, claims.csv, study.png/pdf and the temperature over training
    (study_temperature.png/pdf) to the study folder.

    Examples:
      euclip study --recipe study-geometries
      euclip study --recipe study-geometries --seeds 5 --jobs 2
      euclip study --recipe study-geometries --publish docs/results/geometries
      euclip study --republish docs/results/geometries
      euclip study --recipe study-geometries --configs clip,euclip optim.samples=131072 --out results/studies/x4
      euclip study --recipe study-table4 --plan --throughput results/bench/train-20261125-101500.json
      euclip study --recipe study-table4 --launcher slurm --resource partition=gpu --max-gpu-hours 2000
    """
    from euclip_cli.errors import UsageError
    from euclip_cli.rundir import STUDIES_DIR, read_json
    from euclip_cli.study import launch
    from euclip_cli.study.jobs import plan
    from euclip_cli.study.runner import PROVENANCE, run_study
    from euclip_cli.study.spec import OPTIONS_FILE, StudyOptions, load_claims, load_study
    from euclip_cli.study.tables import to_markdown

    say = lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    with errors():
        if republish is not None:
            from euclip_cli.study.runner import republish as recompute

            if recipe is not None or out is not None or publish is not None:
                raise UsageError("--republish recomputes a published folder from its own seeds.csv and command: "
                                 "give it alone, without --recipe, --out or --publish")
            say("written: " + ", ".join(str(p) for p in recompute(republish)))
            return
        if launcher not in launch.LAUNCHERS:
            raise UsageError(f"--launcher '{launcher}': not one of {', '.join(launch.LAUNCHERS)}")
        if recipe is None:
            given = StudyOptions.read(out) if out is not None else None
            if given is None:
                raise UsageError(f"--recipe is missing: name a study recipe, or give --out with the folder of a study "
                                 f"started before ({OPTIONS_FILE} there records its recipe and options)")
            say(f"the study in {out}: --recipe {given.recipe}, as it was last started")
        else:
            given = StudyOptions(recipe, seeds, tuple(overrides or ()), configs, tuple(resource or ()),
                                 str(world.resolve()) if world else None)
        world = Path(given.world) if given.world else None
        spec = load_study(given.recipe, given.seeds, list(given.overrides),
                          given.configs.split(",") if given.configs else None, list(given.resources))
        folder = out or STUDIES_DIR / spec.name
        if show_plan or show_status or max_gpu_hours is not None:
            plans = plan(spec, folder, load_claims(), world)
            if show_status:
                for line in launch.status(folder, plans):
                    say(line)
                return
            rows = launch.costs(spec, plans, launch.throughputs(throughput or []))
            if show_plan:
                for line in launch.cost_lines(rows):
                    say(line)
                return
            launch.check_budget(rows, max_gpu_hours)
        result = run_study(spec, folder, jobs, world, say, launcher, wait, poll, options=given,
                           stalled_after_s=60 * stalled_after, publish_to=publish)
        if result is None:
            say("the runs above are not finished: run the same command to follow them (it submits only what is "
                "neither finished nor queued); the study is summarised once all are finished")
            return
        if publish is not None:
            dirty = read_json(publish / PROVENANCE)["runs_from_uncommitted_changes"]
            if dirty:
                say(f"warning: {dirty} of the published runs were trained from uncommitted changes, so no commit "
                    f"reproduces them: commit, delete those runs' folders and run the study again before citing it")
    console.print(to_markdown(spec, result.summary), highlight=False, markup=False)
    console.print("written: " + ", ".join(str(p) for p in result.written))
