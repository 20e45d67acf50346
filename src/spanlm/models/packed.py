"""Running a transformers encoder over a packed batch (:mod:`spanlm.data.packing`): the layout, not the kernels.

A packed batch is one stream of several blocks; each must attend only to itself and number its positions
from the start. Everything but the attention works token by token, so :func:`encoder_states` runs the
encoder on the stream as it is — no padding in the embeddings, linear layers and heads — and hands the
block boundaries to the attention as transformers' variable-length (FlashAttention) arguments:
``cu_seq_lens_q`` / ``cu_seq_lens_k`` (the cumulative lengths of the stream's segments) and
``max_length_q`` / ``max_length_k``, with no attention mask. This module holds that layout: the bounds
(``varlen_arguments``), the positions as each family numbers them (RoBERTa from ``padding_idx + 1``), each
token's block start (:func:`packed_block_starts`), the way back to one window per row (:func:`unpack_rows`),
which families can be packed and what ``data.packing`` resolves to (:func:`resolve_packing`).

The boundaries come with the batch: the data workers compute ``cu_seq_lens`` and the longest segment
``max_seq_len`` (a host ``int``) from the layout (:mod:`spanlm.data.packing`), and the model uses them as they
are, so a packed forward waits for the device nowhere. A caller that gives the positions alone (a model called
directly) has them derived from ``position_ids`` / ``attention_mask`` (``modeling_charbert.segment_bounds``): on a GPU
that costs a ``nonzero`` and a read of the longest segment, host syncs the training and evaluation paths
never make. BERT, RoBERTa and ELECTRA pass these keyword arguments from the model's forward down to their
attention function: transformers' ``flash_attention_2`` / ``flash_attention_3`` take them as they are, and any
other implementation is switched to ``"spanlm_varlen"`` (registered with transformers' ``AttentionInterface``).

How ``"spanlm_varlen"`` computes the attention is the device's speed backend's business
(:mod:`spanlm.accel.varlen`: per-segment SDPA on the CPU, FlashAttention's varlen kernel with dropout on CUDA,
the segments padded again elsewhere; the trainer sets it before the first forward, and it also decides
whether a device packs by default). Until a backend registers its own, the name means this module's portable
:func:`varlen_attention`: one SDPA call per segment, exact on every device, the bounds read on the host.
Padded batches take SDPA either way.

Padding inside a stream (CharBERT's one pad between blocks) forms segments of its own, so no block sees it.

DeBERTa-V2 / V3 computes disentangled relative-position scores over a whole row and transformers has no
variable-length path for it: its stream runs through spanlm's loop over the model's own modules
(:mod:`spanlm.models.packed_deberta`), every layer on the stream's tokens and the attention alone on the segments
laid out one per row (exact and sync-free; ``data.packing: auto`` pads it, ``true`` packs it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from spanlm.errors import ConfigError

# One copy of the bounds' derivation: the CharBERT modeling file, which imports nothing of spanlm, holds it.
from spanlm.models.modeling_charbert import varlen_arguments
from spanlm.models.packed_deberta import packed_deberta_states

VARLEN_ATTENTION = "spanlm_varlen"
# transformers' implementations that take cu_seq_lens_q / k themselves.
NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3")
VARLEN_FAMILIES = ("bert", "roberta", "electra")  # their models pass the varlen arguments to the attention
# Rotary positions from position_ids, the varlen arguments passed to the attention; ModernBERT's local layers add
# their sliding window, which every packed path keeps inside its block.
MODERN_FAMILIES = ("modernbert", "eurobert")
ATTENTION_FAMILIES = (*VARLEN_FAMILIES, *MODERN_FAMILIES)  # their attention function gets the varlen arguments
PACKABLE_FAMILIES = (*ATTENTION_FAMILIES, "deberta-v2")  # DeBERTa-V2: its attention laid out per segment


def expand_key_heads(x: Tensor, heads: int) -> Tensor:
    """Keys or values (R, key heads, W, d) of grouped-query attention (EuroBERT) repeated to ``heads``."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def per_block_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bounds: Tensor,
    dropout: float,
    scale: float | None,
    window: int | None = None,
) -> Tensor:
    """Attention within each segment of ``bounds`` (S + 1,) for token-major (T, heads, d) inputs: one SDPA call per
    segment on (heads, n, d) views (split's backward writes each gradient in place), a query seeing the keys at
    distance ≤ ``window`` when given. Returns (T, heads, d). Portable and exact on every device; the bounds are
    read on the host (a wait for an accelerator)."""
    lengths = (bounds[1:] - bounds[:-1]).tolist()

    def band(n: int) -> Tensor | None:  # (n, n): the keys a query of a segment of n tokens sees
        if window is None:
            return None
        within = torch.arange(n, device=query.device)
        return (within[:, None] - within[None, :]).abs() <= window

    return torch.cat(
        [
            F.scaled_dot_product_attention(
                q.transpose(0, 1),
                k.transpose(0, 1),
                v.transpose(0, 1),
                attn_mask=band(q.shape[0]),
                dropout_p=dropout,
                scale=scale,
            ).transpose(0, 1)
            for q, k, v in zip(query.split(lengths), key.split(lengths), value.split(lengths))
        ]
    )


def varlen_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    cu_seq_lens_q: Tensor | None = None,
    cu_seq_lens_k: Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    sliding_window: int | None = None,
    path=None,
    **kwargs,
):
    """transformers' attention interface, the portable default of ``"spanlm_varlen"``: ``query`` (R, heads, W, d),
    ``key`` / ``value`` (R, key heads, W, d) → (R, W, heads, d), no weights. With ``cu_seq_lens_q`` (a packed
    stream) each segment attends only to itself, a ModernBERT local layer's ``sliding_window`` (half window + 1,
    FlashAttention's inclusive convention) within it; else SDPA with the model's own mask. ``path(query)`` picks
    the function that attends over the stream (a device's, spanlm.accel.varlen): by default
    :func:`per_block_attention`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    rows, heads, width, head_dim = query.shape
    key, value = expand_key_heads(key, heads), expand_key_heads(value, heads)  # grouped-query attention (EuroBERT)
    # (R, heads, W, d) → (R·W, heads, d): token-major, so a segment is a slice of rows
    query, key, value = (x.transpose(1, 2).reshape(rows * width, heads, x.shape[-1]) for x in (query, key, value))
    window = None if sliding_window is None else sliding_window - 1
    if path is None:
        context = per_block_attention(query, key, value, cu_seq_lens_q, dropout, scaling, window)
    else:
        context = path(query)(query, key, value, cu_seq_lens_q, max_length_q, dropout, scaling, window)
    return context.view(rows, width, heads, head_dim), None  # context (R·W, heads, d)


def register_varlen_attention() -> None:
    """Make ``"spanlm_varlen"`` a transformers attention implementation, :func:`varlen_attention`, unless it is one
    already: a device's speed backend (spanlm.accel.varlen) registers its own paths under the name, and that
    registration stands. Its masks are SDPA's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if VARLEN_ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(VARLEN_ATTENTION, varlen_attention)
        AttentionMaskInterface.register(VARLEN_ATTENTION, sdpa_mask)


def use_varlen_attention(model: PreTrainedModel) -> None:
    """Give ``model`` an attention implementation that takes the varlen arguments (``"spanlm_varlen"`` unless
    it has one), in place: parameters, state-dict keys and the saved config are unchanged."""
    if model.config._attn_implementation not in (VARLEN_ATTENTION, *NATIVE_VARLEN):
        register_varlen_attention()
        model.set_attn_implementation(VARLEN_ATTENTION)


def packed_block_starts(position_ids: Tensor | None) -> Tensor | None:
    """(R·W,) the flat position where each token's block begins (its [CLS]) in a packed batch; None when
    ``position_ids`` is None or empty (a padded batch: one block per row)."""
    if position_ids is None or position_ids.numel() == 0:
        return None
    flat = position_ids.flatten()
    # A padding position (numbered 1) gets its left neighbour: a valid index, and padding is never scored.
    return torch.arange(flat.numel(), device=flat.device) - flat


def check_packable(model) -> None:
    """Refuse, naming why, an encoder that cannot run packed batches."""
    family = model.config.model_type
    if family not in PACKABLE_FAMILIES:
        raise ConfigError(
            f"data.packing: packed batches are supported for {', '.join(PACKABLE_FAMILIES)} encoders, "
            f"not '{family}'; set data.packing: false"
        )


def encoder_positions(model, position_ids: Tensor) -> Tensor:
    """Per-block positions as the encoder's position table numbers them."""
    if model.config.model_type == "roberta":
        return position_ids + model.config.pad_token_id + 1
    return position_ids


def encoder_states(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None = None,
    token_type_ids: Tensor | None = None,
    cu_seq_lens: Tensor | None = None,
    max_seq_len: int | None = None,
) -> Tensor:
    """The encoder's last hidden states (R, W, H): padded rows when ``position_ids`` is None or empty, else a
    packed stream (positions restarting at 0 per block), each block attending only to itself: within the
    segments of the batch's ``cu_seq_lens`` (S + 1,), the longest ``max_seq_len`` tokens, when it carries them
    (:mod:`spanlm.data.packing`), else of those derived from the positions (``varlen_arguments``)."""
    extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
    if position_ids is None or position_ids.numel() == 0:
        return model(input_ids=input_ids, attention_mask=attention_mask.long(), **extra).last_hidden_state
    if model.config.model_type not in ATTENTION_FAMILIES:
        return packed_deberta_states(
            model, input_ids, attention_mask, position_ids, token_type_ids, cu_seq_lens, max_seq_len
        )
    use_varlen_attention(model)
    if model.config.model_type == "eurobert":  # no token types
        extra = {}
    elif model.config.model_type == "modernbert":  # no token types; it builds a (T, T) mask per layer type unless
        extra = {"attention_mask": {"full_attention": None, "sliding_attention": None}}  # handed the mapping
    elif model.config._attn_implementation == VARLEN_ATTENTION:
        # Given positions and no mask, transformers' mask builder looks for packed sequences in the positions (a
        # host read) and builds a (T, T) mask of them; a 4-D mask it passes on as it is, and the varlen attention
        # reads the bounds, not a mask.
        extra["attention_mask"] = input_ids.new_ones((1, 1, 1, 1), dtype=torch.bool)
    return model(
        input_ids=input_ids,
        position_ids=encoder_positions(model, position_ids),
        **extra,
        **varlen_arguments(position_ids, attention_mask, cu_seq_lens, max_seq_len),
    ).last_hidden_state


def unpack_rows(hidden: Tensor, unpack_index: Tensor) -> Tensor:
    """Packed states (R, W, H) → one window per row (B, L, H), by the batch's ``unpack_index`` (B, L).

    Indexing, not ``index_select``: its backward accumulates the rows' gradients with one ``index_put_``, where
    ``index_select``'s goes through ``index_add_``, which the CPU runs a row at a time."""
    return hidden.flatten(0, 1)[unpack_index.flatten()].view(*unpack_index.shape, hidden.shape[-1])


def resolve_packing(
    setting: bool | str,
    objective: torch.nn.Module,
    packs_by_default: bool,
    compiled: bool = False,
    log: Callable[[str], None] | None = None,
) -> bool:
    """``data.packing`` as a run uses it. "auto" is ``packs_by_default`` — the device's choice, which its speed
    backend makes (spanlm.accel.varlen.packs_by_default, handed to the setups by the trainer) — where every
    encoder has a varlen path, and false for an objective or encoder that cannot be packed; true for one is
    refused. Under ``compiled`` (train.compile), true is false where an encoder's attention is laid out per segment
    inside the step (DeBERTa-V2): torch.compile's inductor failed on CUDA on the layout of a stream padded again,
    and this one has not been compiled on CUDA yet; ``log`` gets one line saying so."""
    if setting is False:
        return False
    encoders = [module for module in objective.modules() if isinstance(module, PreTrainedModel)]
    try:
        if not getattr(objective, "supports_packing", False):
            raise ConfigError(
                f"data.packing: objective {type(objective).__name__} reads one block per row only; "
                "set data.packing: false"
            )
        for encoder in encoders:
            check_packable(encoder)
    except ConfigError:
        if setting is True:
            raise
        return False
    if setting is True:
        per_segment = sorted({e.config.model_type for e in encoders if e.config.model_type not in ATTENTION_FAMILIES})
        if compiled and per_segment:
            if log is not None:
                log(
                    f"data.packing: true runs padded under train.compile: {', '.join(per_segment)} has no varlen path "
                    "(its attention is laid out per segment inside the step, not yet compiled on CUDA)"
                )
            return False
        return True
    varlen = all(encoder.config.model_type in VARLEN_FAMILIES for encoder in encoders)
    return varlen and packs_by_default
