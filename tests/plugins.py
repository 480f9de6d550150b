"""An installed distribution of a user's own, made on disk for a fresh process to find: its one module and
the entry point that names it, as pip would leave them in site-packages."""

from pathlib import Path


def installed_plugin(site: Path, module: str, source: str, group: str) -> dict:
    """Write ``module``.py holding ``source`` and a ``module``-0.1.dist-info naming it under the entry point
    ``group`` into ``site``; returns the environment (``PYTHONPATH=site``) in which euclip finds it."""
    import os

    info = site / f"{module}-0.1.dist-info"
    info.mkdir(parents=True)
    (site / f"{module}.py").write_text(source)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\ntoy = {module}\n")
    return dict(os.environ, PYTHONPATH=str(site))
