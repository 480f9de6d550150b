"""The alignment/uniformity decomposition of Sun and Li's Eq. (1), against hand computations."""

import math

import pytest
import torch
import torch.nn.functional as F

from euclip_cli.analysis.equilibrium import crossing, decompose, equilibrium_study, shuffled_order, temperature_grid
from euclip_cli.geometry import get_geometry

S = torch.tensor([[0.9, 0.1, -0.2],
                  [0.3, 0.8, 0.0],
                  [-0.1, 0.4, 0.7]])


def hand(s: list[list[float]], beta: float) -> list[tuple[float, float, float]]:
    """(A_i, U_i, ratio_i) of Eq. (1) written out: N_i sums the row's and the column's negatives."""
    out = []
    for i in range(len(s)):
        n = sum(math.exp(beta * s[i][j]) + math.exp(beta * s[j][i]) for j in range(len(s)) if j != i)
        out.append((-beta * s[i][i], math.log(n), math.exp(beta * s[i][i]) / n))
    return out


@pytest.mark.parametrize("beta", [1.0, 7.5])
def test_no_shuffle_matches_the_hand_computation_and_the_parts_sum_to_the_loss(beta):
    parts = decompose(S, beta)
    for i, (a, u, r) in enumerate(hand(S.tolist(), beta)):
        assert parts["align"][i].item() == pytest.approx(a, rel=1e-6)
        assert parts["uniform"][i].item() == pytest.approx(u, rel=1e-6)
        assert parts["ratio"][i].item() == pytest.approx(r, rel=1e-6)
    assert torch.allclose(parts["align"] + parts["uniform"], parts["loss"])
    # The same loss through cross-entropy: CE over [positive, negatives] is log(1 + 1/ratio).
    for i in range(3):
        negatives = [beta * S[i, j].item() for j in range(3) if j != i] + [beta * S[j, i].item() for j in range(3) if j != i]
        logits = torch.tensor([[beta * S[i, i].item(), *negatives]], dtype=torch.float64)
        ce = F.cross_entropy(logits, torch.tensor([0])).item()
        assert parts["ratio"][i].item() == pytest.approx(1 / math.expm1(ce), rel=1e-9)


def test_a_fully_shuffled_batch_matches_the_hand_computation():
    order = shuffled_order(3, 100, torch.Generator().manual_seed(0))
    assert sorted(order.tolist()) == [0, 1, 2] and all(order[i] != i for i in range(3))
    shuffled = S[:, order]  # image i now paired with caption order[i]
    parts = decompose(shuffled, 4.0)
    expected = hand([[S[i][order[j]].item() for j in range(3)] for i in range(3)], 4.0)
    for i, (a, u, r) in enumerate(expected):
        assert parts["align"][i].item() == pytest.approx(a, rel=1e-6)
        assert parts["uniform"][i].item() == pytest.approx(u, rel=1e-6)
        assert parts["ratio"][i].item() == pytest.approx(r, rel=1e-6)
    # Every positive is now a mismatch: each ratio is below the unshuffled one's.
    assert (parts["ratio"] < decompose(S, 4.0)["ratio"]).all()


@pytest.mark.parametrize("size,percent,moved", [(100, 10, 10), (100, 0, 0), (10, 5, 0), (7, 100, 7), (50, 20, 10)])
def test_shuffling_moves_exactly_the_asked_share_of_captions(size, percent, moved):
    order = shuffled_order(size, percent, torch.Generator().manual_seed(1))
    assert sorted(order.tolist()) == list(range(size))
    assert int((order != torch.arange(size)).sum()) == moved


def test_the_crossing_is_interpolated_in_log_log():
    grid = temperature_grid(1, 100, 9)
    assert grid[0] == pytest.approx(1) and grid[-1] == pytest.approx(100) and len(grid) == 9
    ratios = [(t / 13.0) ** 2 for t in grid]  # a straight line in log-log, through 1 at t = 13
    assert crossing(grid, ratios) == pytest.approx(13.0, rel=1e-9)
    assert crossing(grid, [0.1] * 9) is None


def test_noisier_batches_need_a_higher_temperature_on_aligned_embeddings():
    g = get_geometry("clip")
    gen = torch.Generator().manual_seed(0)
    image = g.embed(torch.randn(512, 32, generator=gen))
    text = g.embed(image + 0.5 * torch.randn(512, 32, generator=gen))
    study = equilibrium_study(g, image, text, None, [0, 20, 50], [64], temperature_grid(1, 1000, 40), batches=4)
    eq = [c["equilibrium_temperature"] for c in study["curves"]]
    assert None not in eq and eq[0] < eq[1] < eq[2]
