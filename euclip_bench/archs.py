"""The benchmarks' towers, registered through the ``euclip.archs`` entry point (pyproject.toml), as a
package of a user's own registers its towers: every euclip process, a bench's children included,
can build them by name (``model.arch=bench-vit``)."""

from euclip_cli.towers.archs import Arch, register

_BENCH_TEXT = dict(context_length=32, vocab_size=49408, width=256, heads=4, layers=6)

# The speed benchmark's model (``euclip bench train``), ~2.9 GFLOP per training sample.
register(Arch("bench-vit", 256, dict(image_size=64, patch_size=8, width=256, layers=6, head_width=64), _BENCH_TEXT))
# The data-path bench's model (``euclip bench feed``): bench-vit's inputs (64 px, context 32, so the same
# loaders) through towers so small that a step costs the host next to nothing, as on a very fast accelerator.
register(Arch("bench-feed", 32, dict(image_size=64, patch_size=16, width=32, layers=1, head_width=32),
              dict(context_length=32, vocab_size=49408, width=32, heads=1, layers=1)))
