"""The README's results, rendered from the study tables committed beside it (``euclip study
--publish``), so that every number on the front page comes from a file in the repository.

A block starts with ``<!-- results FOLDER -->`` and ends with ``<!-- /results -->`` (``summary``
for a front page's shorter form), or, for one
study published at several budgets, ``<!-- curve FOLDER,FOLDER,... -->`` to ``<!-- /curve -->`` (its
table), ``<!-- trend FOLDER,FOLDER,... -->`` to ``<!-- /trend -->`` (each difference's change from the
first budget to the last, with its interval), ``<!-- fit FOLDER,FOLDER,... -->`` to ``<!-- /fit -->`` (the
power laws fitted to it, where they fit) or ``<!-- worth FOLDER,FOLDER,... -->`` to ``<!-- /worth -->`` (each
score's worth in the baseline's steps); a fit or a worth block reads the main group unless a group of
``tables.CURVE_METRICS`` follows its folders (``<!-- fit FOLDER,FOLDER shifts -->``), or, for pairs of one study's configurations neither of which is its baseline,
``<!-- contrast FOLDER:CONFIG/AGAINST,CONFIG/AGAINST,... -->`` to ``<!-- /contrast -->`` (each pair's
paired differences, ``tables.contrast_table``);
``euclip report --readme README.md`` rewrites what lies between from the folders, and a test holds
the README equal to that rendering.
"""

from __future__ import annotations

import re
from pathlib import Path

from euclip_cli.errors import UsageError
from euclip_cli.readers import read_text
from euclip_cli.rundir import read_json, write_text_atomic
from euclip_cli.stats import FROZEN_BELOW, NO_SPREAD, NOT_TESTABLE, PRIMARY, SECONDARY, UNDETERMINED, claim_sentence

BLOCK = re.compile(r"(<!-- (?P<kind>results|summary|curve|trend|fit|worth|contrast) (?P<folder>\S+)"
                   r"(?: (?P<group>\S+))? -->\n)(?P<body>.*?)(?P<end><!-- /(?P=kind) -->)", re.S)
# The blocks that read one group of a study's tasks, the main one unless the block names another.
GROUPED = ("fit", "worth")


# Verdicts that decide nothing about a claim's statement.
UNSETTLED = (UNDETERMINED, NO_SPREAD, NOT_TESTABLE)
# The columns a front page shows of a study's table (the study's own study.md has them all).
FRONT_PAGE = ("config", "seeds", "learned", "Shapes", "Retrieval", "Average over 10 tasks", "Δ Shapes vs baseline")


def results_block(folder: Path, name: str, summary: bool = False) -> str:
    """The results of one published study (in ``folder``, named ``name`` on the page): its
    provenance and regime, the configurations' table, its primary claims in words and its claims
    table. As a ``summary`` (a front page): the table's main columns (``FRONT_PAGE``), the primary
    claims in words, and the rest counted and linked (all of them, for a study that declares none)."""
    import pandas as pd

    from euclip_cli.report.tables import render, study_tables

    for needed in ("study.csv", "claims.csv", "regime.json", "provenance.json"):
        if not (folder / needed).exists():
            raise UsageError(f"{folder / needed} is missing: publish the study first (euclip study --recipe NAME "
                             f"--publish {folder})")
    made = read_json(folder / "provenance.json")
    regime = read_json(folder / "regime.json")
    results, claims = study_tables(folder)
    frozen = sorted({f"{r['config']}'s {r['scalar']}" for r in regime["scalars"] if r["frozen"]})
    if frozen and len(frozen) == len(regime["scalars"]):
        frozen = ["every learnable scalar"]
    lines = [f"`{made['command']}`: {made['runs']} runs at euclip {', '.join(made['euclip_commits'])} on "
             f"{', '.join(made['cpus'])} ({', '.join(made['precisions'])}); tables in `{name}`.",
             f"Each run sees {regime['samples']:,} samples (learning rates summing to {regime['summed_lr']:.3g}); the "
             f"claims are read beside the paper's {regime['scale']} scale, {regime['paper_samples']:,} samples summing "
             f"to {regime['paper_summed_lr']:.3g}; frozen (moved < {FROZEN_BELOW:.0%}): "
             f"{', '.join(frozen) if frozen else 'none'}. ± is the sd over seeds; Δ's interval is raw 95%, a "
             f"claim's family-wise.", "",
             render(results[[c for c in results.columns if c in FRONT_PAGE or not summary]], "md").rstrip("\n"), ""]
    rows = pd.read_csv(folder / "claims.csv").to_dict("records") if (folder / "claims.csv").stat().st_size else []
    primary = [c for c in rows if c.get("family") == PRIMARY]
    if not rows:
        lines += ["No claim is tested: no claim of `euclip_cli/study/claims.toml` names these configurations.", ""]
    elif not summary:
        lines += [f"- {claim_sentence(c)}" for c in primary] + ([""] if primary else [])
        lines += [render(claims, "md").rstrip("\n"), ""]
    elif primary:
        # The claims the study was run to decide, in words that follow their intervals; the rest are
        # in its study.md.
        secondary = [c for c in rows if c.get("family") == SECONDARY]
        decided = [c["claim"] for c in secondary if c["verdict"] not in UNSETTLED]
        lines += [f"- {claim_sentence(c)}" for c in primary]
        lines += ["", f"{len(secondary)} secondary claims, adjusted among themselves, are in "
                      f"[{name}/study.md]({name}/study.md): "
                      + (f"{len(decided)} decided ({', '.join(decided)})." if decided else "none decided."), ""]
    else:
        decided = [f"{c['claim']} ({c['verdict']})" for c in rows if c["verdict"] not in UNSETTLED]
        lines += [f"{len(rows)} claims, decided together, are in [{name}/study.md]({name}/study.md): "
                  + (f"{len(decided)} decided: {', '.join(decided)}." if decided else "none decided."), ""]
    return "\n".join(lines)


def block_folders(match: re.Match) -> list[str]:
    """The folders a block renders from (a curve's, comma-separated; a contrast's before its colon),
    relative to its page."""
    if match["kind"] == "contrast":
        return [match["folder"].split(":", 1)[0]]
    return match["folder"].split(",") if match["kind"] in BUDGET_BLOCKS else [match["folder"]]


def contrast_block(match: re.Match, page: Path) -> str:
    """A contrast block's ``FOLDER:CONFIG/AGAINST,...`` (the folder relative to ``page``'s) as
    ``tables.contrast_table``'s table."""
    from euclip_cli.report import tables

    (folder,) = block_folders(match)
    listed = match["folder"][len(folder) + 1:]
    pairs = [tuple(pair.split("/")) for pair in listed.split(",")] if listed else []
    if not pairs or any(len(pair) != 2 or not all(pair) for pair in pairs):
        raise UsageError(f"{page}: '<!-- contrast {match['folder']} -->' names no pairs: write it as "
                         f"'<!-- contrast FOLDER:CONFIG/AGAINST,CONFIG/AGAINST -->'")
    _published([page.parent / folder])
    return tables.contrast_table(page.parent / folder, pairs).to_markdown(index=False, disable_numparse=True) + "\n"


def _published(folders: list[Path]) -> None:
    for folder in folders:
        for needed in ("study.csv", "noise.csv", "regime.json", "provenance.json"):
            if not (folder / needed).exists():
                raise UsageError(f"{folder / needed} is missing: publish the study first (euclip study --recipe NAME "
                                 f"--publish {folder})")


# The blocks that render one study published at several budgets: the ``euclip_cli.report.tables`` function
# that sets each out.
BUDGET_BLOCKS = {"curve": "budget_curve", "trend": "budget_trend", "fit": "budget_fit", "worth": "budget_worth"}


def budget_block(kind: str, folders: list[Path], group: str = "main") -> str:
    """One study at several budgets as a block of ``kind``: its curve, each difference's trend, the power
    laws fitted to ``group``, or each score's worth in the baseline's steps on it (``tables.budget_curve``,
    ``budget_trend``, ``budget_fit``, ``budget_worth``)."""
    from euclip_cli.report import tables

    _published(folders)
    make = getattr(tables, BUDGET_BLOCKS[kind])
    table = make(folders, group) if kind in GROUPED else make(folders)
    # Cells as written: tabulate would otherwise read "50.0" as a number and print "50".
    return table.to_markdown(index=False, disable_numparse=True) + "\n"


def block_group(match: re.Match, page: Path) -> str:
    """The group a block names after its folders ("main" where it names none), refused where its kind reads
    no group or the group is not one a budget curve shows (``tables.CURVE_METRICS``)."""
    from euclip_cli.report.tables import CURVE_METRICS

    group = match["group"]
    if group is None:
        return "main"
    if match["kind"] not in GROUPED:
        raise UsageError(f"{page}: '<!-- {match['kind']} {match['folder']} {group} -->' names a group, which only "
                         f"{' and '.join(GROUPED)} blocks take: remove '{group}'")
    if group not in CURVE_METRICS:
        raise UsageError(f"{page}: '<!-- {match['kind']} {match['folder']} {group} -->' names the group '{group}': "
                         f"name one of {', '.join(CURVE_METRICS)}")
    return group


def update_readme(readme: Path, check: bool = False) -> list[str]:
    """Rewrite every results block of ``readme`` from its folder (relative to the README's own);
    returns the folders rendered. With ``check``, raise UsageError instead where a block differs."""
    text = read_text(readme, "--readme")
    folders = []

    def render(match: re.Match) -> str:
        folders.append(match["folder"])
        group = block_group(match, readme)
        if match["kind"] == "contrast":
            body = contrast_block(match, readme)
        elif match["kind"] in BUDGET_BLOCKS:
            body = budget_block(match["kind"], [readme.parent / name for name in block_folders(match)], group)
        else:
            body = results_block(readme.parent / match["folder"], match["folder"], match["kind"] == "summary")
        if check and body != match["body"]:
            raise UsageError(f"{readme}: the results from {match['folder']} differ from its files: run "
                             f"'euclip report --readme {readme}'")
        return match[1] + body + match["end"]

    updated = BLOCK.sub(render, text)
    if not folders:
        raise UsageError(f"{readme} has no '<!-- results FOLDER -->' ... '<!-- /results -->' block")
    if updated != text:
        write_text_atomic(readme, updated)
    return folders
