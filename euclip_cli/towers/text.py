"""open_clip's causal text tower as euclip runs it: each caption on its shortest exact context, with
one class token (open_clip's end-of-text pooling) or m of them, Multi(n, m) (Sun and Li, TMLR,
section 3 and Figure 6), through one computation (``_context_features``).

Trimming. Under a causal mask no position attends to a later one, so the tokens after a caption's
pooled (end-of-text) token cannot change its pooled feature or its gradient; and the tower treats
each caption on its own (no batch statistics), so captions can run in groups, each group cut to the
longest of its captions. Towers without a causal mask, or pooling another position, run open_clip's
own ``encode_text`` on the full context.

Class tokens. Token 1 is the caption's own end-of-text token, as open_clip pools it; tokens 2..m are
the end-of-text token's embedding plus their own learnable absolute position embeddings
(``class_positional_embedding``; the paper: "different absolute positional embeddings for each class
token"), appended after the context. They attend to the caption up to and including its end-of-text
token and to each other; the caption's tokens do not attend to them, so the caption's own states,
token 1 included, are open_clip's. The paper's text tower is a bidirectional BERT whose class tokens
lead the sequence; under a causal mask a leading token would see nothing, hence the placement after
the caption. Each token's state goes through the tower's projection and the m results are
concatenated, ``(B, m * n)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import open_clip
import torch
from torch import nn

from euclip_cli.errors import UsageError

# Trimmed contexts are rounded up to a multiple of this: few distinct shapes for torch.compile to
# specialise on, few groups per batch, and matrix sizes the kernels like.
TRIM_MULTIPLE = 8
# ``model.text_groups`` unset, by the kind of device the towers are on. A CPU is bound by arithmetic,
# so every length gets its own group (0); a GPU running towers of these sizes is bound by launching
# kernels, and each group launches the whole text tower again (``euclip bench ops`` counts the
# operations; docs/measurements/2026-11-22-training-speed has the measurement behind the 2).
TEXT_GROUPS_BY_DEVICE = {"cpu": 0, "cuda": 2}


def groups_for(setting: Optional[int], device: torch.device) -> int:
    """The most length groups a batch of captions may run in (0: no limit) for ``model.text_groups``."""
    return TEXT_GROUPS_BY_DEVICE.get(device.type, 0) if setting is None else setting


def class_tokens(clip: nn.Module) -> int:
    """How many class tokens the text tower carries (1 for open_clip's own)."""
    extra = getattr(clip, "class_positional_embedding", None)
    return 1 if extra is None else 1 + extra.shape[0]


def trimmable(clip: nn.Module) -> bool:
    """Whether the tower is open_clip's causal text transformer pooled at end-of-text: the one whose
    captions can run on trimmed contexts and carry extra class tokens."""
    if not isinstance(clip, open_clip.CLIP) or clip.attn_mask is None:
        return False
    return (clip.text_pool_type == "argmax"
            or clip.text_pool_type == "eos" and getattr(clip, "text_eos_id", None) is not None)


def add_class_tokens(clip: open_clip.CLIP, tokens: int) -> None:
    """Give the text tower m = ``tokens`` > 1 class tokens, in place."""
    if not trimmable(clip):
        raise UsageError("model.class_tokens > 1 needs open_clip's causal text transformer pooled at end-of-text "
                         f"({type(clip).__name__} has another text tower)")
    clip.class_positional_embedding = nn.Parameter(
        torch.randn(tokens - 1, clip.token_embedding.embedding_dim) * 0.01)  # open_clip's positional init


def end_positions(clip: open_clip.CLIP, tokens: torch.Tensor) -> torch.Tensor:
    """Each caption's pooled (end-of-text) position, as open_clip's ``text_global_pool`` finds it. ``(B, L) -> (B,)``."""
    if clip.text_pool_type == "argmax":  # OpenAI's BPE: end-of-text has the largest id
        return tokens.argmax(dim=-1)
    return (tokens == clip.text_eos_id).int().argmax(dim=-1)


def class_token_mask(ends: torch.Tensor, length: int, tokens: int, heads: int, dtype: torch.dtype) -> torch.Tensor:
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


def _context_features(clip: open_clip.CLIP, tokens: torch.Tensor, length: int,
                      embedded: Optional[torch.Tensor] = None) -> torch.Tensor:
    """open_clip's ``CLIP.encode_text`` on the first ``length`` tokens, with the tower's class tokens.
    ``(B, L) -> (B, m * n)``; ``length`` must reach every caption's end-of-text token.

    ``CLIP.encode_text`` adds the full positional table and causal mask, so a shorter context cannot
    be passed to it; this is its computation with both sliced. ``embedded``, when given, is
    ``clip.token_embedding(tokens)`` ``(B, L, W)``, looked up once by the caller for several groups.
    """
    tokens = tokens[:, :length]
    embedded = clip.token_embedding(tokens) if embedded is None else embedded[:, :length]
    cast = clip.transformer.get_cast_dtype()
    x = embedded.to(cast) + clip.positional_embedding[:length].to(cast)
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    ends = end_positions(clip, tokens)
    m = class_tokens(clip)
    if m == 1:
        mask = clip.attn_mask[:length, :length]
    else:
        extra = embedded[rows, ends].to(cast)[:, None] + clip.class_positional_embedding.to(cast)  # (B, m - 1, W)
        x = torch.cat([x, extra], dim=1)
        mask = class_token_mask(ends, length, m, clip.transformer.resblocks[0].attn.num_heads, x.dtype)
    x = clip.ln_final(clip.transformer(x, attn_mask=mask))
    pooled = torch.cat([x[rows, ends][:, None], x[:, length:]], dim=1)  # (B, m, W)
    if isinstance(clip.text_projection, nn.Linear):
        pooled = clip.text_projection(pooled)
    elif clip.text_projection is not None:
        pooled = pooled @ clip.text_projection
    return pooled.reshape(pooled.shape[0], -1)


def _merge_lengths(lengths: list[int], counts: list[int], most: int) -> list[int]:
    """Which of the ascending ``lengths`` end a group when at most ``most`` groups may run: the cut that
    computes the fewest padded tokens (a group runs every caption at its longest length), by dynamic
    programming over the few distinct lengths. Returns the group lengths, ascending."""
    n = len(lengths)
    if most <= 0 or n <= most:
        return lengths
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    # cost[g][i]: fewest tokens covering the first i lengths with g groups; cut[g][i]: where the last starts.
    inf = float("inf")
    cost = [[inf] * (n + 1) for _ in range(most + 1)]
    cut = [[0] * (n + 1) for _ in range(most + 1)]
    cost[0][0] = 0
    for g in range(1, most + 1):
        for i in range(1, n + 1):
            for j in range(i):
                tokens = cost[g - 1][j] + (starts[i] - starts[j]) * lengths[i - 1]
                if tokens < cost[g][i]:
                    cost[g][i], cut[g][i] = tokens, j
    groups = min(range(1, most + 1), key=lambda g: cost[g][n])
    ends, i = [], n
    for g in range(groups, 0, -1):
        ends.append(lengths[i - 1])
        i = cut[g][i]
    return ends[::-1]


def _length_groups(clip: nn.Module, tokens: torch.Tensor, max_groups: int
                   ) -> Optional[tuple[torch.Tensor, list[int]]]:
    """``(each caption's group (B,), the groups' context lengths ascending)``, or None where trimming is
    not exact. Each caption goes to the group of its pooled position rounded up to ``TRIM_MULTIPLE``;
    with ``max_groups`` > 0, neighbouring lengths merge into at most that many groups (``_merge_lengths``)."""
    if not trimmable(clip):
        return None
    ends = end_positions(clip, tokens)
    rounded = ((ends + TRIM_MULTIPLE) // TRIM_MULTIPLE * TRIM_MULTIPLE).clamp_max(tokens.shape[1])
    distinct, counts = rounded.unique(return_counts=True)
    lengths = _merge_lengths(distinct.tolist(), counts.tolist(), max_groups)
    return torch.bucketize(rounded, torch.tensor(lengths)), lengths  # each caption's first group long enough


def context_groups(clip: nn.Module, tokens: torch.Tensor, max_groups: int = 0
                   ) -> Optional[list[tuple[torch.Tensor, int]]]:
    """``[(sample indices, context length), ...]`` covering the batch ``tokens (B, L)`` (on the host),
    ascending in length, or None where trimming is not exact."""
    found = _length_groups(clip, tokens, max_groups)
    if found is None:
        return None
    group_of, lengths = found
    return [((group_of == g).nonzero().squeeze(1), length) for g, length in enumerate(lengths)]


@dataclass(frozen=True)
class TextPlan:
    """How one batch of captions runs through the text tower, decided on the host: the size and
    context length of each group, ascending in length (``context_groups``). With it the towers
    can run on a GPU without reading anything back: the device sorts its own copy of the tokens
    by end-of-text position, which puts the same captions in the same groups."""

    sizes: tuple[int, ...]
    lengths: tuple[int, ...]


def text_plan(clip: nn.Module, tokens: torch.Tensor, max_groups: int = 0) -> Optional[TextPlan]:
    """The plan for ``tokens (B, L)`` on the host, or None where trimming is not exact."""
    found = _length_groups(clip, tokens, max_groups)
    if found is None:
        return None
    group_of, lengths = found
    return TextPlan(tuple(group_of.bincount(minlength=len(lengths)).tolist()), tuple(lengths))


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device``. A host tensor bound for a GPU goes through pinned memory: a copy from
    pageable memory would wait for the GPU's queue to drain first."""
    if x.device == device:
        return x
    if device.type == "cuda" and x.device.type == "cpu" and not x.is_pinned():
        x = x.pin_memory()
    return x.to(device, non_blocking=True)


def text_features(clip: nn.Module, tokens: torch.Tensor, plan: Optional[TextPlan] = None,
                  max_groups: int = 0) -> torch.Tensor:
    """``clip.encode_text(tokens)`` (with the tower's class tokens) computed on each caption's shortest
    exact context. ``(B, L) -> (B, m * n)`` on the towers' device, rows in the input's order.

    ``plan``: the groups, decided on the host from a host copy of the same tokens (the trainer passes
    one, so that a step never reads a device tensor back); without it the plan is made here, from
    ``tokens`` (a GPU tensor is read back for it, a synchronisation). The device sorts its own tokens
    by end-of-text position (a stable sort), which puts each caption in its planned group with no
    index crossing over.
    """
    device = next(clip.parameters()).device
    if plan is None and trimmable(clip):
        plan = text_plan(clip, tokens.cpu(), max_groups)
    tokens = _to_device(tokens, device)
    if plan is None:  # a tower trimming would not be exact on: open_clip's own computation
        return clip.encode_text(tokens)
    if len(plan.sizes) == 1:  # one group: the batch cut to its longest caption, in its own order
        return _context_features(clip, tokens, plan.lengths[0])
    order = end_positions(clip, tokens).argsort(stable=True)
    grouped = tokens[order]
    # One lookup for the batch: the backward of each lookup fills a gradient the size of the whole
    # vocabulary table (49,408 rows), so a lookup per group would repeat that fill per group.
    embedded = clip.token_embedding(grouped).split(plan.sizes)
    features = [_context_features(clip, part, length, part_embedded) for length, part, part_embedded
                in zip(plan.lengths, grouped.split(plan.sizes), embedded)]
    return torch.cat(features)[order.argsort()]
