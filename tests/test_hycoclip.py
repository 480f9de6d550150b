"""HyCoCLIP's loss (loss.kind = "hycoclip") against HyCoCLIP's own computation, on the same tensors.

``hycoclip_reference`` is ``HyCoCLIP.forward`` in PalAvik/hycoclip (hycoclip/models.py, with its
hycoclip/lorentz.py) written again, from the exponential map of the tangent vectors to the weighted
sum, with its own epsilons (1e-8 under every clamp) and its own formulas: the Lorentz distance from
the pairwise inner product, the exterior angle from the hyperbolic law of cosines, four cross-entropies
each a mean over its rows. euclip's objective in the hyperbolic geometry (d logit) must give its loss
and the gradients of every input, the logit scale and the curvature within 1e-6 in fp64. The same
comparison against HyCoCLIP's own module, run from its repository, is in
docs/measurements/2026-11-28-hycoclip/. Accumulation, the local loss and two processes are checked
in tests/test_accumulation.py and tests/test_distributed.py (their "hycoclip" variants).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from euclip_cli import config as C
from euclip_cli.geometry import get_geometry
from euclip_cli.loss import hycoclip_objective

BATCH, WIDTH = 8, 16
EPS = 1e-8  # HyCoCLIP's eps, in every clamp of its lorentz.py


def their_exp_map0(v, curv):
    r = curv.sqrt() * v.norm(dim=-1, keepdim=True)
    return torch.sinh(r.clamp(EPS, math.asinh(2**15))) * v / r.clamp_min(EPS)


def their_time(x, curv, keepdim):
    return (1 / curv + (x ** 2).sum(-1, keepdim=keepdim)).sqrt()


def their_distance(x, y, curv):
    inner = x @ y.T - their_time(x, curv, True) @ their_time(y, curv, True).T
    return torch.acosh((-curv * inner).clamp_min(1 + EPS)) / curv.sqrt()


def their_half_aperture(x, curv, min_radius=0.1):
    return torch.asin((2 * min_radius / (x.norm(dim=-1) * curv.sqrt() + EPS)).clamp(-1 + EPS, 1 - EPS))


def their_angle(x, y, curv):
    x_t, y_t = their_time(x, curv, False), their_time(y, curv, False)
    l = curv * ((x * y).sum(-1) - x_t * y_t)
    cos = (y_t + l * x_t) / (x.norm(dim=-1) * (l ** 2 - 1).clamp_min(EPS).sqrt() + EPS)
    return torch.acos(cos.clamp(-1 + EPS, 1 - EPS))


def hycoclip_reference(image, text, box_image, box_text, scale, curv, entail_weight=0.2, inter=0.7, intra=1.2):
    """HyCoCLIP.forward's loss on tangent vectors (what its encoders give before their exponential map)."""
    image, text, box_image, box_text = (their_exp_map0(v, curv) for v in (image, text, box_image, box_text))
    targets = torch.arange(image.shape[0])
    contrastive = 0.25 * (F.cross_entropy(-scale * their_distance(image, text, curv), targets)
                          + F.cross_entropy(-scale * their_distance(text, image, curv), targets)
                          + F.cross_entropy(-scale * their_distance(box_image, text, curv), targets)
                          + F.cross_entropy(-scale * their_distance(box_text, image, curv), targets))

    def cone(generic, specific, factor):
        return (their_angle(generic, specific, curv) - factor * their_half_aperture(generic, curv)).clamp_min(0).mean()

    entailment = 0.5 * (cone(text, image, inter) + cone(box_text, box_image, inter)
                        + cone(box_image, image, intra) + cone(box_text, text, intra))
    return contrastive + entail_weight * entailment


def leaves(seed=0, spread=0.6):
    """Four batches of tangent vectors, the logit scale beta and the curvature c, each a leaf in fp64. A box is
    drawn nearer the origin than its sample (it is the more general concept), so that some cones hold and
    some do not."""
    g = torch.Generator().manual_seed(seed)

    def batch(norm):
        v = torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64)
        return (v / v.norm(dim=-1, keepdim=True) * norm * (1 + spread * torch.rand(BATCH, 1, generator=g,
                                                                                    dtype=torch.float64)))

    tensors = [batch(1.2), batch(0.9), batch(0.8), batch(0.5)]  # image, text, box image, box text
    return [t.requires_grad_() for t in tensors] + [torch.tensor(8.0, dtype=torch.float64, requires_grad=True),
                                                    torch.tensor(1.3, dtype=torch.float64, requires_grad=True)]


def euclip_hycoclip(image, text, box_image, box_text, scale, curv, entail_weight=0.2):
    geometry = get_geometry("hyperbolic", logit="d")
    return hycoclip_objective(geometry, image, text, box_image, box_text, scale, curv, entail_weight, 0.1)["loss"]


def twin(tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_in_the_hyperbolic_geometry_it_is_hycoclips_loss_with_its_gradients(seed):
    ours = leaves(seed)
    theirs = twin(ours)
    mine, reference = euclip_hycoclip(*ours), hycoclip_reference(*theirs)
    torch.testing.assert_close(mine, reference, rtol=0, atol=1e-6)
    for a, b in zip(torch.autograd.grad(mine, ours), torch.autograd.grad(reference, theirs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_the_check_tells_a_wrong_loss_from_hycoclips():
    """The reference is sensitive to what HyCoCLIP fixes: its apertures swapped, a box's text paired with another
    box, or the entailment's weight left out each move the loss by far more than the tolerance."""
    ours = leaves(0)
    mine = euclip_hycoclip(*ours).item()
    # Some cones hold and some do not on these tensors, so each term has a part to play.
    with torch.no_grad():
        assert 0 < hycoclip_reference(*ours, entail_weight=1) - hycoclip_reference(*ours, entail_weight=0)
    for wrong in (hycoclip_reference(*ours, inter=1.2, intra=0.7),
                  hycoclip_reference(*ours[:3], ours[3].roll(1, 0), *ours[4:]),
                  hycoclip_reference(*ours, entail_weight=0)):
        assert abs(wrong.item() - mine) > 1e-3


def test_without_entailment_it_is_the_four_contrastive_terms_in_any_geometry():
    """HyCoCLIP's InfoNCE terms written out by hand as log-softmax rows, in the CLIP geometry (cosine logits)."""
    g = torch.Generator().manual_seed(3)
    image, text, box_image, box_text = (F.normalize(torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64), dim=-1)
                                        for _ in range(4))
    scale = torch.tensor(5.0, dtype=torch.float64)

    def rows(x, y):
        logits = scale * x @ y.T
        return -(logits.diagonal() - logits.exp().sum(-1).log()).mean()

    expected = 0.25 * (rows(image, text) + rows(text, image) + rows(box_image, text) + rows(box_text, image))
    got = hycoclip_objective(get_geometry("clip"), image, text, box_image, box_text, scale)
    torch.testing.assert_close(got["loss"], expected, rtol=0, atol=1e-12)
    assert set(got) == {"contrastive", "loss"}


def test_hycoclip_needs_the_box_data_euclips_loader_reads():
    assert C.load_config("tiny-hycoclip").loss.kind == "hycoclip"
    with pytest.raises(C.ConfigError, match="loss.kind: hycoclip trains on boxes"):
        C.load_config("tiny-hycoclip", ["data.dataset=datacomp-small"])
    with pytest.raises(C.ConfigError, match="not data.pipeline=openclip"):
        C.load_config("tiny-hycoclip", ["data.pipeline=openclip"])
