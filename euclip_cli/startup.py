"""What a euclip command imports before it starts working.

open_clip imports transformers (for its Hugging Face text towers) and timm imports wandb (for its own
training script's logging) whenever they are installed, and clip-benchmark and img2dataset install them:
about 1.1 s of the 4-5 s that every fresh euclip process (a study's commands, torchrun's ranks, a
SLURM job's steps) spends importing before it works. euclip uses neither while importing: transformers
only where a model has a Hugging Face text tower (``hf_text_towers`` makes open_clip able to build one),
wandb only for ``train.wandb`` (imported there). So the command line hides both from open_clip's first
import, and from nothing else; a library user's ``import euclip_cli`` changes no import at all.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

UNUSED_AT_IMPORT = ("transformers", "wandb")


class _OpenClipWithoutUnused:
    """A ``sys.meta_path`` entry that finds open_clip as Python would, and executes it with
    ``UNUSED_AT_IMPORT`` looking absent (``sys.modules[name] = None`` makes ``import name`` raise
    ImportError, which open_clip and timm take for "not installed"); it then removes itself."""

    def find_spec(self, name, path=None, target=None):
        if name != "open_clip":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            hidden = [n for n in UNUSED_AT_IMPORT if n not in sys.modules]
            sys.modules.update(dict.fromkeys(hidden))
            try:
                execute(module)
            finally:
                for n in hidden:
                    if n in sys.modules and sys.modules[n] is None:
                        del sys.modules[n]

        # On this spec's own loader instance, so that open_clip's __loader__ (its resources) stays Python's.
        spec.loader.exec_module = exec_module
        return spec


def hide_unused_from_open_clip() -> None:
    """Hide ``UNUSED_AT_IMPORT`` from open_clip's first import in this process (nothing, once it is imported)."""
    if "open_clip" not in sys.modules and not any(isinstance(f, _OpenClipWithoutUnused) for f in sys.meta_path):
        sys.meta_path.insert(0, _OpenClipWithoutUnused())


def hf_text_towers() -> None:
    """Make open_clip able to build Hugging Face text towers where its first import ran without
    transformers: ``open_clip.hf_model`` is executed again, in its own namespace, with transformers
    importable (a no-op where transformers is not installed or was there already)."""
    import open_clip.hf_model as hf

    if hf.transformers is None and importlib.util.find_spec("transformers") is not None:
        importlib.reload(hf)
