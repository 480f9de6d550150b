"""One self-contained HTML page: every table, every figure inlined (readable offline, no assets)."""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path

# Fits a laptop window (1366 px and narrower): the body never exceeds the window, a table wider than
# it scrolls inside its own box instead of widening the page, and figures take the text's width
# (or their own size, when smaller) rather than thumbnail size.
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; padding: 0 1em; color: #222; }
.table { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 13px; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0; }
figcaption { font-size: 13px; color: #555; }
summary { font-size: 1.3em; font-weight: bold; margin: 1em 0; cursor: pointer; }
img { display: block; max-width: 100%; height: auto; }
"""

Figure = tuple[str, Path]


def _figure(caption: str, png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return (f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def page(title: str, sections: list[tuple[str, str, list[Figure]]],
         reference: list[tuple[str, str]] = ()) -> str:
    """``sections``: (heading, HTML table or "", the figures that belong to it), in order; ``reference``:
    (heading, HTML table) pairs in one closed ``<details>`` at the end, opened on a click. PNGs are
    embedded as data URIs."""
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             f"<p>Generated {time.strftime('%Y-%m-%d %H:%M')} by <code>euclip report --format html</code>.</p>"]
    for heading, table, own in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if table:
            parts.append(f"<div class='table'>{table}</div>")
        parts += [_figure(caption, png) for caption, png in own]
    if reference:
        parts.append(f"<details><summary>Published numbers, for reference ({len(reference)} tables)</summary>")
        for heading, table in reference:
            parts += [f"<h3>{html.escape(heading)}</h3>", f"<div class='table'>{table}</div>"]
        parts.append("</details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
