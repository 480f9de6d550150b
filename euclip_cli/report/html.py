"""One self-contained HTML page: every table, every figure inlined (readable offline, no assets)."""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; }
td:first-child, th:first-child { text-align: left; }
figure { display: inline-block; margin: 1em; vertical-align: top; }
figcaption { font-size: 12px; color: #555; }
img { max-width: 560px; }
"""


def page(title: str, tables: list[tuple[str, str]], figures: list[tuple[str, Path]]) -> str:
    """``tables``: (heading, HTML table); ``figures``: (caption, PNG file), embedded as data URIs."""
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             f"<p>Generated {time.strftime('%Y-%m-%d %H:%M')} by <code>euclip report --format html</code>.</p>"]
    for heading, table in tables:
        parts += [f"<h2>{html.escape(heading)}</h2>", table]
    if figures:
        parts.append("<h2>Figures</h2>")
    for caption, png in figures:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
