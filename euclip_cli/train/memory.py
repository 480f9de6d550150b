"""The GPU memory a recipe's training step needs, planned from what its towers keep for backward.

Measured on the CPU, in the precision the recipe gets on a GPU (``auto`` is bf16 there), with
autograd's saved-tensor hooks: every tensor the forward keeps for the backward pass is counted once
(by its storage). Two micro-batches of different sizes give the bytes per sample (the slope) and
the bytes that do not grow with the batch (autocast's low-precision copies of the weights, say).
With ``train.grad_checkpointing`` a checkpointed block keeps only its input, so its inner
activations are not counted, as on a GPU.

The plan for a GPU adds the weights, their gradients and AdamW's two moments (4 bytes each per
parameter, all fp32) and the loss: every rank computes the loss of the whole global batch (the
features are all-gathered), whose ``(B, B)`` matrices are measured at the recipe's global batch; with
``loss.local_loss`` a rank keeps its ``(b, B)`` share of them, that measurement over the number of GPUs. Not
counted: the CUDA context and allocator slack (a few GiB in practice), the forward's transient peak
inside a block, and the accumulation's cached features (``optim.accum_steps`` divides the
micro-batch; the cached embeddings are ``(B, D)``, small beside activations). With HyCoCLIP's loss a
sample brings its box: the towers run on both, and the loss holds four ``(B, D)`` embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from euclip_cli import config as C

ADAMW_BYTES_PER_PARAMETER = 16  # fp32 weight, gradient, first and second moments


@dataclass(frozen=True)
class SavedBytes:
    """What a forward keeps for backward: ``fixed + per_sample * batch`` bytes."""

    fixed: float
    per_sample: float

    def at(self, batch: int) -> float:
        return self.fixed + self.per_sample * batch


@dataclass(frozen=True)
class MemoryPlan:
    arch: str
    precision: str
    parameters: int
    global_batch: int
    towers: SavedBytes  # without checkpointing
    towers_checkpointed: SavedBytes
    loss_bytes: float  # the global batch's loss, kept for backward
    local_loss: bool = False  # each rank keeps its (b x B) share of the loss (loss.local_loss)

    @property
    def static_bytes(self) -> int:
        return ADAMW_BYTES_PER_PARAMETER * self.parameters

    def per_gpu(self, gpus: int, checkpointing: bool) -> float:
        """Bytes one of ``gpus`` GPUs needs for its share of the global batch (one micro-batch)."""
        towers = self.towers_checkpointed if checkpointing else self.towers
        loss = self.loss_bytes / gpus if self.local_loss else self.loss_bytes
        return self.static_bytes + towers.at(self.global_batch // gpus) + loss

    def gpus_needed(self, capacity_bytes: float, checkpointing: bool, most: int = 1024) -> int | None:
        """The fewest GPUs (a power of two dividing the batch) whose share fits ``capacity_bytes``."""
        gpus = 1
        while gpus <= most and self.global_batch % gpus == 0:
            if self.per_gpu(gpus, checkpointing) <= capacity_bytes:
                return gpus
            gpus *= 2
        return None


def _saved_bytes(run) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``run()`` runs a forward."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())


def _towers_saved(model, precision: str, batches: tuple[int, int], halves: int = 1) -> SavedBytes:
    """What the towers keep per sample; ``halves`` = 2 where a sample brings its box (two images, two texts)."""
    from euclip_cli.device import autocast_factory

    autocast = autocast_factory(precision, torch.device("cpu"))
    size = model.clip.visual.image_size
    size = size if isinstance(size, int) else size[0]
    measured = []
    # Captions as long as the context, the text tower's largest activations: each ends in the largest token id
    # (where the tower pools, end-of-text's place), at the last position, so trimming keeps the whole context
    # (random ids would end each caption at a random place).
    last_id = model.clip.token_embedding.num_embeddings - 1
    for batch in batches:
        # Each half its own tensors (storages are counted once), encoded on its own, as the step encodes the
        # samples and then their boxes.
        inputs = []
        for _ in range(halves):
            tokens = torch.randint(1, 400, (batch, model.clip.context_length))
            tokens[:, -1] = last_id
            inputs.append((torch.randn(batch, 3, size, size), tokens))

        def forward():
            with autocast():
                # Every half's output kept to the end: a graph freed early would free storages for the next
                # half to reuse, and a storage is counted by its address.
                kept = [model.encode_image(images).float().sum().add(model.encode_text(tokens).float().sum())
                        for images, tokens in inputs]
            return kept

        measured.append(_saved_bytes(forward))
    (b1, m1), (b2, m2) = zip(batches, measured)
    per_sample = (m2 - m1) / (b2 - b1)
    return SavedBytes(fixed=max(0.0, m1 - per_sample * b1), per_sample=per_sample)


def plan(cfg: C.Config, batches: tuple[int, int] = (2, 4)) -> MemoryPlan:
    """The plan for ``cfg`` on a GPU (see the module's docstring); builds the model on the CPU."""
    from euclip_cli.loss import hycoclip_objective, objective
    from euclip_cli.model import EuclipModel
    from euclip_cli.towers.checkpointing import enable_grad_checkpointing

    precision = "bf16" if cfg.train.precision == "auto" else cfg.train.precision
    boxes = C.trains_on_boxes(cfg)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = EuclipModel(cfg).train()
        plain = _towers_saved(model, precision, batches, 2 if boxes else 1)
        enable_grad_checkpointing(model.clip)
        checkpointed = _towers_saved(model, precision, batches, 2 if boxes else 1)
        size = model.clip.visual.image_size
        with torch.no_grad():
            dim = model.encode_image(torch.zeros(1, 3, *((size, size) if isinstance(size, int) else size))).shape[-1]
        batch = cfg.data.batch_size
        image, text, box_image, box_text = (torch.randn(batch, dim, requires_grad=True) for _ in range(4))
        args = (model.logit_scale(), model.curvature(), cfg.loss.entail_weight, cfg.loss.entail_min_radius)
        loss = _saved_bytes(lambda: hycoclip_objective(model.geometry, image, text, box_image, box_text, *args)
                            if boxes else objective(model.geometry, image, text, *args))
    return MemoryPlan(cfg.model.arch, precision, sum(p.numel() for p in model.parameters()), batch, plain,
                      checkpointed, loss, cfg.loss.local_loss)

