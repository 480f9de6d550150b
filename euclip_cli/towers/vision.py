"""Image towers with m class tokens, Multi(n, m) (Sun and Li, TMLR, section 3 and Figure 6).

Each token's final state is projected to n dimensions by the tower's own projection (shared by the
tokens, as ``projection_u(u_bar[:m])`` in the paper's Figure 6) and the m projections are
concatenated, ``(B, m * n)``. m = 1 *is* the tower extended:

- ViT (``VisionTransformer``): open_clip's class token is token 1; tokens 2..m are new learnable
  vectors, randomly initialised like open_clip's class token (the paper: "randomly initialized to
  break symmetry"), at the class token's position embedding.
- ModifiedResNet: its attention pool already treats the mean of the feature map as a class token
  (the query whose output is the embedding); tokens 2..m are new learnable queries at that token's
  position embedding, attending in the same layer. Not in the paper, whose image towers are ViTs;
  it lets the embedded world's ResNet tower carry the system.

The text tower's class tokens are ``towers.text``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from open_clip.modified_resnet import AttentionPool2d, ModifiedResNet
from open_clip.transformer import VisionTransformer
from torch import nn

from euclip_cli.errors import UsageError


def _new_tokens(count: int, width: int) -> nn.Parameter:
    """``(count, width)`` class tokens initialised as open_clip initialises its own: N(0, 1/width)."""
    return nn.Parameter(torch.randn(count, width) * width ** -0.5)


class MultiTokenViT(VisionTransformer):
    """open_clip's ViT with m class tokens. ``(B, 3, H, W) -> (B, m * n)``.

    Built by re-classing an existing ``VisionTransformer`` (``MultiTokenViT.extend``), so the tower's
    own weights and state-dict keys stay open_clip's; the m - 1 new tokens are ``extra_class_embedding``.
    """

    extra_class_embedding: nn.Parameter

    @classmethod
    def extend(cls, vit: VisionTransformer, tokens: int) -> "MultiTokenViT":
        if vit.pool_type != "tok" or vit.attn_pool is not None or vit.output_tokens:
            raise UsageError("model.class_tokens > 1 needs a ViT pooled at its class token "
                             f"(this one pools '{vit.pool_type}'{' with an attentional pooler' if vit.attn_pool else ''})")
        vit.__class__ = cls
        vit.extra_class_embedding = _new_tokens(tokens - 1, vit.class_embedding.shape[-1])
        return vit

    @property
    def class_tokens(self) -> int:
        return 1 + self.extra_class_embedding.shape[0]

    def _embeds(self, x: torch.Tensor) -> torch.Tensor:
        x = super()._embeds(x)  # [class token, patches], positions added, ln_pre applied
        # ln_pre acts on each token alone, so applying it to the new tokens here is the same as before the cat.
        extra = self.ln_pre(self.extra_class_embedding.to(x.dtype) + self.positional_embedding[0].to(x.dtype))
        return torch.cat([x[:, :1], extra.expand(x.shape[0], -1, -1), x[:, 1:]], dim=1)

    def _global_pool(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.class_tokens
        return x[:, :m], x[:, m:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = super().forward(x)  # (B, m, n): the projection acts on each token's state
        return pooled.reshape(pooled.shape[0], -1)


class MultiQueryAttentionPool(AttentionPool2d):
    """open_clip's ResNet attention pool with m class-token queries. ``(B, C, H, W) -> (B, m * n)``.

    The m - 1 new tokens (``extra_class_embedding``) join the mean token as queries, keys and values of
    the pool's single attention layer, at the mean token's position; ``c_proj`` projects each to n.
    """

    extra_class_embedding: nn.Parameter

    @classmethod
    def extend(cls, pool: AttentionPool2d, tokens: int) -> "MultiQueryAttentionPool":
        pool.__class__ = cls
        pool.extra_class_embedding = _new_tokens(tokens - 1, pool.k_proj.in_features)
        return pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], x.shape[1], x.shape[2] * x.shape[3]).permute(2, 0, 1)  # (HW, B, C)
        pos = self.positional_embedding.to(x.dtype)
        mean = x.mean(dim=0, keepdim=True) + pos[:1, None]
        extra = (self.extra_class_embedding.to(x.dtype) + pos[0])[:, None].expand(-1, x.shape[1], -1)
        x = torch.cat([mean, extra, x + pos[1:, None]], dim=0)  # (m + HW, B, C)
        x, _ = F.multi_head_attention_forward(
            query=x, key=x, value=x, embed_dim_to_check=x.shape[-1], num_heads=self.num_heads,
            q_proj_weight=self.q_proj.weight, k_proj_weight=self.k_proj.weight, v_proj_weight=self.v_proj.weight,
            in_proj_weight=None, in_proj_bias=torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]),
            bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0,
            out_proj_weight=self.c_proj.weight, out_proj_bias=self.c_proj.bias,
            use_separate_proj_weight=True, training=self.training, need_weights=False)
        m = 1 + self.extra_class_embedding.shape[0]
        return x[:m].permute(1, 0, 2).reshape(x.shape[1], -1)


def add_class_tokens(visual: nn.Module, tokens: int) -> None:
    """Give an image tower m = ``tokens`` > 1 class tokens, in place."""
    if isinstance(visual, VisionTransformer):
        MultiTokenViT.extend(visual, tokens)
    elif isinstance(visual, ModifiedResNet):
        MultiQueryAttentionPool.extend(visual.attnpool, tokens)
    else:
        raise UsageError(f"model.class_tokens > 1 needs a ViT or ResNet image tower from open_clip, "
                         f"not {type(visual).__name__} (a timm tower)")
