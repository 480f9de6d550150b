"""Isotropy measures and transforms on point sets whose answers are known."""

import pytest
import torch

from euclip_cli.analysis.isotropy import (apply_linear, fit_lstsq, fit_pca, fit_procrustes, fit_whitening,
                                          partition_isotropy, singular_values)


def test_a_symmetric_cross_is_perfectly_isotropic():
    d = 8
    cross = torch.cat([torch.eye(d), -torch.eye(d)])  # ±e_i: every direction of the basis looks the same
    i1, i2 = partition_isotropy(cross)
    assert abs(i1 - 1) < 1e-12 and abs(i2) < 1e-12


def test_a_stretched_cloud_is_anisotropic():
    gen = torch.Generator().manual_seed(0)
    cloud = torch.randn(500, 8, generator=gen) * torch.tensor([5.0] + [0.2] * 7) + 1.0
    i1, i2 = partition_isotropy(torch.nn.functional.normalize(cloud, dim=1))
    assert i1 < 0.5 and i2 > 0.1


def test_whitening_gives_identity_covariance_and_pca_keeps_the_top_directions():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(400, 6, generator=gen) @ torch.randn(6, 6, generator=gen) + 3
    mean, proj = fit_whitening(w, 4)
    white = apply_linear(w, mean, proj)
    torch.testing.assert_close(torch.cov(white.T), torch.eye(4, dtype=torch.float64), atol=1e-10, rtol=0)
    mean, proj = fit_pca(w, 2)
    reduced = apply_linear(w, mean, proj)
    variances = torch.linalg.svdvals(w.double() - w.double().mean(0)) ** 2 / (len(w) - 1)
    torch.testing.assert_close(torch.var(reduced, dim=0), variances[:2])


def test_procrustes_recovers_a_planted_rotation_and_lstsq_a_planted_map():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(300, 5, generator=gen, dtype=torch.float64)
    rotation, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))
    torch.testing.assert_close(fit_procrustes(a, a @ rotation), rotation)
    linear = torch.randn(5, 5, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(fit_lstsq(a, a @ linear), linear)


def test_centering_removes_the_mean_direction_from_the_spectrum():
    w = torch.ones(10, 3) * torch.tensor([1.0, 2.0, 3.0])  # every row the same point
    assert singular_values(w, center=False)[0] > 1 and singular_values(w, center=True).abs().max() < 1e-9


def test_isotropy_measures_do_not_change_under_a_rotation():
    gen = torch.Generator().manual_seed(3)
    w = torch.nn.functional.normalize(torch.randn(300, 6, generator=gen, dtype=torch.float64) + 0.5, dim=1)
    rotation, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    before, after = partition_isotropy(w), partition_isotropy(w @ rotation)
    assert after[0] == pytest.approx(before[0], rel=1e-9) and after[1] == pytest.approx(before[1], rel=1e-9)
