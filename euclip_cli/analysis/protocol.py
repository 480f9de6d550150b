"""The analyses' two protocols: the papers' procedures (``paper``, the default) and euclip's own.

Each field is one choice where the published procedure and euclip's alternative differ;
docs/analyses.md tabulates them with the reasons. Torch-free, so the CLI can list them.
"""

from __future__ import annotations

from dataclasses import dataclass

from euclip_cli.errors import UsageError


@dataclass(frozen=True)
class Protocol:
    name: str
    # [ROOT] of mean-rooted geometries (CLIP, elliptic, product sphere): the L2-normalised mean of
    # training embeddings (papers), or the plain mean of the pairs analysed (euclip).
    root_from_training: bool
    # [ROOT] is a candidate caption of every traversal step and is not counted (papers).
    root_in_pool: bool
    # Distances from [ROOT] on the papers' axes (0.5 (1 - cos), ||x_space||) instead of geodesics.
    plotted_distances: bool
    # I1/I2 over one sign of each eigenvector (papers) or both.
    eigenvector_signs: str
    # Centering and whitening fitted on each modality's own embeddings (papers) or on both together.
    fit_each_modality: bool


PROTOCOLS = {
    "paper": Protocol("paper", root_from_training=True, root_in_pool=True, plotted_distances=True,
                      eigenvector_signs="one", fit_each_modality=True),
    "euclip": Protocol("euclip", root_from_training=False, root_in_pool=False, plotted_distances=False,
                       eigenvector_signs="both", fit_each_modality=False),
}


def protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise UsageError(f"--protocol '{name}' is not one of {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]
