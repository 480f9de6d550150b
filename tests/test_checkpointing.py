"""train.grad_checkpointing: the same loss, gradients and BatchNorm statistics, for every kind of tower."""

import contextlib
import copy

import pytest
import torch

from euclip_cli import config as C
from euclip_cli.model import EuclipModel
from euclip_cli.step import forward_backward
from euclip_cli.towers import batchnorm_statistics
from euclip_cli.towers.checkpointing import enable_grad_checkpointing

ARCHS = {  # one of each kind of image tower euclip builds, and the text tower with each
    "tiny": [],  # open_clip's ResNet, with BatchNorm: checkpointed per bottleneck here
    "tiny-vit": [],  # open_clip's ViT
    # euclip's multi-token ViT behind a conv stem (BatchNorm in the stem)
    "tiny-vit-c16": ["model.class_tokens=2", "geometry.name=product-sphere", "geometry.logit=inner",
                     "geometry.blocks=2", "model.final_ln=true", "loss.entail_weight=0"],
    "meru-vit-s": ["data.batch_size=2"],  # a timm ViT, MERU's
}


def step(model, images, tokens, cfg):
    terms = forward_backward(model, images, tokens, 1, cfg.loss.entail_weight, cfg.loss.entail_min_radius,
                             contextlib.nullcontext)
    return terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_checkpointed_towers_give_the_same_loss_gradients_and_statistics(arch):
    cfg = C.load_config("tiny-euclip", [f"model.arch={arch}", "data.batch_size=4", *ARCHS[arch]])
    torch.manual_seed(0)
    plain = EuclipModel(cfg).double().train()
    checkpointed = copy.deepcopy(plain)
    enable_grad_checkpointing(checkpointed.clip)
    size = plain.clip.visual.image_size
    size = size if isinstance(size, int) else size[0]
    batch = cfg.data.batch_size
    images = torch.randn(batch, 3, size, size, dtype=torch.float64)
    tokens = torch.randint(1, 400, (batch, plain.clip.context_length))
    (plain_terms, plain_grads), (ckpt_terms, ckpt_grads) = (step(m, images, tokens, cfg) for m in (plain, checkpointed))
    assert plain_grads.keys() == ckpt_grads.keys() and len(plain_grads) > 10
    for name, value in plain_terms.items():
        torch.testing.assert_close(ckpt_terms[name], value, rtol=1e-12, atol=1e-12)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)
    plain_stats, ckpt_stats = batchnorm_statistics(plain), batchnorm_statistics(checkpointed)
    assert plain_stats.keys() == ckpt_stats.keys()
    for name, value in plain_stats.items():  # a recomputed forward must not count as a second update
        assert torch.equal(ckpt_stats[name], value), name
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()  # checkpoints keep their keys


def test_checkpointing_keeps_fewer_tensors_for_backward():
    """What the switch is for: far fewer activation bytes saved for the backward pass (measured with
    autograd's saved-tensor hooks)."""
    cfg = C.load_config("tiny-clip", ["model.arch=tiny-vit", "data.batch_size=8"])
    torch.manual_seed(0)
    model = EuclipModel(cfg).train()
    images, tokens = torch.randn(8, 3, 64, 64), torch.randint(1, 400, (8, model.clip.context_length))

    def saved_bytes(m):
        seen: dict[int, int] = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m.encode_image(images).sum().add(m.encode_text(tokens).sum()).backward()
        return sum(seen.values())

    without = saved_bytes(model)
    enable_grad_checkpointing(model.clip)
    assert saved_bytes(model) < 0.5 * without


def test_the_saved_tensor_count_is_what_autograd_keeps_for_a_linear_layer():
    """The plan's measuring stick against a count by hand: a linear layer keeps its input (B x 7 floats) and
    its weight is a parameter, kept without a copy (3 x 7 floats); ReLU keeps its output (B x 3)."""
    from euclip_cli.train.memory import _saved_bytes

    layer = torch.nn.Linear(7, 3)
    x = torch.randn(5, 7, requires_grad=True)
    assert _saved_bytes(lambda: torch.relu(layer(x)).sum()) == 4 * (5 * 7 + 3 * 7 + 5 * 3)


@pytest.mark.slow
def test_train_plan_prints_the_memory_per_gpu_with_and_without_checkpointing(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from euclip_cli.cli.main import app

    monkeypatch.chdir(tmp_path)  # where a run would go (results/runs), were one trained
    result = CliRunner().invoke(app, ["train", "--recipe", "tiny-clip", "--plan", "model.arch=tiny-vit",
                                      "data.batch_size=64"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "with checkpointing" in text and "H100 80GB: the fewest that fit" in text
    assert not (tmp_path / "results").exists()  # a plan trains nothing


@pytest.mark.slow
def test_a_plan_needs_more_gpus_without_checkpointing_for_vit_b32_at_datacomps_batch():
    from euclip_cli.train.memory import plan

    p = plan(C.load_config("medium-euclip"))
    assert p.parameters > 150e6 and p.global_batch == 4096
    assert p.towers_checkpointed.per_sample < p.towers.per_sample / 2
    assert p.per_gpu(8, checkpointing=False) > p.per_gpu(16, checkpointing=False)
    assert p.gpus_needed(72 * 2 ** 30, checkpointing=True) < p.gpus_needed(72 * 2 ** 30, checkpointing=False)


def test_a_hycoclip_plan_counts_each_samples_box_through_both_towers():
    """A sample and its box: what the towers keep per sample is about twice MERU's (the same towers), and the loss
    holds more than MERU's (four embeddings, four logit matrices where MERU has one)."""
    from euclip_cli.train.memory import plan

    meru, hycoclip = plan(C.load_config("tiny-meru")), plan(C.load_config("tiny-hycoclip"))
    assert hycoclip.parameters == meru.parameters
    assert hycoclip.towers.per_sample == pytest.approx(2 * meru.towers.per_sample, rel=0.01)
    assert hycoclip.towers_checkpointed.per_sample == pytest.approx(2 * meru.towers_checkpointed.per_sample, rel=0.01)
    assert hycoclip.loss_bytes > 2 * meru.loss_bytes


def test_a_plan_counts_the_text_tower_on_its_whole_context():
    """The plan's captions span the context, so trimming (which stops each caption at its largest token id) keeps
    all of it: the text tower's share per sample is that of full-length captions, not of random lengths."""
    from euclip_cli.model import EuclipModel
    from euclip_cli.train.memory import _saved_bytes, plan

    cfg = C.load_config("tiny-meru")
    model = EuclipModel(cfg).train()
    full = [torch.randint(1, 400, (b, model.clip.context_length)) for b in (2, 4)]
    for tokens in full:
        tokens[:, -1] = model.clip.token_embedding.num_embeddings - 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        text = [_saved_bytes(lambda t=t: model.encode_text(t)) for t in full]
    per_caption = (text[1] - text[0]) / 2
    towers = plan(cfg).towers.per_sample
    with torch.autocast("cpu", dtype=torch.bfloat16):
        images = [_saved_bytes(lambda b=b: model.encode_image(torch.randn(b, 3, 64, 64))) for b in (2, 4)]
    assert towers == pytest.approx(per_caption + (images[1] - images[0]) / 2, rel=0.01)
