"""Running a transformers encoder over a packed batch (:mod:`spanlm.data.packing`): variable-length attention.

A packed batch is one stream of several blocks; each must attend only to itself and number its positions
from the start. Everything but the attention works token by token, so :func:`encoder_states` runs the
encoder on the stream as it is — no padding in the embeddings, linear layers and heads — and hands the
block boundaries to the attention as transformers' variable-length (FlashAttention) arguments:
``cu_seq_lens_q`` / ``cu_seq_lens_k`` (the cumulative lengths of the stream's segments) and
``max_length_q`` / ``max_length_k``, with no attention mask.

The boundaries come with the batch: the data workers compute ``cu_seq_lens`` and the longest segment
``max_seq_len`` (a host ``int``) from the layout (:mod:`spanlm.data.packing`), and the model uses them as they
are, so a packed forward waits for the device nowhere. A caller that gives the positions alone (a model called
directly) has them derived from ``position_ids`` / ``attention_mask`` (``modeling_charbert.segment_bounds``): on a GPU
that costs a ``nonzero`` and a read of the longest segment, host syncs the training and evaluation paths
never make. BERT, RoBERTa and ELECTRA pass these keyword arguments from the model's forward down to their
attention function, and

* transformers' ``flash_attention_2`` / ``flash_attention_3`` take them as they are;
* every other implementation is switched to ``"spanlm_varlen"`` (:func:`varlen_attention`, registered with
  transformers' ``AttentionInterface``): per block, never through a (T, T) mask over the stream. On the CPU
  one SDPA call per block on views of the stream (faster there than grouping blocks of similar length,
  nested jagged tensors or padding the blocks again: BENCHMARKS.md);
  on CUDA in half precision without dropout PyTorch's own varlen kernel (``torch.nn.attention.varlen``),
  else one SDPA call over all blocks padded again to the longest (grouping would wait for the bounds on the
  host). Padded batches take transformers' SDPA;
* spanlm's fused CPU self-attention (:mod:`spanlm.accel.attention`) reads the same arguments, and attends
  per group of blocks of similar length (:func:`segment_groups`).

Padding inside a stream (CharBERT's one pad between blocks) forms segments of its own, so no block sees it.
Positions go to the embeddings as the family numbers them (RoBERTa from ``padding_idx + 1``).

DeBERTa-V2 / V3 computes disentangled relative-position scores over a whole row and transformers has no
variable-length path for it, so its packed batch is run padded: cut back into one block per row for the
encoder, its states gathered back into the stream (exact, but no faster: ``data.packing: auto`` pads it).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from spanlm.errors import ConfigError

# One copy of the bounds' derivation: the CharBERT modeling file, which imports nothing of spanlm, holds it.
from spanlm.models.modeling_charbert import varlen_arguments
from spanlm.models.packed_modern import modern_states

VARLEN_ATTENTION = "spanlm_varlen"
# transformers' implementations that take cu_seq_lens_q / k themselves.
NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3")
VARLEN_FAMILIES = ("bert", "roberta", "electra")  # their models pass the varlen arguments to the attention
MODERN_FAMILIES = ("modernbert", "eurobert")  # their own varlen path: spanlm.models.packed_modern
PACKABLE_FAMILIES = (*VARLEN_FAMILIES, "deberta-v2", *MODERN_FAMILIES)  # DeBERTa-V2: run padded inside the encoder


@dataclasses.dataclass(frozen=True)
class SegmentGroup:
    """Segments of similar length attended together: ``count`` rows of ``length`` slots, one segment a row.

    ``start``: the first stream position of the group's first segment (a lone segment is a slice of the
    stream); ``slots`` (count·length,): the stream position each slot reads (a padding slot repeats its
    segment's first token; it is masked as a key and its query discarded); ``real`` (count, length): the
    slot holds a token of its segment; ``real_slots``: the flat indices of those slots, ``tokens`` their
    stream positions.
    """

    count: int
    length: int
    start: int
    slots: Tensor
    real: Tensor
    real_slots: Tensor
    tokens: Tensor


# A group takes the next-longest segment while the scores (per head) its padding to the group's longest adds
# stay within this budget: short segments share one product (each product, softmax and dropout call is a
# parallel region of its own, a fixed cost that dominates short segments), long ones keep their own (their
# padding would cost more than the call).
GROUP_PADDING = 96 * 96


def segment_groups(bounds: list[int], padding: int = GROUP_PADDING) -> list[SegmentGroup]:
    """The segments ``[bounds[i], bounds[i + 1])`` of a stream in groups of similar length, longest first."""
    lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    members: list[list[int]] = []  # segment numbers per group, longest first (ties in stream order)
    for segment in sorted(range(len(lengths)), key=lambda number: -lengths[number]):
        group = members[-1] if members else []
        area = sum(lengths[member] ** 2 for member in group) + lengths[segment] ** 2
        if group and (len(group) + 1) * lengths[group[0]] ** 2 - area <= padding:
            group.append(segment)
        else:
            members.append([segment])
    groups = []
    for group in members:
        length = lengths[group[0]]
        within = torch.arange(length)
        real = within < torch.tensor([lengths[member] for member in group]).unsqueeze(1)  # (count, length)
        slots = (
            torch.tensor([bounds[member] for member in group]).unsqueeze(1) + torch.where(real, within, 0)
        ).flatten()
        real_slots = real.flatten().nonzero().flatten()
        groups.append(SegmentGroup(len(group), length, bounds[group[0]], slots, real, real_slots, slots[real_slots]))
    return groups


def torch_varlen_applies(query: Tensor, dropout: float) -> bool:
    """Whether PyTorch's varlen kernel (FlashAttention, CUDA, half precision, no dropout) takes ``query``."""
    return (
        query.is_cuda
        and query.dtype in (torch.float16, torch.bfloat16)
        and dropout == 0.0
        and not torch.compiler.is_compiling()
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
    **kwargs,
):
    """transformers' attention interface: ``query`` / ``key`` / ``value`` (R, heads, W, d) → (R, W, heads, d), no
    weights. With ``cu_seq_lens_q`` (a packed stream) each segment attends only to itself; else SDPA as usual."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    rows, heads, width, head_dim = query.shape
    # (R, heads, W, d) → (R·W, heads, d): token-major, so a segment is a slice of rows
    query, key, value = (x.transpose(1, 2).reshape(rows * width, heads, x.shape[-1]) for x in (query, key, value))
    if torch_varlen_applies(query, dropout):
        from torch.nn.attention.varlen import varlen_attn

        context = varlen_attn(
            query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, scale=scaling
        )
    elif query.device.type == "cpu":  # the bounds are in host memory: nothing to wait for
        lengths = (cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).tolist()
        # One SDPA call per segment on (heads, n, d) views; split's backward writes each gradient in place.
        context = torch.cat(
            [
                F.scaled_dot_product_attention(
                    q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), dropout_p=dropout, scale=scaling
                ).transpose(0, 1)
                for q, k, v in zip(query.split(lengths), key.split(lengths), value.split(lengths))
            ]
        )  # (R·W, heads, d)
    else:  # on an accelerator a loop would wait for the bounds: one SDPA call over the segments padded again
        context = segments_padded_attention(query, key, value, cu_seq_lens_q, max_length_q, dropout, scaling)
    return context.view(rows, width, heads, head_dim), None


def segments_padded_attention(
    query: Tensor, key: Tensor, value: Tensor, bounds: Tensor, longest: int, dropout: float, scaling: float | None
) -> Tensor:
    """Attention within each segment of ``bounds`` for token-major (T, heads, d) inputs, as one SDPA call over the
    segments padded to ``longest`` with a key mask: only device operations, no host read. Returns (T, heads, d)."""
    tokens, heads, head_dim = query.shape
    bounds = bounds.long()
    position = torch.arange(tokens, device=query.device)
    segment = torch.searchsorted(bounds[1:], position, right=True)  # (T,) each token's segment
    padded = segment * longest + position - bounds[segment]  # (T,) its place in the (S, longest) layout
    segments = bounds.numel() - 1

    def by_segment(x: Tensor) -> Tensor:  # (T, heads, d) → (S, heads, longest, d)
        rows = x.new_zeros(segments * longest, heads, x.shape[-1]).index_copy(0, padded, x)
        return rows.view(segments, longest, heads, -1).transpose(1, 2)

    keys = torch.arange(longest, device=query.device) < (bounds[1:] - bounds[:-1]).unsqueeze(1)  # (S, longest)
    context = F.scaled_dot_product_attention(
        by_segment(query),
        by_segment(key),
        by_segment(value),
        attn_mask=keys[:, None, None, :],
        dropout_p=dropout,
        scale=scaling,
    )
    return context.transpose(1, 2).reshape(segments * longest, heads, head_dim).index_select(0, padded)


def register_varlen_attention() -> None:
    """Make ``"spanlm_varlen"`` a transformers attention implementation (idempotent); its masks are SDPA's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

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
    if model.config.model_type in MODERN_FAMILIES:
        return modern_states(model, input_ids, attention_mask, position_ids, cu_seq_lens, max_seq_len)
    if model.config.model_type not in VARLEN_FAMILIES:
        return repadded_states(model, input_ids, attention_mask, position_ids, token_type_ids)
    use_varlen_attention(model)
    return model(
        input_ids=input_ids,
        position_ids=encoder_positions(model, position_ids),
        **extra,
        **varlen_arguments(position_ids, attention_mask, cu_seq_lens, max_seq_len),
    ).last_hidden_state


def repadded_states(
    model, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, token_type_ids: Tensor | None = None
) -> Tensor:
    """A packed stream's states (R, W, H) computed one block per row: for encoders without a varlen path."""
    real = attention_mask.flatten().bool()  # (T,)
    positions = position_ids.flatten()
    block = torch.cumsum(real & (positions == 0), 0) - 1  # (T,) each token's block
    stream = real.nonzero().flatten()  # (N,) the real tokens' stream positions
    blocks, length = int(block[-1]) + 1, int(positions[stream].max()) + 1
    padded = (block * length + positions)[stream]  # (N,) their flat positions in the (blocks, length) layout

    def one_block_per_row(values: Tensor, fill: int) -> Tensor:
        return (
            values.new_full((blocks * length,), fill)
            .index_copy(0, padded, values.flatten()[stream])
            .view(blocks, length)
        )

    extra = {} if token_type_ids is None else {"token_type_ids": one_block_per_row(token_type_ids, 0)}
    hidden = model(
        input_ids=one_block_per_row(input_ids, model.config.pad_token_id or 0),
        attention_mask=one_block_per_row(attention_mask.long(), 0),
        **extra,
    ).last_hidden_state  # (blocks, length, H)
    states = hidden.new_zeros(real.numel(), hidden.shape[-1]).index_copy(
        0, stream, hidden.flatten(0, 1).index_select(0, padded)
    )
    return states.view(*input_ids.shape, -1)


def unpack_rows(hidden: Tensor, unpack_index: Tensor) -> Tensor:
    """Packed states (R, W, H) → one window per row (B, L, H), by the batch's ``unpack_index`` (B, L)."""
    return hidden.flatten(0, 1).index_select(0, unpack_index.flatten()).view(*unpack_index.shape, hidden.shape[-1])


# Devices on which packed batches measured at least as fast as padded ones (bench/packing.py, BENCHMARKS.md):
# what data.packing: auto becomes there.
PACKED_BY_DEFAULT = {"cpu": True}  # not yet measured on a GPU: padded there until it is


def resolve_packing(setting: bool | str, objective: torch.nn.Module, device: torch.device | str) -> bool:
    """``data.packing`` as a run uses it. "auto" is the device's default (PACKED_BY_DEFAULT) where every encoder
    has a varlen path, and false for an objective or encoder that cannot be packed; true for one is refused."""
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
        return True
    varlen = all(encoder.config.model_type in VARLEN_FAMILIES for encoder in encoders)
    return varlen and PACKED_BY_DEFAULT.get(torch.device(device).type, False)
