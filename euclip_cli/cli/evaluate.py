"""``euclip eval [RUN ...] [--recipe NAME] [--tasks SPEC]``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from euclip_cli.cli.common import RUNS_DIR_OPTION, WORLD_OPTION, checked_path, console, errors, fail


def eval_command(runs: Optional[list[str]] = typer.Argument(None, help="Run directories or names under --runs-dir.",
                                                            show_default=False),
                 recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Evaluate every run of this recipe."),
                 tasks: Optional[str] = typer.Option(None, help="Suite (datacomp, world), SUITE:GROUP, or task keys; "
                                                                "default: the recipe's eval.tasks."),
                 openclip: Optional[list[str]] = typer.Option(None, "--openclip", help="An open_clip pretrained model "
                                                              "ARCH:TAG (or ARCH:checkpoint.pt), evaluated as a "
                                                              "clip-geometry run; repeatable."),
                 list_tasks: bool = typer.Option(False, "--list-tasks", help="List the task registry and exit."),
                 check_sets: bool = typer.Option(False, "--check-sets", help="Count each probe set's samples, classes "
                                                                            "and test images also in train against "
                                                                            "MERU's Table 6 (no model), and exit: 1 "
                                                                            "where one differs."),
                 eval_root: Optional[Path] = typer.Option(None, callback=checked_path,
                                                          help="DataComp evaluation sets (default: eval.root)."),
                 world: Optional[Path] = WORLD_OPTION,
                 device: str = typer.Option("auto", help="cpu, cuda, cuda:1, or auto."),
                 again: bool = typer.Option(False, "--again", help="Score tasks this checkpoint already has lines "
                                                                   "for once more (image features come from the "
                                                                   "cache; the new lines are appended and count)."),
                 runs_dir: Path = RUNS_DIR_OPTION) -> None:
    """Zero-shot evaluation of runs; results append to RUN/eval.jsonl as each task finishes.

    Examples:
      euclip eval --recipe tiny-clip
      euclip eval results/runs/tiny-clip results/runs/tiny-euclip --tasks world:shifts
      euclip eval --openclip ViT-B-32:datacomp_m_s128m_b4k --tasks datacomp
      euclip eval results/studies/geometries/runs/* --tasks world --again   # lines of an older euclip, anew
      euclip eval --check-sets --tasks meru-probe --eval-root data/eval   # MERU's probe sets, before any run
    """
    if check_sets:
        check_probe_sets(tasks or "meru-probe", eval_root, world)
        return
    if list_tasks:
        from euclip_cli.protocol.tasks import list_tasks as all_tasks

        for t in all_tasks():
            console.print(f"{t.key:55s} {t.suite:9s} {t.group or '-':11s} {t.main_metric or '-'}", highlight=False)
        return
    with errors():
        from euclip_cli.protocol.tasks import select
        from euclip_cli.rundir import select_runs

        targets = [run.path for run in select_runs(runs or [], recipe, runs_dir)]
        if openclip:
            from euclip_cli.released import import_run, openclip_run_name

            targets += [import_run("openclip", spec, openclip_run_name(spec), runs_dir).path for spec in openclip]
        if not targets:
            fail("name runs to evaluate, --recipe NAME or --openclip ARCH:TAG (euclip eval --help)", 2)
        chosen = select(tasks) if tasks else None
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from euclip_cli.device import resolve_device
    from euclip_cli.evaluate.runner import evaluate_run, task_status

    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} images"),
               TimeElapsedColumn()]
    problems: list[str] = []
    failed_tasks = 0
    with errors(), Progress(*columns, console=console, transient=True) as progress:
        for run_dir in targets:
            bars: dict[str, int] = {}

            def on_images(task, n):
                if task.key not in bars:
                    bars[task.key] = progress.add_task(f"{run_dir.name} {task.key}", total=None)
                progress.advance(bars[task.key], n)

            def on_task(task, line):
                if task.key in bars:
                    progress.remove_task(bars.pop(task.key))
                if not (line or {}).get("missing_data"):  # said once for the run, below
                    status = escape(task_status(line)).replace("failed:", "[red]failed[/]:", 1)
                    progress.console.print(f"  {task.key}: {status}", highlight=False)

            progress.console.print(f"[bold]{run_dir}[/]")
            outcome = evaluate_run(run_dir, resolve_device(device), chosen, eval_root, world, on_task=on_task,
                                   on_images=on_images, again=again)
            for line in outcome.suite_lines():
                progress.console.print(f"  {line}", highlight=False)
            if outcome.missing_line():
                progress.console.print(f"  {outcome.missing_line()}", highlight=False)
            failed_tasks += len(outcome.failed)
            problems += outcome.problems(run_dir.name)
    if problems:
        fail(f"{failed_tasks} task(s) failed; the others are scored, and rerunning retries only the failed ones:", 1,
             problems)
    console.print("next: euclip report")


def check_probe_sets(tasks: str, eval_root: Optional[Path], world: Optional[Path]) -> None:
    """``--check-sets``: one line per probe task, its set against MERU's Table 6."""
    from euclip_cli.config import Config
    from euclip_cli.evaluate.runner import export_command, has_data
    from euclip_cli.evaluate.sets import check_probe_set
    from euclip_cli.protocol.tasks import select

    root = eval_root or Path(Config().eval.root)
    with errors():
        chosen = [t for t in select(tasks) if t.kind == "probe"]
        if not chosen:
            fail(f"--tasks '{tasks}' names no probe task (meru-probe, or meru-probe/DATASET)", 2)
        differ, found = [], 0
        for task in chosen:
            folder = task.data_dir(root, world or Path("data/world"))
            if not has_data(task, folder):
                console.print(f"{task.key}: missing in {folder}; make it with {export_command(task, str(root))}",
                              highlight=False, soft_wrap=True)
                continue
            found += 1
            r = check_probe_set(task, folder)
            m = r["meru"]
            sizes = (f"train {r['train']:,}, val {r['val']:,}, test {r['test']:,}" if r["own_val"] else
                     f"train {r['train']:,} (euclip holds out its val), test {r['test']:,}")
            ok = r["sizes_match_meru"] and r["classes_match_meru"] and not r["test_in_train"]
            console.print(f"{task.key}: {sizes}; MERU's {m['train']:,} + {m['val']:,} / {m['test']:,}: sizes "
                          f"{'match' if r['sizes_match_meru'] else 'DIFFER'}; {r['classes']} classes (MERU's "
                          f"{m['classes']}); {r['test_in_train']:,} test images also in train or val"
                          f"{'' if ok else '  <- differs'}", highlight=False, soft_wrap=True)
            if not ok:
                differ.append(task.key)
    if not found:
        fail(f"no probe set of --tasks '{tasks}' under {root}: make them with 'euclip download "
             f"probesets --tasks {tasks} --root {root}' (docs/meru.md)", 2)
    if differ:
        fail(f"{len(differ)} of {found} probe sets differ from MERU's Table 6: {', '.join(differ)} (docs/meru.md "
             f"says which exporter and split make each)", 1)
