"""Packed batches (:mod:`spanlm.data.packing`) on the modern families, ModernBERT and EuroBERT, through their own
transformers attention path.

Both number positions by rotation from ``position_ids`` alone, so a packed stream needs its positions restarting
at each block (RoPE then rotates each block as if it were alone) and the block boundaries handed to the attention
as transformers' variable-length keyword arguments (``cu_seq_lens_q`` / ``_k``, ``max_length_q`` / ``_k``), which
both models pass from their forward down to the attention function, as BERT does.

ModernBERT's local layers give the attention function a ``sliding_window`` (its config's half window + 1, flash
attention's inclusive convention: a token sees those at distance ≤ ``local_attention / 2``). FlashAttention's own
varlen kernel (``flash_attention_2`` / ``_3``) applies it within each sequence; every other implementation is
switched to ``"spanlm_varlen_window"`` (:func:`windowed_varlen_attention`): the segments padded again to the
longest and one SDPA call over them with a key mask — banded for a local layer — so a block attends only to
itself, and a local layer's window never reaches into the next block. The model is called with no padding mask
(ModernBERT gets the empty per-layer-type mapping, which skips building masks over the stream).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from spanlm.models.modeling_charbert import varlen_arguments

WINDOWED_VARLEN = "spanlm_varlen_window"
NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3")  # transformers' kernels that take the varlen arguments


def windowed_varlen_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    cu_seq_lens_q: Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs,
):
    """transformers' attention interface: ``query`` (R, heads, W, d), ``key`` / ``value`` (R, kv heads, W, d) →
    (R, W, heads, d). With ``cu_seq_lens_q`` (a packed stream) each segment attends only to itself, within
    ``sliding_window - 1`` tokens when given; else transformers' SDPA with the model's own mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    rows, heads, width, head_dim = query.shape
    if key.shape[1] != heads:  # grouped-query attention (EuroBERT's num_key_value_heads): one key per query head
        key, value = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (key, value))
    # (R, heads, W, d) → (R·W, heads, d): token-major, so a segment is a run of rows
    query, key, value = (x.transpose(1, 2).reshape(rows * width, heads, head_dim) for x in (query, key, value))
    half = None if sliding_window is None else sliding_window - 1
    context = windowed_segments(query, key, value, cu_seq_lens_q, max_length_q, half, dropout, scaling)
    return context.view(rows, width, heads, head_dim), None


def windowed_segments(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bounds: Tensor,
    longest: int,
    half_window: int | None,
    dropout: float,
    scaling: float | None,
) -> Tensor:
    """Attention within each segment ``[bounds[s], bounds[s + 1])`` of token-major (T, heads, d) inputs, a query
    seeing the keys at distance ≤ ``half_window`` (None: the whole segment), as one SDPA call over the segments
    padded to ``longest``: device operations only. Returns (T, heads, d)."""
    tokens, heads, head_dim = query.shape
    bounds = bounds.long()
    position = torch.arange(tokens, device=query.device)
    segment = torch.searchsorted(bounds[1:], position, right=True)  # (T,) each token's segment
    padded = segment * longest + position - bounds[segment]  # (T,) its place in the (S, longest) layout
    segments = bounds.numel() - 1

    def by_segment(x: Tensor) -> Tensor:  # (T, heads, d) → (S, heads, longest, d)
        rows = x.new_zeros(segments * longest, heads, x.shape[-1]).index_copy(0, padded, x)
        return rows.view(segments, longest, heads, -1).transpose(1, 2)

    within = torch.arange(longest, device=query.device)
    allowed = (within < (bounds[1:] - bounds[:-1]).unsqueeze(1))[:, None, None, :]  # (S, 1, 1, longest): real keys
    if half_window is not None:
        band = (within[:, None] - within[None, :]).abs() <= half_window  # (longest, longest)
        allowed = allowed & band  # (S, 1, longest, longest)
    context = F.scaled_dot_product_attention(
        by_segment(query), by_segment(key), by_segment(value), attn_mask=allowed, dropout_p=dropout, scale=scaling
    )  # (S, heads, longest, d)
    return context.transpose(1, 2).reshape(segments * longest, heads, head_dim).index_select(0, padded)


def register_windowed_varlen() -> None:
    """Make ``"spanlm_varlen_window"`` a transformers attention implementation (idempotent); its masks (of padded
    batches) are SDPA's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(WINDOWED_VARLEN, windowed_varlen_attention)
    AttentionMaskInterface.register(WINDOWED_VARLEN, sdpa_mask)


def modern_states(
    model, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cu_seq_lens=None, max_seq_len=None
) -> Tensor:
    """A packed stream's last hidden states (R, W, H) from a ModernBERT / EuroBERT ``model``, every block attending
    only to itself (its positions restarting at 0), a local layer's window inside its block."""
    if model.config._attn_implementation not in (WINDOWED_VARLEN, *NATIVE_VARLEN):
        register_windowed_varlen()
        model.set_attn_implementation(WINDOWED_VARLEN)
    # ModernBERT builds a (T, T) mask per layer type unless handed the mapping: none is needed here
    masks = {"full_attention": None, "sliding_attention": None} if model.config.model_type == "modernbert" else None
    return model(
        input_ids=input_ids,
        attention_mask=masks,
        position_ids=position_ids,
        **varlen_arguments(position_ids, attention_mask, cu_seq_lens, max_seq_len),
    ).last_hidden_state
