"""The ``euclip`` and ``euclip-bench`` entry points (and ``python -m euclip_cli``): each command line started
stoppable (``stops.launch``) before its own imports. Standard library and ``stops`` only, until launched."""

from __future__ import annotations

from euclip_cli.cli import stops


def euclip() -> None:
    """The ``euclip`` command line (and ``python -m euclip_cli``)."""

    def load():
        from euclip_cli.cli.main import main

        return main

    stops.launch(load)


def euclip_bench() -> None:
    """The ``euclip-bench`` command line."""

    def load():
        from euclip_bench.cli import main

        return main

    stops.launch(load)
