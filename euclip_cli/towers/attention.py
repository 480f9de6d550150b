"""A leaner self-attention for open_clip's residual blocks, on the same parameters."""

from __future__ import annotations

from typing import Optional

import open_clip
import torch
from torch import nn
from torch.nn import functional as F


class PackedSelfAttention(nn.Module):
    """``nn.MultiheadAttention``'s self-attention (no dropout) on the same parameters, with a leaner backward.

    torch's module splits its packed q, k, v projection with three ``select``s, and the backward of
    each fills a zero tensor the size of all three before adding its part; those fills and the layout
    copies around them are a visible share of a CPU training step (``euclip bench profile``;
    docs/measurements/2026-11-22-training-speed has the measurement). Here the projection is split by ``unbind``, whose
    backward stacks the three gradients in one copy. Parameters keep their names
    (``in_proj_weight``, ``in_proj_bias``, ``out_proj``), so checkpoints load either way; the
    result equals torch's within float rounding (``tests/test_model.py`` checks it in fp64).
    """

    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        self.num_heads, self.batch_first = mha.num_heads, mha.batch_first
        self.in_proj_weight, self.in_proj_bias, self.out_proj = mha.in_proj_weight, mha.in_proj_bias, mha.out_proj

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, need_weights: bool = False,
                attn_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, None]:
        """``(B, S, E)`` (or ``(S, B, E)`` unless batch-first) ``-> ((B, S, E), None)``, as the module it
        replaces returns with ``need_weights=False``. ``attn_mask`` is ``(S, S)`` or ``(B * heads, S, S)``,
        additive, or boolean with True where attention is not allowed (torch's convention there)."""
        if need_weights or key is not query or value is not query:
            raise NotImplementedError("PackedSelfAttention computes self-attention without weights only")
        x = query if self.batch_first else query.transpose(0, 1)
        batch, length, width = x.shape
        heads = self.num_heads
        q, k, v = (F.linear(x, self.in_proj_weight, self.in_proj_bias)
                   .view(batch, length, 3, heads, width // heads).permute(2, 0, 3, 1, 4).unbind(0))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(attn_mask, float("-inf"))
            if attn_mask.dim() == 3:
                attn_mask = attn_mask.view(batch, heads, length, length)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, heads, S, E / heads)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, width))
        return (out if self.batch_first else out.transpose(0, 1)), None


def pack_attention(clip: nn.Module) -> None:
    """Every open_clip residual block's ``nn.MultiheadAttention`` becomes a ``PackedSelfAttention`` on
    the same parameters (blocks that attend across modalities, as CoCa's decoder does, or with
    dropout or separate q, k, v projections keep torch's)."""
    for block in clip.modules():
        attn = getattr(block, "attn", None)
        if (isinstance(block, open_clip.transformer.ResidualAttentionBlock) and not hasattr(block, "ln_1_kv")
                and isinstance(attn, nn.MultiheadAttention) and attn._qkv_same_embed_dim and attn.dropout == 0
                and attn.in_proj_bias is not None):
            block.attn = PackedSelfAttention(attn)
