"""The contrastive loss's "equilibrium" (Sun and Li, section 2.1 and Figure 1).

For a batch of B pairs with similarities s (``Geometry.similarity``, higher = closer, so the paper's
distance is d = -s) and a temperature beta, Eq. (1) of the paper splits each positive pair's loss
into an alignment part and a uniformity part:

    L_i = -log( e^{beta s_ii} / N_i ) = A_i + U_i,   A_i = -beta s_ii,   U_i = log N_i,
    N_i = sum_{j != i} e^{beta s_ij} + sum_{j != i} e^{beta s_ji}

(the negatives of image i among the captions and of caption i among the images, the positive
itself excluded, as the paper's N). The paper plots the ratio of the two terms inside the log,
e^{beta s_ii} / N_i = e^{-L_i}, averaged over the positive pairs: 1 is the equilibrium, where
Eq. (1) is 0. Batches are drawn from the run's training pairs with P% of their captions
shuffled among themselves, the paper's noise.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from euclip_cli.geometry import Geometry


def decompose(similarity: torch.Tensor, beta: float) -> dict[str, torch.Tensor]:
    """Eq. (1) per positive pair. ``(B, B)`` similarities, row i an image, column j a caption, the
    positives on the diagonal -> ``{"align", "uniform", "loss", "ratio"}``, each ``(B,)``, in fp64."""
    s = similarity.double() * beta
    b = s.shape[0]
    diagonal = torch.eye(b, dtype=torch.bool, device=s.device)
    negatives = s.masked_fill(diagonal, float("-inf"))
    # Both directions' negatives in one logsumexp: row i (image i against other captions) and column i.
    uniform = torch.logsumexp(torch.cat([negatives, negatives.T], dim=1), dim=1)
    align = -s.diagonal()
    loss = align + uniform
    return {"align": align, "uniform": uniform, "loss": loss, "ratio": torch.exp(-loss)}


def shuffled_order(size: int, percent: float, generator: torch.Generator) -> torch.Tensor:
    """A caption order for a batch with ``percent``% of its captions moved to other images. ``-> (size,)``.

    The chosen rows pass their captions round a cycle, so every chosen row gets another row's
    caption (a random permutation would leave some in place); fewer than two chosen rows cannot
    be shuffled and leave the batch as it is.
    """
    order = torch.arange(size)
    count = round(size * percent / 100)
    if count < 2:
        return order
    chosen = torch.randperm(size, generator=generator)[:count]
    order[chosen] = chosen.roll(1)
    return order


def temperature_grid(low: float, high: float, points: int) -> list[float]:
    """``points`` temperatures from ``low`` to ``high``, evenly spaced in log."""
    if points == 1:
        return [low]
    step = (math.log(high) - math.log(low)) / (points - 1)
    return [math.exp(math.log(low) + i * step) for i in range(points)]


def crossing(temperatures: list[float], ratios: list[float]) -> Optional[float]:
    """The temperature at which the mean ratio first reaches 1 going up the grid, interpolated in
    log-log, or None where it never does in the grid."""
    for i in range(1, len(temperatures)):
        below, above = ratios[i - 1], ratios[i]
        if below < 1 <= above and below > 0:
            lt0, lt1 = math.log(temperatures[i - 1]), math.log(temperatures[i])
            w = -math.log(below) / (math.log(above) - math.log(below))
            return math.exp(lt0 + w * (lt1 - lt0))
    return temperatures[0] if ratios and ratios[0] >= 1 else None


@torch.no_grad()
def equilibrium_study(g: Geometry, image: torch.Tensor, text: torch.Tensor, curv: Optional[torch.Tensor],
                      percents: list[float], batch_sizes: list[int], temperatures: list[float], batches: int,
                      seed: int = 0) -> dict:
    """The mean ratio (and A, U, L) against temperature, per shuffle percentage and batch size.

    ``image, text (N, D)``: output-space embeddings of N >= max(batch_sizes) pairs. Each of
    ``batches`` batches draws its pairs without replacement from the N; the same batches serve
    every percentage and temperature, so the curves differ only by the noise and the temperature.
    """
    gen = torch.Generator().manual_seed(seed)
    curves = []
    for size in batch_sizes:
        draws = [torch.randperm(len(image), generator=gen)[:size] for _ in range(batches)]
        for percent in percents:
            orders = [shuffled_order(size, percent, gen) for _ in draws]
            sims = [g.similarity(image[rows], text[rows][order], curv) for rows, order in zip(draws, orders)]
            points = []
            for beta in temperatures:
                parts = [decompose(s, beta) for s in sims]
                # The paper's statistic per batch (the mean over its positive pairs), then over batches.
                per_batch = {k: torch.stack([p[k].mean() for p in parts]) for k in ("ratio", "align", "uniform", "loss")}
                points.append({"temperature": beta, **{k: v.mean().item() for k, v in per_batch.items()},
                               "ratio_sd": per_batch["ratio"].std().item() if batches > 1 else 0.0})
            curves.append({"shuffle_percent": percent, "batch_size": size, "points": points,
                           "equilibrium_temperature": crossing(temperatures, [p["ratio"] for p in points])})
    return {"curves": curves, "batches": batches, "pairs": len(image), "geometry": g.name, "logit": g.logit}
