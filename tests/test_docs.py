"""The docs as a house: reference pages say what the code does, and dated measurements live apart.

A reference page (``docs/*.md``) may not quote a machine, a commit or a date: those belong to the pages
under ``docs/measurements/`` and ``docs/results/``, which it links. Every relative link of every page
resolves, anchors included, so moving a measurement never leaves a reader at a dead end.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE = sorted(DOCS.glob("*.md"))
PAGES = [ROOT / "README.md", *REFERENCE, *sorted((DOCS / "results").glob("*.md")),
         *sorted((DOCS / "measurements").rglob("*.md"))]

# CPU and GPU model names as lscpu and nvidia-smi print them.
MACHINE = re.compile(r"\b(EPYC|Xeon|Ryzen|Threadripper|Epyc|Core\(TM\)|H100|H200|A100|V100|A10G|GH200|B200|L40S?|"
                     r"RTX ?\d{4}|Sapphire Rapids|Milan|Genoa)\b")
# A short or full git hash: hexadecimal of 7 to 40 characters with a digit and a letter in it.
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
# "About 250 lines" (the figure), with room for a table.
MOST_LINES = 300
README_LINES, README_WORDS = 150, 1200


def test_the_guards_catch_what_they_are_for():
    line = "measured at 3ef9087 on an AMD EPYC on 2026-11-24, and on one H100"
    assert MACHINE.findall(line) == ["EPYC", "H100"] and COMMIT.findall(line) == ["3ef9087"]
    assert DATE.findall(line) == ["2026-11-24"]
    # Words and numbers that merely look alike pass: hex-free words, plain numbers, versions.
    assert not COMMIT.findall("fused addmm 1000000 decode 2.14.1 effaced cafebabe")


@pytest.mark.parametrize("page", REFERENCE, ids=lambda p: p.name)
def test_a_reference_page_quotes_no_machine_commit_or_date(page):
    found = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        text = LINK.sub("]()", line)  # a link's target may name a dated folder; its text may not
        for kind, pattern in (("machine", MACHINE), ("commit", COMMIT), ("date", DATE)):
            found += [f"{page.name}:{number}: {kind} {m.group(0)!r}" for m in pattern.finditer(text)]
    assert not found, "move dated measurements under docs/measurements/ and link them:\n" + "\n".join(found)


@pytest.mark.parametrize("page", REFERENCE, ids=lambda p: p.name)
def test_a_reference_page_stays_short(page):
    assert len(page.read_text().splitlines()) <= MOST_LINES


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES and len(text.split()) <= README_WORDS


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation but hyphens dropped,
    spaces to hyphens, a repeated heading numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in page.read_text().splitlines():
        if not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(target)
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: " + ", ".join(broken)
