"""Isotropy measures and transforms on point sets whose answers are known."""

import pytest
import torch

import math

from euclip_cli.analysis.isotropy import (apply_linear, clip_loss, fit_lstsq, fit_pca, fit_procrustes, fit_whitening,
                                          partition_isotropy, singular_values)
from euclip_cli.analysis.studies import fit_maps


def test_a_symmetric_cross_is_perfectly_isotropic():
    d = 8
    cross = torch.cat([torch.eye(d), -torch.eye(d)])  # ±e_i: every direction of the basis looks the same
    for signs in ("one", "both"):
        i1, i2 = partition_isotropy(cross, signs)
        assert abs(i1 - 1) < 1e-12 and abs(i2) < 1e-12


def _measures(z: list[float]) -> tuple[float, float]:
    mean = sum(z) / len(z)
    return min(z) / max(z), math.sqrt(sum((v - mean) ** 2 for v in z) / (len(z) * mean ** 2))


def test_i1_i2_by_hand_under_both_conventions():
    # WᵀW = diag(4, 2): the eigenvectors are the axes, and the sign rule makes each +e_i.
    w = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    e = math.e
    z_plus = [e ** 2 + 2, 1 + e + 1 / e]  # Z(e1) = sum exp(<e1, w_i>), Z(e2)
    z_minus = [e ** -2 + 2, 1 + e + 1 / e]  # Z(-e1), Z(-e2)
    for signs, z in (("one", z_plus), ("both", z_plus + z_minus)):
        i1, i2 = partition_isotropy(w, signs)
        assert (i1, i2) == pytest.approx(_measures(z), rel=1e-12)


def test_one_sign_is_fixed_by_the_rule_not_by_the_solver():
    # Flipping the data's first axis flips which sign of e1 the data lean towards; the rule still
    # takes +e1, so Z(e1) is now e^-2 + 2.
    w = torch.tensor([[-2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    e = math.e
    assert partition_isotropy(w, "one") == pytest.approx(_measures([e ** -2 + 2, 1 + e + 1 / e]), rel=1e-12)


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
    before, after = partition_isotropy(w, "both"), partition_isotropy(w @ rotation, "both")
    assert after[0] == pytest.approx(before[0], rel=1e-9) and after[1] == pytest.approx(before[1], rel=1e-9)


def test_whitening_fitted_per_modality_whitens_each_on_its_own_data():
    gen = torch.Generator().manual_seed(4)
    image = torch.randn(300, 5, generator=gen, dtype=torch.float64) @ torch.randn(5, 5, generator=gen,
                                                                                   dtype=torch.float64) + 1
    text = torch.randn(300, 5, generator=gen, dtype=torch.float64) * torch.tensor([3.0, 1, 1, 0.5, 0.2]) - 2
    on_image, on_text = fit_maps(lambda w: fit_whitening(w, 5), True, image, text)
    identity = torch.eye(5, dtype=torch.float64)
    torch.testing.assert_close(torch.cov(on_image(image).T), identity, atol=1e-10, rtol=0)
    torch.testing.assert_close(torch.cov(on_text(text).T), identity, atol=1e-10, rtol=0)
    shared, same = fit_maps(lambda w: fit_whitening(w, 5), False, image, text)
    assert shared is same  # one map for both
    torch.testing.assert_close(torch.cov(shared(torch.cat([image, text])).T), identity, atol=1e-10, rtol=0)
    assert not torch.allclose(torch.cov(shared(image).T), identity, atol=0.1)


def test_clip_loss_matches_a_written_out_cross_entropy():
    gen = torch.Generator().manual_seed(5)
    image = torch.nn.functional.normalize(torch.randn(7, 4, generator=gen, dtype=torch.float64), dim=1)
    text = torch.nn.functional.normalize(torch.randn(7, 4, generator=gen, dtype=torch.float64), dim=1)
    scale = 10.0

    def by_hand(a, b):
        total = 0.0
        for i in range(len(a)):
            row = [scale * float(a[i] @ b[j]) for j in range(len(b))]
            col = [scale * float(a[j] @ b[i]) for j in range(len(a))]
            total += (math.log(sum(map(math.exp, row))) - row[i]) + (math.log(sum(map(math.exp, col))) - col[i])
        return total / (2 * len(a))

    assert clip_loss(image, text, scale, 7) == pytest.approx(by_hand(image, text), rel=1e-12)
    # Batches of 3: two full batches (the seventh pair is dropped), averaged.
    halves = (by_hand(image[:3], text[:3]) + by_hand(image[3:6], text[3:6])) / 2
    assert clip_loss(image, text, scale, 3) == pytest.approx(halves, rel=1e-12)
    with pytest.raises(ValueError):
        clip_loss(image, text, scale, 8)
