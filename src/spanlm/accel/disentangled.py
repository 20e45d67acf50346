"""DeBERTa-V2 / V3's disentangled self-attention through fused attention kernels.

He et al. 2021 (DeBERTa, §3.1; V3 keeps it): the score of query ``i`` for key ``j`` is

    (q_i·k_j + q_i·Kr[δ(i, j)] + k_j·Qr[δ(i, j)]) / √(d·f)

with ``Kr`` / ``Qr`` the relative-position embeddings projected as keys / queries, ``δ(i, j)`` the bucketed,
clamped relative distance and ``f`` 1 plus the number of relative terms. transformers computes it eagerly: the
content scores as one (B·H, L, L) product, each relative term gathered to (B·H, L, L), then a masked softmax,
dropout and a second product, every one a pass over L × L scores and autograd's copy of it backwards.

Here the relative terms stay what they are before the gather — ``q·Krᵀ`` and ``k·Qrᵀ``, (B, H, L, 2k) for ``2k``
relative buckets — and the attention is one kernel call that adds them:

* ``"flex"`` (CUDA, no attention dropout): FlexAttention with a score modification that reads both terms at
  ``δ(i, j)`` inside the kernel, so no L × L tensor is ever written, and a block mask of the keys that are tokens;
* ``"sdpa"`` (otherwise): the two terms gathered into one (B, H, L, L) bias, then
  ``scaled_dot_product_attention`` with it as its additive mask (its fused kernels, attention dropout included):
  the softmax, dropout and second product in one kernel.

Padding as transformers masks it: a key that is padding gets the lowest float (its query's row, when the query
is padding too, spreads evenly, as the masked softmax does); the flex path leaves a padding query's output
unspecified (nothing reads it). The same parameters, state-dict keys and configs: the module's class changes
only (:func:`use_fused_disentangled_attention`), and its own forward runs where this one does not apply
(attention weights asked for, queries of another length than the keys). The relative positions are the
encoder's own (``build_relative_position`` over the row, as ``DebertaV2Encoder`` always passes them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention, make_log_bucket_position

from spanlm.accel.subclasses import use_subclasses
from spanlm.models.packed_deberta import PackedDisentangledSelfAttention, SegmentLayout


def _relative_buckets(length: int, span: int, buckets: int, max_position: int, device: torch.device) -> Tensor:
    """(2·length − 1,) int64: for the offset ``i − j + length − 1``, the clamped bucket ``δ(i, j) + span`` that
    indexes the relative terms (transformers' ``build_relative_position`` and clamp, by offset instead of by pair)."""
    offsets = torch.arange(-(length - 1), length, device=device)
    if buckets > 0 and max_position > 0:
        offsets = make_log_bucket_position(offsets, buckets, max_position).to(torch.long)
    return torch.clamp(offsets + span, 0, 2 * span - 1)


def _pair_index(offsets: Tensor, length: int) -> Tensor:
    """(L, L): the bucket of every (query, key) pair from the per-offset buckets."""
    positions = torch.arange(length, device=offsets.device)
    return offsets[positions[:, None] - positions[None, :] + length - 1]


class FusedDisentangledSelfAttention(PackedDisentangledSelfAttention):
    """transformers' ``DisentangledSelfAttention`` computed by one fused attention call (module docstring); given a
    packed stream's :class:`SegmentLayout`, it projects the stream and lays out only the queries, keys and values."""

    def forward(
        self,
        hidden_states,
        attention_mask,
        output_attentions=False,
        query_states=None,
        relative_pos=None,
        rel_embeddings=None,
    ):
        layout = attention_mask if isinstance(attention_mask, SegmentLayout) else None
        if layout is None and (
            output_attentions or (query_states is not None and query_states.shape[1] != hidden_states.shape[1])
        ):
            return super().forward(
                hidden_states, attention_mask, output_attentions, query_states, relative_pos, rel_embeddings
            )
        if query_states is None:
            query_states = hidden_states
        heads = self.num_attention_heads
        # (B, L, H·d) → (B, L, H, d)
        query = self.query_proj(query_states).unflatten(-1, (heads, -1))
        key = self.key_proj(hidden_states).unflatten(-1, (heads, -1))
        value = self.value_proj(hidden_states).unflatten(-1, (heads, -1))
        if layout is not None:  # the stream (1, T, H, d) → its segments one per row (S, W, H, d)
            query, key, value = (layout.pad(x[0]) for x in (query, key, value))
            attention_mask = layout.attention_mask
        query, key, value = (x.transpose(1, 2) for x in (query, key, value))  # (B, H, L, d)
        length = query.shape[2]
        factor = 1 + ("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type)
        scale = 1.0 / (query.shape[-1] * factor) ** 0.5
        c2p = p2c = offsets = None
        if self.relative_attention:
            span = self.pos_ebd_size
            offsets = _relative_buckets(length, span, self.position_buckets, self.max_relative_positions, query.device)
            rel = self.pos_dropout(rel_embeddings)[: 2 * span]  # (2k, hidden)
            if "c2p" in self.pos_att_type:
                projection = self.key_proj if self.share_att_key else self.pos_key_proj
                positions = projection(rel).unflatten(-1, (heads, -1)).transpose(0, 1)  # (H, 2k, d)
                c2p = torch.matmul(query, positions.transpose(-1, -2)) * scale  # (B, H, L, 2k)
            if "p2c" in self.pos_att_type:
                projection = self.query_proj if self.share_att_key else self.pos_query_proj
                positions = projection(rel).unflatten(-1, (heads, -1)).transpose(0, 1)
                p2c = torch.matmul(key, positions.transpose(-1, -2)) * scale  # (B, H, L, 2k), by key
        dropout = self.dropout.p if self.training else 0.0
        mask = attention_mask.bool()  # (B, 1, L, L): query and key both tokens
        if query.is_cuda and dropout == 0.0:
            context = _flex(query, key, value, mask, c2p, p2c, offsets, scale)
        else:
            context = _sdpa(query, key, value, mask, c2p, p2c, offsets, scale, dropout)
        context = context.transpose(1, 2).flatten(2)  # (B, L, H·d)
        return (context, None) if layout is None else (layout.unpad(context)[None], None)


def _sdpa(query, key, value, mask, c2p, p2c, offsets, scale: float, dropout: float) -> Tensor:
    length = query.shape[2]
    bias = torch.zeros((), dtype=query.dtype, device=query.device)
    if offsets is not None:
        pairs = _pair_index(offsets, length)  # (L, L)
        if c2p is not None:
            bias = bias + torch.gather(c2p, -1, pairs.expand(*c2p.shape[:2], length, length))
        if p2c is not None:  # by key j: its term at δ(i, j), gathered along j's row and turned to (i, j)
            bias = bias + torch.gather(p2c, -1, pairs.t().expand(*p2c.shape[:2], length, length)).transpose(-1, -2)
    bias = torch.where(mask, bias, torch.finfo(query.dtype).min)  # (B, H or 1, L, L)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout, scale=scale)


_COMPILED_FLEX = None


def _flex_kernel(query: Tensor):
    """FlexAttention as it runs fast: compiled on CUDA outside a compiled model (uncompiled it is a reference
    loop), as it is inside one (the model's compile takes it in). Padded rows change length from batch to batch:
    torch.compile's automatic dynamic shapes make the length symbolic at its second value, not a compile per length."""
    from torch.nn.attention.flex_attention import flex_attention

    global _COMPILED_FLEX
    if not query.is_cuda or torch.compiler.is_compiling():
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention)
    return _COMPILED_FLEX


def _flex(query, key, value, mask, c2p, p2c, offsets, scale: float) -> Tensor:
    from torch.nn.attention.flex_attention import create_block_mask

    batch, _, length, _ = query.shape
    is_token = mask[:, 0].any(-2)  # (B, L): the keys that are tokens
    last = length - 1

    def keys_that_are_tokens(b, h, i, j):
        return is_token[b, j]

    def relative_terms(score, b, h, i, j):
        bucket = offsets[i - j + last]
        if c2p is not None:
            score = score + c2p[b, h, i, bucket]
        if p2c is not None:
            score = score + p2c[b, h, j, bucket]
        return score

    blocks = create_block_mask(keys_that_are_tokens, batch, None, length, length, device=query.device)
    return _flex_kernel(query)(
        query, key, value, score_mod=relative_terms if offsets is not None else None, block_mask=blocks, scale=scale
    )


FUSED = {
    DisentangledSelfAttention: FusedDisentangledSelfAttention,
    PackedDisentangledSelfAttention: FusedDisentangledSelfAttention,
}


def use_fused_disentangled_attention(model) -> None:
    """Make every DeBERTa-V2 self-attention module of ``model`` a :class:`FusedDisentangledSelfAttention`, in place."""
    use_subclasses(model, FUSED)
