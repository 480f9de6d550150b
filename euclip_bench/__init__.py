"""euclip's benchmarks, beside the product as timm keeps its ``benchmark.py``: ``euclip-bench`` (or its
alias ``euclip bench``) times euclip's trainer, loaders, decoders and kernels against their references
(OpenCLIP's trainer and pipeline, PIL, the device's peak) in one run, and prints the ratios.

``measure``: the trainers, text towers, loaders and profiler; ``feed``: the data path alone;
``decode``: JPEG decoders; ``ops``: operator counts; ``archs``: the bench models, registered through
the ``euclip.archs`` entry point; ``cli``: the commands.
"""
