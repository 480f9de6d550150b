"""Two gloo processes on the CPU give the loss and gradients of one process on the concatenated batch."""

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from euclip_cli import config as C
from euclip_cli.model import EuclipModel
from euclip_cli.train.distributed import BUCKET_BYTES, Dist, GradientReducer
from euclip_cli.step import LocalLoss, forward_backward
from tests.test_accumulation import RECIPES, with_boxes

CASES = [(variant, k) for variant in RECIPES for k in (1, 2)]
RECIPES_FIRST = next(iter(RECIPES))
BATCH = 8


def config(variant):
    return C.load_config("tiny-clip", RECIPES[variant] + [f"data.batch_size={BATCH}", "model.arch=tiny-vit"])


def inputs(cfg):
    """The global batch, its boxes after its samples where the loss needs them (``with_boxes``)."""
    torch.manual_seed(1)
    return with_boxes(cfg, torch.randn(BATCH, 3, 64, 64, dtype=torch.float64), torch.randint(1, 400, (BATCH, 32)))


def rank_share(x: torch.Tensor, rank: int) -> torch.Tensor:
    """A rank's half of the global batch ``x``: of each of its halves where it holds boxes after the samples."""
    halves = x.shape[0] // BATCH
    return torch.cat([part[rank * BATCH // 2:(rank + 1) * BATCH // 2] for part in x.chunk(halves)])


def step(cfg, images, tokens, k, ranks: Dist, bucket_bytes=BUCKET_BYTES, local_loss=False):
    torch.manual_seed(0)
    model = EuclipModel(cfg).double()
    params = [p for p in model.parameters() if p.requires_grad]
    # The trainer's reducer: all-reduces launched from gradient hooks during the last backward pass.
    reducer = GradientReducer(ranks, params, last=tuple(model.loss_scalars()), bucket_bytes=bucket_bytes)
    reducer.attach()
    terms = forward_backward(model, images, tokens, k, cfg.loss.entail_weight, cfg.loss.entail_min_radius,
                             contextlib.nullcontext, gather=ranks.gather, owns_scalars=ranks.main,
                             before_last_backward=reducer.arm, boxes=cfg.loss.kind == "hycoclip",
                             local=LocalLoss(ranks.gather_with_grad, ranks.offset, ranks.sum_tensor) if local_loss else None)
    reducer.finish()
    return terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def rank_main(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ranks = Dist(rank=rank, world=2)
    results = {}
    for variant, k in CASES:
        images, tokens = (rank_share(x, rank) for x in inputs(config(variant)))
        results[f"{variant}|{k}"] = step(config(variant), images, tokens, k, ranks)
        # DataComp's --local-loss --gather-with-grad: each rank's (b x B) share of the global loss.
        results[f"{variant}|{k}|local"] = step(config(variant), images, tokens, k, ranks, local_loss=True)
    # Many small buckets, some finished before their predecessors, instead of a few large ones.
    images, tokens = (rank_share(x, rank) for x in inputs(config(RECIPES_FIRST)))
    results[f"{RECIPES_FIRST}|small buckets"] = step(config(RECIPES_FIRST), images, tokens, 2, ranks, bucket_bytes=2**14)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gloo")
    mp.spawn(rank_main, args=(str(folder / "store"), str(folder / "out.pt")), nprocs=2, join=True)
    return torch.load(folder / "out.pt", weights_only=True)


@pytest.mark.parametrize("variant,k", CASES + [(RECIPES_FIRST, "small buckets")] +
                         [(variant, f"{k}|local") for variant, k in CASES])
def test_two_processes_equal_one_process_on_the_global_batch(two_process_results, variant, k):
    """The whole loss on every rank, and each rank's local share of it (the terms summed over ranks), with
    and without accumulation: the loss and every gradient (scalars included) of one process."""
    images, tokens = inputs(config(variant))
    ref_terms, ref = step(config(variant), images, tokens, 1, Dist())
    terms, grads = two_process_results[f"{variant}|{k}"]
    for key in ref_terms:
        torch.testing.assert_close(terms[key], ref_terms[key])
    assert grads.keys() == ref.keys() and "clip.logit_scale" in grads
    for name in ref:
        torch.testing.assert_close(grads[name], ref[name], rtol=1e-9, atol=1e-12, msg=f"{variant}, k={k}: {name}")


def test_the_reducer_launches_in_one_fixed_order_whatever_order_gradients_arrive_in(monkeypatch):
    """NCCL pairs collectives by order: a gradient ready early waits for its predecessors, the
    scalars come last with zeros where this rank has none, and nothing launches before ``arm``."""
    from euclip_cli.train import distributed

    launched = []

    class Handle:
        def wait(self):
            launched.append("wait")

    def all_reduce(tensor, async_op=False):
        assert async_op
        launched.append("+".join(name for name, p in named.items()
                                    if p.grad is not None and (p.grad is tensor or p.grad._base is tensor)))
        return Handle()

    monkeypatch.setattr(distributed.dist, "all_reduce", all_reduce)
    named = {name: torch.nn.Parameter(torch.zeros(2)) for name in ("a", "b", "c", "scale")}
    params = list(named.values())
    # A bucket of 8 bytes holds one parameter of two floats: one all-reduce per parameter.
    reducer = GradientReducer(Dist(rank=1, world=2), params, last=(named["scale"],), bucket_bytes=8)
    assert [[n for p in b for n, q in named.items() if q is p] for b in reducer.buckets] == [["c"], ["b"], ["a"]]
    reducer.attach()

    def produce(name):
        (named[name] * 1.0).sum().backward()

    produce("a")  # not armed: an earlier accumulation pass launches nothing
    assert launched == []
    reducer.arm()
    produce("a")
    produce("b")
    assert launched == []  # both wait for c, the first in the order
    produce("c")
    assert launched == ["c", "b", "a"]
    reducer.finish()  # this rank has no gradient for the scale: a zero one is summed in
    assert launched == ["c", "b", "a", "scale", "wait", "wait", "wait", "wait"]
    assert torch.equal(named["scale"].grad, torch.zeros(2))


def test_gradients_accumulate_in_their_bucket_which_is_summed_whole(monkeypatch):
    """A 16-byte bucket holds two of the three parameters: two collectives, each on a flat bucket
    whose views are the gradients (no copy), launched once all of its gradients are final."""
    from euclip_cli.train import distributed

    reduced = []

    class Handle:
        def wait(self):
            pass

    def all_reduce(tensor, async_op=False):
        reduced.append(tensor)
        tensor.mul_(2)  # the other rank holds the same gradients
        return Handle()

    monkeypatch.setattr(distributed.dist, "all_reduce", all_reduce)
    a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    reducer = GradientReducer(Dist(rank=0, world=2), [a, b, c], bucket_bytes=16)
    assert reducer.buckets == [[c, b], [a]]
    reducer.attach()
    (c * 1.0).sum().backward()  # an accumulation pass before the last
    reducer.arm()
    ((a * 3.0).sum() + (c * 2.0).sum()).backward()
    assert reduced == []  # c's bucket waits for b; a's, ready, waits for c's
    (b * 5.0).sum().backward()
    assert [t.numel() for t in reduced] == [4, 2]  # both launched from b's hook, in order
    reducer.finish()
    assert torch.equal(c.grad, torch.full((2,), 6.0)) and torch.equal(b.grad, torch.full((2,), 10.0))
    assert torch.equal(a.grad, torch.full((2,), 6.0))
    assert c.grad._base is reduced[0] and b.grad._base is reduced[0] and a.grad._base is reduced[1]


def test_a_gradient_outside_its_bucket_is_a_bug_named_not_a_silent_wrong_sum(monkeypatch):
    from euclip_cli.train import distributed

    monkeypatch.setattr(distributed.dist, "all_reduce", lambda tensor, async_op=False: None)
    p = torch.nn.Parameter(torch.zeros(2))
    reducer = GradientReducer(Dist(rank=0, world=2), [p])
    reducer.attach()
    p.grad = None  # a zero_grad(set_to_none=True) with no attach() after it
    reducer.arm()
    with pytest.raises(RuntimeError, match="call attach"):
        (p * 1.0).sum().backward()


@pytest.mark.parametrize("variant", list(RECIPES))
def test_the_ranks_local_shares_add_up_to_the_global_loss(variant):
    """Without processes: the global batch cut into three shares, each share's loss from its own pairs
    against the whole batch; their sum is objective's on the whole batch, term by term."""
    from euclip_cli.loss import hycoclip_objective, local_hycoclip_objective, local_objective, objective

    cfg = config(variant)
    torch.manual_seed(0)
    model = EuclipModel(cfg).double()
    images, tokens = inputs(cfg)
    with torch.no_grad():
        image, text = model.encode_image(images), model.encode_text(tokens)
    args = (model.logit_scale(), model.curvature(), cfg.loss.entail_weight, cfg.loss.entail_min_radius)
    cuts = ((0, 3), (3, 5), (5, BATCH))
    if cfg.loss.kind == "hycoclip":
        (image, box_image), (text, box_text) = image.chunk(2), text.chunk(2)
        whole = hycoclip_objective(model.geometry, image, text, box_image, box_text, *args)
        shares = [local_hycoclip_objective(model.geometry, image[s:e], text[s:e], box_image[s:e], box_text[s:e],
                                           image, text, s, *args) for s, e in cuts]
    else:
        whole = objective(model.geometry, image, text, *args, model.logit_bias)
        shares = [local_objective(model.geometry, image[s:e], text[s:e], image, text, s, *args, model.logit_bias)
                  for s, e in cuts]
    for key, value in whole.items():
        torch.testing.assert_close(sum(share[key] for share in shares), value, rtol=1e-12, atol=1e-12)
