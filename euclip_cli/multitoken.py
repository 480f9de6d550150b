"""Multiple class tokens, Multi(n, m) (Sun and Li, TMLR, section 3 and Figure 6), on open_clip's towers.

Each tower carries m class tokens instead of one. Each token's final state is projected to n
dimensions by the tower's own projection (shared by the tokens, as ``projection_u(u_bar[:m])`` in
the paper's Figure 6), and the m projections are concatenated into an ``(B, m * n)`` feature that
the product-sphere geometry (``geometry.blocks = m``) normalises block by block: a point of
PS(n, m), compared with the sum of the m block cosines.

How the m tokens enter each of open_clip's towers, so that m = 1 *is* the tower it extends:

- ViT (``VisionTransformer``): open_clip's class token is token 1; tokens 2..m are new learnable
  vectors, randomly initialised like open_clip's class token (the paper: "randomly initialized to
  break symmetry"), at the class token's position embedding.
- ModifiedResNet (the tiny recipes' image tower): its attention pool already treats the mean of
  the feature map as a class token (the query whose output is the embedding); tokens 2..m are new
  learnable queries at that token's position embedding, attending in the same layer. This is not
  in the paper, whose image towers are ViTs; it lets the embedded world's towers, which learn
  spatial features on a CPU, carry the system (see ``model.LOCAL_ARCHS``).
- Causal text transformer (open_clip's ``CLIP`` text tower, pooled at end-of-text): token 1 is the
  caption's own end-of-text token, as open_clip pools it; tokens 2..m are the end-of-text token's
  embedding plus their own learnable absolute position embeddings (the paper: "different absolute
  positional embeddings for each class token"), appended after the context. They attend to the
  caption up to and including its end-of-text token and to each other; the caption's tokens do not
  attend to them, so the caption's own states, token 1 included, are open_clip's. The paper's text
  tower is a bidirectional BERT whose class tokens lead the sequence; under a causal mask a leading
  token would see nothing, hence the placement after the caption.
"""

from __future__ import annotations

import open_clip
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


def end_positions(clip: open_clip.CLIP, tokens: torch.Tensor) -> torch.Tensor:
    """Each caption's pooled (end-of-text) position, as open_clip's ``text_global_pool`` finds it. ``(B, L) -> (B,)``."""
    if clip.text_pool_type == "argmax":  # OpenAI's BPE: end-of-text has the largest id
        return tokens.argmax(dim=-1)
    return (tokens == clip.text_eos_id).int().argmax(dim=-1)


def text_mask(ends: torch.Tensor, length: int, tokens: int, heads: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask of a context of ``length`` followed by ``tokens - 1`` class tokens.

    ``ends (B,) -> (B * heads, S, S)``, S = length + tokens - 1, 0 where attention is allowed and -inf
    elsewhere: the context is causal and does not see the class tokens; a class token sees its
    caption up to its end-of-text token and every class token. Batch-major over heads, the order
    ``nn.MultiheadAttention`` reads a 3-D mask in.
    """
    size = length + tokens - 1
    pos = torch.arange(size, device=ends.device)
    causal = pos[None, :] <= pos[:, None]  # (S, S): key <= query
    is_class_query = pos[:, None] >= length
    sees_caption = pos[None, None, :] <= ends[:, None, None]  # (B, 1, S)
    is_class_key = pos[None, :] >= length
    allowed = torch.where(is_class_query, sees_caption | is_class_key, causal & ~is_class_key)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=ends.device).masked_fill_(~allowed, float("-inf"))
    return mask.repeat_interleave(heads, dim=0)


def text_class_tokens(clip: nn.Module) -> int:
    """How many class tokens the text tower carries (1 for open_clip's own)."""
    extra = getattr(clip, "class_positional_embedding", None)
    return 1 if extra is None else 1 + extra.shape[0]


def multi_text_features(clip: open_clip.CLIP, tokens: torch.Tensor, length: int) -> torch.Tensor:
    """The m class tokens' projected states on the first ``length`` tokens. ``(B, L) -> (B, m * n)``.

    ``length`` must reach every caption's end-of-text token (``model.context_groups`` sees to it).
    """
    tokens = tokens[:, :length]
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    ends = end_positions(clip, tokens)
    cast = clip.transformer.get_cast_dtype()
    x = clip.token_embedding(tokens).to(cast) + clip.positional_embedding[:length].to(cast)
    eot = clip.token_embedding(tokens[rows, ends]).to(cast)  # (B, width)
    extra = eot[:, None] + clip.class_positional_embedding.to(cast)  # (B, m - 1, width)
    x = torch.cat([x, extra], dim=1)
    heads = clip.transformer.resblocks[0].attn.num_heads
    mask = text_mask(ends, length, text_class_tokens(clip), heads, x.dtype)
    x = clip.ln_final(clip.transformer(x, attn_mask=mask))
    pooled = torch.cat([x[rows, ends][:, None], x[:, length:]], dim=1)  # (B, m, width)
    if isinstance(clip.text_projection, nn.Linear):
        pooled = clip.text_projection(pooled)
    elif clip.text_projection is not None:
        pooled = pooled @ clip.text_projection
    return pooled.reshape(pooled.shape[0], -1)


def extend(clip: open_clip.CLIP, tokens: int) -> None:
    """Give both towers of ``clip`` m = ``tokens`` class tokens, in place (see the module's docstring)."""
    if tokens < 2:
        return
    if not isinstance(clip, open_clip.CLIP) or clip.attn_mask is None or clip.text_pool_type not in ("argmax", "eos"):
        raise UsageError("model.class_tokens > 1 needs open_clip's causal text transformer pooled at end-of-text "
                         f"({type(clip).__name__} has another text tower)")
    if isinstance(clip.visual, VisionTransformer):
        MultiTokenViT.extend(clip.visual, tokens)
    elif isinstance(clip.visual, ModifiedResNet):
        MultiQueryAttentionPool.extend(clip.visual.attnpool, tokens)
    else:
        raise UsageError(f"model.class_tokens > 1 needs a ViT or ResNet image tower from open_clip, "
                         f"not {type(clip.visual).__name__} (a timm tower)")
    clip.class_positional_embedding = nn.Parameter(
        torch.randn(tokens - 1, clip.token_embedding.embedding_dim) * 0.01)  # open_clip's positional init
