"""Two gloo processes on the CPU give the loss and gradients of one process on the concatenated batch."""

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from euclip_cli import config as C
from euclip_cli.model import EuclipModel
from euclip_cli.train.distributed import Dist
from euclip_cli.train.step import forward_backward
from tests.test_accumulation import RECIPES

CASES = [(variant, k) for variant in RECIPES for k in (1, 2)]
BATCH = 8


def config(variant):
    return C.load_config("tiny-clip", RECIPES[variant] + [f"data.batch_size={BATCH}", "model.arch=tiny-vit"])


def inputs():
    torch.manual_seed(1)
    return torch.randn(BATCH, 3, 64, 64, dtype=torch.float64), torch.randint(1, 400, (BATCH, 32))


def step(cfg, images, tokens, k, ranks: Dist):
    torch.manual_seed(0)
    model = EuclipModel(cfg).double()
    terms = forward_backward(model, images, tokens, k, cfg.loss.entail_weight, cfg.loss.entail_min_radius,
                             contextlib.nullcontext, gather=ranks.gather, owns_scalars=ranks.main)
    params = [p for p in model.parameters() if p.requires_grad]
    ranks.sum_gradients(params)
    return terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def rank_main(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ranks = Dist(rank=rank, world=2)
    images, tokens = inputs()
    half = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    results = {}
    for variant, k in CASES:
        results[f"{variant}|{k}"] = step(config(variant), images[half], tokens[half], k, ranks)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gloo")
    mp.spawn(rank_main, args=(str(folder / "store"), str(folder / "out.pt")), nprocs=2, join=True)
    return torch.load(folder / "out.pt", weights_only=True)


@pytest.mark.parametrize("variant,k", CASES)
def test_two_processes_equal_one_process_on_the_global_batch(two_process_results, variant, k):
    images, tokens = inputs()
    ref_terms, ref = step(config(variant), images, tokens, 1, Dist())
    terms, grads = two_process_results[f"{variant}|{k}"]
    for key in ref_terms:
        torch.testing.assert_close(terms[key], ref_terms[key])
    assert grads.keys() == ref.keys() and "clip.logit_scale" in grads
    for name in ref:
        torch.testing.assert_close(grads[name], ref[name], rtol=1e-9, atol=1e-12, msg=f"{variant}, k={k}: {name}")
