"""Isotropy measures and linear transforms of embedding sets (the isotropy paper, section 3).

Pure functions on ``(n, d)`` matrices, computed in float64: the partition function sums
exponentials of inner products, and whitening divides by singular values.
"""

from __future__ import annotations

import torch


SIGNS = ("one", "both")


def partition_isotropy(w: torch.Tensor, signs: str = "one") -> tuple[float, float]:
    """``(I1, I2)`` of ``w (n, d)``: Z(v) = sum_i exp(<v, w_i>) over the eigenvectors v of WᵀW.

    I1 = min Z / max Z (1 when isotropic); I2 = std(Z) / mean(Z) over the eigenvectors (0 when isotropic).
    An eigenvector's sign is arbitrary and Z(v) != Z(-v). ``signs="one"`` is the paper's set E, one
    vector per eigenvalue; the paper leaves the sign to its solver, so here each vector's largest
    coordinate is made positive (sklearn's ``svd_flip`` rule), which makes the value reproducible.
    ``signs="both"`` holds both signs of each: well defined without a rule, and unchanged by a
    rotation of ``w``, but not comparable with the paper's Table 1.
    """
    if signs not in SIGNS:
        raise ValueError(f"signs must be one of {SIGNS}, not {signs!r}")
    w = w.double()
    _, vectors = torch.linalg.eigh(w.T @ w)  # columns: orthonormal eigenvectors
    largest = vectors.gather(0, vectors.abs().argmax(dim=0, keepdim=True))  # (1, d)
    vectors = vectors * largest.sign()
    if signs == "both":
        vectors = torch.cat([vectors, -vectors], dim=1)
    z = torch.exp(w @ vectors).sum(dim=0)  # (|E|,)
    i1 = (z.min() / z.max()).item()
    i2 = torch.sqrt(((z - z.mean()) ** 2).sum() / (len(z) * z.mean() ** 2)).item()
    return i1, i2


def singular_values(w: torch.Tensor, center: bool) -> torch.Tensor:
    """``(min(n, d),)`` singular values of ``w``, optionally after subtracting the mean row."""
    w = w.double()
    return torch.linalg.svdvals(w - w.mean(dim=0) if center else w)


def fit_whitening(w: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Whitening-k (Su et al.): ``(mean (d,), projection (d, k))`` giving unit covariance on ``w``.

    Keeps the top k principal directions, each divided by its standard deviation.
    """
    w = w.double()
    mean = w.mean(dim=0)
    _, s, vt = torch.linalg.svd(w - mean, full_matrices=False)
    std = s[:k] / (len(w) - 1) ** 0.5
    # Directions with no variance cannot be whitened; eps keeps the division finite.
    return mean, vt[:k].T / std.clamp_min(1e-12)


def fit_pca(w: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """PCA-k: ``(mean (d,), projection (d, k))`` onto the top k principal directions (no rescaling)."""
    w = w.double()
    mean = w.mean(dim=0)
    _, _, vt = torch.linalg.svd(w - mean, full_matrices=False)
    return mean, vt[:k].T


def apply_linear(w: torch.Tensor, mean: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    return (w.double() - mean) @ projection


def fit_procrustes(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The orthogonal ``(d, d)`` matrix Ω minimising ||AΩ − B||_F (rows of A and B are pairs)."""
    u, _, vt = torch.linalg.svd(a.double().T @ b.double())
    return u @ vt


def fit_lstsq(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The ``(d, d)`` matrix Ω minimising ||AΩ − B||_F without constraint."""
    return torch.linalg.lstsq(a.double(), b.double()).solution


def clip_loss(image: torch.Tensor, text: torch.Tensor, scale: float, batch: int) -> float:
    """The symmetric CLIP loss of unit-normalized pairs ``(n, d), (n, d)`` at logit scale ``scale``.

    The mean over consecutive batches of ``batch`` pairs (a last, smaller batch is dropped):
    the loss grows with the batch, so batches of one size keep values comparable.
    """
    losses = []
    for start in range(0, len(image) - batch + 1, batch):
        logits = scale * image[start:start + batch].double() @ text[start:start + batch].double().T
        target = torch.arange(len(logits))
        losses.append((torch.nn.functional.cross_entropy(logits, target)
                       + torch.nn.functional.cross_entropy(logits.T, target)).item() / 2)
    if not losses:
        raise ValueError(f"clip_loss needs at least {batch} pairs, got {len(image)}")
    return sum(losses) / len(losses)
