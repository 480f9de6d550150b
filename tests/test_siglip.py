"""SigLIP's sigmoid loss (loss.kind = "siglip") against open_clip's own SigLipLoss, on the same tensors.

In the CLIP geometry euclip's objective on the global batch must be open_clip's loss: on one process,
and on two gloo processes in each of open_clip's ways of meeting the other rank's texts (all-gather,
and the neighbour exchanges 'bidir' and 'shift'), whose per-rank losses and gradients, averaged over
the ranks as DDP averages them, are the global batch's. fp64, loss and every gradient within 1e-6
(they agree to rounding). Accumulation, the local loss and two-process training with SigLIP are in
tests/test_accumulation.py and tests/test_distributed.py (their "siglip" variants).
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from open_clip.loss import SigLipLoss

from euclip_cli import config as C
from euclip_cli.geometry import get_geometry
from euclip_cli.loss import objective
from euclip_cli.model import EuclipModel

BATCH, WIDTH = 8, 16
IMPLS = ("gather", "bidir", "shift")


def leaves(seed: int = 0):
    """Raw features (the towers' outputs), the logit scale beta and the bias b, each a leaf in fp64."""
    g = torch.Generator().manual_seed(seed)
    image = torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64).requires_grad_()
    text = torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64).requires_grad_()
    scale = torch.tensor(10.0, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-10.0, dtype=torch.float64, requires_grad=True)
    return image, text, scale, bias


def euclip_siglip(image, text, scale, bias):
    """euclip's objective in the CLIP geometry, as the trainer calls it (embeddings from the geometry's own map)."""
    geometry = get_geometry("clip", logit="cos")
    return objective(geometry, geometry.embed(image, None), geometry.embed(text, None), scale, logit_bias=bias)["loss"]


def grads(loss, tensors):
    return [g.clone() for g in torch.autograd.grad(loss, tensors)]


def test_on_one_process_it_is_open_clips_siglip_loss_with_its_gradients():
    ours = leaves()
    theirs = [t.detach().clone().requires_grad_() for t in ours]
    mine = euclip_siglip(*ours)
    image, text, scale, bias = theirs
    reference = SigLipLoss()(F.normalize(image, dim=-1), F.normalize(text, dim=-1), scale, bias)
    torch.testing.assert_close(mine, reference, rtol=0, atol=1e-6)
    for a, b in zip(grads(mine, ours), grads(reference, theirs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # Not a loss that ignores its inputs: a matching pair's logit moved moves it.
    assert mine.item() > 0 and abs(euclip_siglip(ours[0], ours[1].roll(1, 0), *ours[2:]).item() - mine.item()) > 1e-3


def rank_main(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    half = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    results = {}
    for impl in IMPLS:
        image, text, scale, bias = leaves()
        mine = [image.detach()[half].clone().requires_grad_(), text.detach()[half].clone().requires_grad_(), scale, bias]
        loss = SigLipLoss(rank=rank, world_size=2, dist_impl=impl)(F.normalize(mine[0], dim=-1),
                                                                    F.normalize(mine[1], dim=-1), scale, bias)
        loss.backward()
        results[impl] = [loss.detach()] + [t.grad.clone() for t in mine]
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("siglip")
    mp.spawn(rank_main, args=(str(folder / "store"), str(folder / "out")), nprocs=2, join=True)
    return [torch.load(folder / f"out.{rank}", weights_only=True) for rank in (0, 1)]


@pytest.mark.parametrize("impl", IMPLS)
def test_open_clips_two_rank_siglip_averaged_as_ddp_does_is_euclips_loss_on_the_global_batch(two_ranks, impl):
    ours = leaves()
    loss = euclip_siglip(*ours)
    d_image, d_text, d_scale, d_bias = grads(loss, ours)
    (loss0, image0, text0, scale0, bias0), (loss1, image1, text1, scale1, bias1) = two_ranks[0][impl], two_ranks[1][impl]
    # DDP's mean over the two ranks of each rank's loss and gradients.
    torch.testing.assert_close((loss0 + loss1) / 2, loss.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.cat([image0, image1]) / 2, d_image, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.cat([text0, text1]) / 2, d_text, rtol=0, atol=1e-6)
    torch.testing.assert_close((scale0 + scale1) / 2, d_scale, rtol=0, atol=1e-6)
    torch.testing.assert_close((bias0 + bias1) / 2, d_bias, rtol=0, atol=1e-6)


def test_a_siglip_model_starts_from_siglips_scale_and_bias_in_every_geometry_and_infonce_has_no_bias():
    for name, logit in (("clip", "cos"), ("euclidean", "d2"), ("hyperbolic", "d")):
        model = EuclipModel(C.load_config("tiny-clip", [f"geometry.name={name}", f"geometry.logit={logit}",
                                                        "loss.kind=siglip", "model.arch=tiny-vit"]))
        assert model.logit_scale().item() == pytest.approx(10.0) and model.logit_bias.item() == -10.0
        assert any(p is model.logit_bias for p in model.loss_scalars())
    assert EuclipModel(C.load_config("tiny-clip", ["model.arch=tiny-vit"])).logit_bias is None
