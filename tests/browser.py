"""Measure a page's layout in a real headless Chromium (Debian's ``chromium`` package).

A script appended to a copy of the page records, once everything has loaded, the window's and the
document's widths, every image's rendered and natural width, every second-level heading, and every
table and figure in page order (whether it is shown, a table's header and columns); with
``--dump-dom`` Chromium prints the DOM after load, and the record is read back from it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

CHROMIUM: Optional[str] = shutil.which("chromium") or shutil.which("chromium-browser")

PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "layout";
  out.textContent = JSON.stringify({
    window: window.innerWidth, document: document.documentElement.scrollWidth,
    body: document.body.getBoundingClientRect().width,
    images: [...document.images].map(i => ({rendered: i.getBoundingClientRect().width, natural: i.naturalWidth})),
    headings: [...document.querySelectorAll("h2")].map(h => h.textContent),
    // Tables and figures in page order: shown (not inside a closed <details>), and for a table its
    // header and each column's cells.
    items: [...document.querySelectorAll("table, figure")].map(e => ({
      kind: e.tagName.toLowerCase(), shown: e.checkVisibility(),
      caption: e.tagName === "FIGURE" ? e.querySelector("figcaption").textContent : "",
      header: [...e.querySelectorAll("thead th")].map(c => c.textContent),
      columns: e.tagName === "TABLE" ? [...e.querySelectorAll("thead th")].map((_, i) =>
        [...e.querySelectorAll("tbody tr")].map(r => (r.children[i] || {}).textContent || "")) : [],
    })),
  });
  document.body.appendChild(out);
});
</script>"""

# Headless, as root in a container, and without the background connections a closed network refuses.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=10000"]


def layout(page: Path, width: int, height: int, work: Path) -> dict:
    probed = work / f"probed-{width}.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={work / 'profile'}", f"--window-size={width},{height}",
                          "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def screenshot(page: Path, width: int, height: int, png: Path, work: Path) -> None:
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={work / 'profile'}", f"--window-size={width},{height}",
                    f"--screenshot={png}", page.as_uri()], capture_output=True, timeout=120, check=True)
