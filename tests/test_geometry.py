"""Math properties of every geometry: identities, limits, numerical safety, gradients."""

import math

import pytest
import torch

from euclip_cli.errors import UsageError
from euclip_cli.geometry import euclidean, get_geometry, list_geometries, lorentz

torch.manual_seed(0)

# Every (geometry, logit) pair the registry offers, and the geometries with entailment cones.
VARIANTS = [(name, logit) for name in list_geometries() for logit in get_geometry(name).logits]
WITH_CONES = [name for name in list_geometries() if get_geometry(name).has_entailment]


def embed(g, features):
    log_scale = torch.tensor(-0.5 * math.log(features.shape[-1]), dtype=features.dtype) if g.learned_scales else None
    return g.embed(features, log_scale)


def curv_for(g, dtype=torch.float32):
    return torch.tensor(1.0, dtype=dtype) if g.has_curvature else None


# Independent Lorentz-model formulas (MERU's section 3, written out in fp64), to check the library against.
def hand_exp0(v, c):
    """Space part of exp_O(v) = sinh(sqrt(c)|v|) / (sqrt(c)|v|) v."""
    r = math.sqrt(c) * v.norm(dim=-1, keepdim=True)
    return torch.sinh(r) / r * v


def hand_lorentz_dist(x, y, c):
    """d_L between every x (N, D) and y (M, D) given by their space parts: acosh(-c <x, y>_L) / sqrt(c)."""
    tx = torch.sqrt(1 / c + (x * x).sum(-1))
    ty = torch.sqrt(1 / c + (y * y).sum(-1))
    inner = x @ y.T - tx[:, None] * ty[None]
    return torch.acosh(-c * inner) / math.sqrt(c)


def test_registry_lists_the_study_geometries():
    from euclip_cli import geometry

    assert list_geometries() == geometry.names()  # every described geometry has its math, and back
    with pytest.raises(UsageError, match="unknown geometry"):
        get_geometry("poincare")
    with pytest.raises(UsageError, match="no logit"):
        get_geometry("clip", logit="d2")


# ---------------------------------------------------------------- identities

def test_lorentz_distance_from_origin_equals_tangent_norm():
    v = torch.randn(16, 8, dtype=torch.float64)
    for c in (0.1, 1.0, 3.0):
        curv = torch.tensor(c, dtype=torch.float64)
        origin = torch.zeros(1, 8, dtype=torch.float64)
        d = lorentz.pairwise_dist(lorentz.exp_map0(origin, curv), lorentz.exp_map0(v, curv), curv)[0]
        torch.testing.assert_close(d, v.norm(dim=-1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("c", [0.3, 1.0, 4.0])
def test_hyperbolic_logits_match_the_lorentz_distance_computed_by_hand(c):
    x, y = torch.randn(5, 8, dtype=torch.float64) * 0.7, torch.randn(7, 8, dtype=torch.float64) * 0.7
    curv = torch.tensor(c, dtype=torch.float64)
    expected = hand_lorentz_dist(hand_exp0(x, c), hand_exp0(y, c), c)
    torch.testing.assert_close(get_geometry("hyperbolic", "d").similarity(x, y, curv), -expected)
    torch.testing.assert_close(get_geometry("hyperbolic", "d2").similarity(x, y, curv), -expected.square())


def test_euclidean_distance_matches_cdist():
    x, y = torch.randn(6, 16, dtype=torch.float64), torch.randn(9, 16, dtype=torch.float64)
    torch.testing.assert_close(euclidean.pairwise_dist(x, y), torch.cdist(x, y))
    torch.testing.assert_close(euclidean.pairwise_sq_dist(x, y), torch.cdist(x, y) ** 2)


def test_euclidean_embedding_is_scaled_by_one_over_sqrt_n():
    f = torch.randn(4, 64)
    torch.testing.assert_close(get_geometry("euclidean").embed(f), f / 8)
    g = get_geometry("euclidean", "d2")
    z = g.embed(f)
    torch.testing.assert_close(g.similarity(z, z), -torch.cdist(f, f) ** 2 / 64, atol=1e-4, rtol=1e-4)


def test_elliptic_preserves_cosine_order():
    g_clip, g_ell = get_geometry("clip"), get_geometry("elliptic")
    x, y = g_clip.embed(torch.randn(10, 32)), g_clip.embed(torch.randn(50, 32))
    assert torch.equal(g_clip.similarity(x, y).argsort(dim=1), g_ell.similarity(x, y).argsort(dim=1))


def test_product_sphere_inner_is_the_sum_of_block_cosines():
    g = get_geometry("product-sphere", "inner", blocks=4)
    x, y = g.embed(torch.randn(3, 32)), g.embed(torch.randn(5, 32))
    blocks = [(x[:, i * 8:(i + 1) * 8] @ y[:, i * 8:(i + 1) * 8].T) for i in range(4)]
    torch.testing.assert_close(g.similarity(x, y), sum(blocks))
    for i in range(4):  # every block is a unit vector
        torch.testing.assert_close(x[:, i * 8:(i + 1) * 8].norm(dim=-1), torch.ones(3))
    geo = get_geometry("product-sphere", "geodesic", blocks=4)
    angles = torch.stack([torch.acos(b.clamp(-1, 1)) for b in blocks], -1)
    torch.testing.assert_close(geo.similarity(x, y), -angles.square().sum(-1).sqrt(), atol=1e-5, rtol=1e-5)


def test_euclidean_exterior_angle_equals_law_of_cosines():
    x, y = torch.randn(20, 8, dtype=torch.float64), torch.randn(20, 8, dtype=torch.float64)
    nx, ny, nxy = x.norm(dim=-1), y.norm(dim=-1), (x - y).norm(dim=-1)
    ganea = torch.acos((ny**2 - nx**2 - nxy**2) / (2 * nx * nxy))
    torch.testing.assert_close(euclidean.exterior_angle(x, y), ganea)


def test_hyperbolic_exterior_angle_equals_tangent_space_angle():
    """MERU's closed form against the angle between log-map directions in Minkowski space."""
    for c in (0.3, 1.0, 2.5):
        curv = torch.tensor(c, dtype=torch.float64)
        xs = lorentz.exp_map0(torch.randn(10, 5, dtype=torch.float64), curv)
        ys = lorentz.exp_map0(torch.randn(10, 5, dtype=torch.float64), curv)

        def lift(p):
            return torch.cat([p, lorentz.time_component(p, curv)[:, None]], -1)

        def mink(a, b):
            return (a[:, :-1] * b[:, :-1]).sum(-1) - a[:, -1] * b[:, -1]

        X, Y = lift(xs), lift(ys)
        O = torch.zeros_like(X)
        O[:, -1] = 1 / math.sqrt(c)
        to_y = Y + c * mink(X, Y)[:, None] * X  # tangent direction at X towards Y
        to_o = O + c * mink(X, O)[:, None] * X
        angle_oxy = torch.acos(mink(to_y, to_o) / (mink(to_y, to_y).sqrt() * mink(to_o, to_o).sqrt()))
        torch.testing.assert_close(lorentz.exterior_angle(xs, ys, curv), math.pi - angle_oxy, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- entailment limits

@pytest.mark.parametrize("name", WITH_CONES)
def test_entailment_is_zero_on_the_ray_beyond_the_apex(name):
    g = get_geometry(name)
    x = torch.randn(8, 16) * 0.5
    y = x * torch.linspace(1.5, 4.0, 8)[:, None]  # same direction, farther from the origin
    assert torch.all(g.entailment(x, y, 0.1, curv_for(g)) == 0)


def test_euclidean_exterior_angle_is_pi_at_the_origin():
    x = torch.randn(5, 8, dtype=torch.float64)
    torch.testing.assert_close(euclidean.exterior_angle(x, torch.zeros_like(x)), torch.full((5,), math.pi, dtype=torch.float64),
                               atol=1e-3, rtol=0)


def test_aperture_is_a_right_angle_inside_the_minimum_radius():
    x = torch.randn(6, 8)
    x = 0.3 * x / x.norm(dim=-1, keepdim=True) * torch.rand(6, 1)  # ||x|| < K = 0.3
    assert torch.all(euclidean.half_aperture(x, 0.3) == math.pi / 2)
    curv = torch.tensor(1.0)
    assert torch.all(lorentz.half_aperture(x, curv, 0.3) == math.pi / 2)  # 2K/(sqrt(c)||x||) > 1 too
    far = torch.full((1, 8), 10.0)
    torch.testing.assert_close(euclidean.half_aperture(far, 0.3), torch.asin(torch.tensor([0.3 / far.norm()])))


def test_entailment_grows_with_the_angle_outside_the_cone():
    x = torch.tensor([[2.0, 0.0]])
    angles = torch.linspace(0.6, 2.5, 5)
    y = x + torch.stack([angles.cos(), angles.sin()], -1)  # unit steps from x at growing exterior angles
    loss = euclidean.entailment(x.expand(5, 2), y, 1.0)  # aperture asin(0.5) = 0.52
    assert torch.all(loss[1:] > loss[:-1])
    torch.testing.assert_close(loss, angles - math.asin(0.5), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", [n for n in list_geometries() if n not in WITH_CONES])
def test_geometries_without_cones_refuse_an_entailment_loss(name):
    with pytest.raises(ValueError, match="no entailment"):
        get_geometry(name, blocks=2).entailment(torch.randn(2, 4), torch.randn(2, 4), 0.1)


# ---------------------------------------------------------------- numerical safety

def _hard_inputs(dim=16):
    base = torch.randn(4, dim)
    return {
        "identical": (base, base.clone()),
        "zeros": (torch.zeros(4, dim), torch.zeros(4, dim)),
        "zero vs random": (torch.zeros(4, dim), base),
        "huge norms": (base * 1e4, base * 1e4 + 1),
    }


@pytest.mark.parametrize("name,logit", VARIANTS)
@pytest.mark.parametrize("case", list(_hard_inputs()))
def test_finite_values_and_gradients_at_hard_inputs(name, logit, case):
    g = get_geometry(name, logit, blocks=4)
    a, b = (t.clone().requires_grad_(True) for t in _hard_inputs()[case])
    x, y = embed(g, a), embed(g, b)
    curv = curv_for(g)
    out = g.similarity(x, y, curv).sum()
    if g.has_entailment:
        out = out + g.entailment(x, y, 0.1, curv).sum()
    out.backward()
    assert torch.isfinite(out)
    assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()


@pytest.mark.parametrize("name,logit", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_loss_under_autocast_on_low_precision_features_matches_fp64(name, logit, dtype):
    """Encoders under autocast emit bf16/fp16 features; embedding and loss (as the model runs them,
    inside the autocast region) must compute in fp32, so they match an fp64 computation on the same
    rounded features to fp32 accuracy, with finite gradients. Computing in bf16 would miss by ~1e-2."""
    from euclip_cli.loss import at_least_fp32, objective

    g = get_geometry(name, logit, blocks=4)
    gen = torch.Generator().manual_seed(3)
    image = (torch.randn(8, 16, generator=gen) * 3).to(dtype).requires_grad_(True)
    text = (torch.randn(8, 16, generator=gen) * 3).to(dtype).requires_grad_(True)
    weight = 0.2 if g.has_entailment else 0.0

    def loss(img, txt, precise):
        curv = curv_for(g, torch.float64 if precise else torch.float32)
        scale = torch.tensor(10.0, dtype=torch.float64 if precise else torch.float32)
        if precise:
            return objective(g, embed(g, img.double()), embed(g, txt.double()), scale, curv, weight)["loss"]
        with torch.autocast("cpu", dtype=dtype):
            with torch.autocast("cpu", enabled=False):  # the model's embedding step (EuclipModel._embed)
                zi, zt = embed(g, at_least_fp32(img)), embed(g, at_least_fp32(txt))
            return objective(g, zi, zt, scale, curv, weight)["loss"]

    low = loss(image, text, precise=False)
    assert low.dtype == torch.float32 and torch.isfinite(low)
    reference = loss(image.detach(), text.detach(), precise=True)
    assert low.item() == pytest.approx(reference.item(), rel=1e-5, abs=1e-5)
    low.backward()
    assert torch.isfinite(image.grad).all() and torch.isfinite(text.grad).all()


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize("name,logit", VARIANTS)
def test_gradcheck_similarity_fp64(name, logit):
    g = get_geometry(name, logit, blocks=2)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    curv = torch.tensor(0.8, dtype=torch.float64, requires_grad=True) if g.has_curvature else None
    log_scale = torch.tensor(-0.5, dtype=torch.float64, requires_grad=True) if g.learned_scales else None
    inputs = tuple(t for t in (x, y, curv, log_scale) if t is not None)

    def f(*args):
        x, y = args[0], args[1]
        c = args[2] if curv is not None else None
        s = args[-1] if log_scale is not None else None
        return g.similarity(g.embed(x, s), g.embed(y, s), c)

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("name", WITH_CONES)
def test_gradcheck_entailment_fp64(name):
    g = get_geometry(name)
    x = (torch.randn(5, 6, dtype=torch.float64) * 0.3).requires_grad_(True)
    y = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    curv = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y, c: g.entailment(x, y, 0.1, c if g.has_curvature else None), (x, y, curv))


# ---------------------------------------------------------------- what evaluation and analysis use

def test_clip_prototypes_follow_normalize_average_renormalize():
    g = get_geometry("clip")
    raw = torch.randn(5, 7, 32)  # classes, templates, dim
    emb = g.embed(raw.reshape(-1, 32)).reshape(5, 7, 32)
    mean = (raw / raw.norm(dim=-1, keepdim=True)).mean(1)
    torch.testing.assert_close(g.prototypes(emb), mean / mean.norm(dim=-1, keepdim=True))


def test_hyperbolic_zero_shot_logits_follow_the_authors_classifier():
    """The authors' zero-shot classifier for hyperbolic models averages the alpha-scaled text features
    of a class's templates, lifts the mean with exp_O, and scores images by -d_L; computed here by hand."""
    g = get_geometry("hyperbolic")
    c, log_alpha = 0.6, torch.tensor(-1.2, dtype=torch.float64)
    text = torch.randn(3, 4, 8, dtype=torch.float64)  # classes, templates, encoder dim
    images = torch.randn(5, 8, dtype=torch.float64)
    classifier = hand_exp0(text.mul(log_alpha.exp()).mean(1), c)
    expected = -hand_lorentz_dist(hand_exp0(images * log_alpha.exp(), c), classifier, c)
    prototypes = g.prototypes(g.embed(text.reshape(-1, 8), log_alpha).reshape(3, 4, 8))
    got = g.similarity(g.embed(images, log_alpha), prototypes, torch.tensor(c, dtype=torch.float64))
    torch.testing.assert_close(got, expected)


def hand_distance_to_root(name, z, c=1.0, blocks=4):
    """Each geometry's distance from [ROOT], computed from first principles in fp64."""
    if name == "euclidean":
        return torch.cdist(z, torch.zeros(1, z.shape[1], dtype=z.dtype))[:, 0]
    if name == "hyperbolic":
        return hand_lorentz_dist(hand_exp0(z, c), torch.zeros(1, z.shape[1], dtype=z.dtype), c)[:, 0]
    mean = z.mean(0)
    if name == "product-sphere":
        parts = [z.reshape(len(z), blocks, -1)[:, i] for i in range(blocks)]
        centres = mean.reshape(blocks, -1)
        angles = [torch.acos((p @ (m / m.norm())).clamp(-1, 1)) for p, m in zip(parts, centres)]
        return torch.stack(angles, -1).square().sum(-1).sqrt()
    return torch.acos((z @ (mean / mean.norm())).clamp(-1, 1))  # the arc to the normalized mean


@pytest.mark.parametrize("name", list_geometries())
def test_distance_to_root_matches_a_computation_from_first_principles(name):
    g = get_geometry(name, blocks=4)
    z = embed(g, torch.randn(50, 16, dtype=torch.float64))
    d = g.distance_to_root(z, g.root(z), curv_for(g, torch.float64))
    assert d.shape == (50,) and torch.all(d >= 0)
    torch.testing.assert_close(d, hand_distance_to_root(name, z))


def hand_plotted_distance(name, z, c=1.0, blocks=4):
    """The papers' plotted distance from [ROOT] (EuCLIP Fig. 2, MERU Fig. 4), written out in fp64."""
    if name == "euclidean":
        return z.norm(dim=1)
    if name == "hyperbolic":
        return torch.sinh(math.sqrt(c) * z.norm(dim=1)) / math.sqrt(c)  # ||x_space|| of exp_O(z)
    mean = z.mean(0)
    if name == "product-sphere":
        parts = z.reshape(len(z), blocks, -1)
        centres = mean.reshape(blocks, -1)
        cosines = torch.stack([parts[:, i] @ (centres[i] / centres[i].norm()) for i in range(blocks)], -1)
        return 0.5 * (1 - cosines.mean(-1))
    return 0.5 * (1 - z @ (mean / mean.norm()))


@pytest.mark.parametrize("name", list_geometries())
def test_plotted_distance_to_root_is_the_papers_axis(name):
    g = get_geometry(name, blocks=4)
    z = embed(g, torch.randn(50, 16, dtype=torch.float64))
    d = g.plotted_distance_to_root(z, g.root(z), curv_for(g, torch.float64))
    torch.testing.assert_close(d, hand_plotted_distance(name, z))
    if g.facts.root == "mean":
        assert torch.all((d >= 0) & (d <= 1))  # the papers' [0, 1] scale
        at_root = g.plotted_distance_to_root(g.project(g.root(z))[None], g.root(z))
        torch.testing.assert_close(at_root, torch.zeros(1, dtype=torch.float64))


@pytest.mark.parametrize("name", WITH_CONES)
def test_entails_is_the_zero_set_of_the_loss_and_broadcasts(name):
    g = get_geometry(name)
    texts = torch.randn(4, 8) * 0.5
    images = torch.cat([texts * 3, -texts * 3])  # on the rays beyond the texts, and opposite them
    curv = curv_for(g)
    pairs = g.entails(texts[:, None], images[None], 0.1, curv)
    assert pairs.shape == (4, 8) and pairs.dtype == torch.bool
    assert torch.all(pairs[torch.arange(4), torch.arange(4)])  # each text entails its own ray
    assert not torch.any(pairs[torch.arange(4), torch.arange(4) + 4])  # and not the opposite point


@pytest.mark.parametrize("offset,inside", [(-0.05, True), (0.05, False)])
def test_euclidean_cone_test_turns_at_the_half_aperture(offset, inside):
    """A point reached from x at exterior angle aper(x) - 0.05 is inside the cone; at + 0.05 it is not."""
    g = get_geometry("euclidean")
    x = torch.tensor([[3.0, 0.0]], dtype=torch.float64)
    aperture = math.asin(0.5 / 3.0)  # K = 0.5, ||x|| = 3
    angle = aperture + offset
    y = x + 2.0 * torch.tensor([[math.cos(angle), math.sin(angle)]], dtype=torch.float64)
    assert bool(g.entails(x, y, 0.5)[0]) is inside
