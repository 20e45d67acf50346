"""Attention over a packed stream, per device: the paths by name, the one a device takes, and whether it packs.

A packed batch (:mod:`spanlm.data.packing`) is one stream of blocks, each attending only to itself; the
model hands the block bounds to its attention function as transformers' variable-length arguments
(``cu_seq_lens_q`` (S + 1,) int32, ``max_length_q`` an int; :mod:`spanlm.models.packed`). How that
attention is computed is the device's business, so it lives here, as transformers organises its attention
functions: each path is a function of ``query`` / ``key`` / ``value`` token-major (T, heads, d), the bounds,
the longest segment, the dropout and the scale, registered by name in :data:`PACKED_PATHS`:

* ``"segments"`` — one SDPA call per segment on views of the stream (:func:`spanlm.models.packed.per_block_attention`,
  also the model's own portable default). The bounds are read on the host: free on the CPU, where the
  bounds live in host memory, and faster there than one padded product;
* ``"flash"`` — FlashAttention-2's variable-length kernel on CUDA in half precision: with dropout through
  ``torch.ops.aten._flash_attention_forward`` / ``_backward`` (the kernel draws its dropout from the CUDA
  generator's Philox stream and returns the seed and offset it used, which the backward pass hands back to
  regenerate the same mask: Dao 2023, FlashAttention-2, §3.1), without dropout PyTorch's own
  ``torch.nn.attention.varlen.varlen_attn`` — no padding and no mask in either;
* ``"repadded"`` — one SDPA call over the segments padded again to the longest, with a key mask: only
  device operations, no host read; what a device without a varlen kernel (or float32 on CUDA, which
  FlashAttention does not take) runs, and what ``torch.compile`` traces on the CPU (the per-segment loop
  would read the bounds inside the graph).

:func:`packed_attention` is registered with transformers' ``AttentionInterface`` as ``"spanlm_varlen"``, the
name the model layer gives a packed encoder: it picks the path per call (:func:`path_for`: the device's
entry in :data:`DEVICE_PATHS`, else ``"repadded"``) and sends a padded batch to SDPA. :func:`use_packed_attention`
(from :func:`spanlm.accel.apply`) registers it and sets every packed encoder to it before the first forward,
so no switch happens inside a traced forward. A new backend or family adds a path with :func:`register_path`
and names it for its device in :data:`DEVICE_PATHS`.

Whether ``data.packing: auto`` packs on a device is this backend's decision too (:data:`PACKED_BY_DEFAULT`,
:func:`packs_by_default`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spanlm.models.packed import (
    ATTENTION_FAMILIES,
    NATIVE_VARLEN,
    VARLEN_ATTENTION,
    per_block_attention,
    varlen_attention,
)
from spanlm.models.packed_deberta import padded_places, use_packed_disentangled_attention

# (query, key, value (T, heads, d), bounds (S + 1,) int32, longest: int, dropout: float, scale, window) →
# (T, heads, d); window: a query sees the keys of its segment at distance ≤ window (None: all of them)
PackedPath = Callable[[Tensor, Tensor, Tensor, Tensor, int, float, "float | None", "int | None"], Tensor]


def repadded_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bounds: Tensor,
    longest: int,
    dropout: float,
    scale: float | None,
    window: int | None = None,
) -> Tensor:
    """Attention within each segment of ``bounds`` for token-major (T, heads, d) inputs, as one SDPA call over the
    segments padded to ``longest`` with a key mask (banded with a ``window``): only device operations, no host
    read. Returns (T, heads, d)."""
    tokens, heads, head_dim = query.shape
    bounds = bounds.long()
    padded = padded_places(bounds, longest, tokens)  # (T,) each token's place in the (S, longest) layout
    segments = bounds.shape[0] - 1

    def by_segment(x: Tensor) -> Tensor:  # (T, heads, d) → (S, heads, longest, d)
        rows = x.new_zeros(segments * longest, heads, x.shape[-1]).index_copy(0, padded, x)
        return rows.view(segments, longest, heads, -1).transpose(1, 2)

    within = torch.arange(longest, device=query.device)
    allowed = (within < (bounds[1:] - bounds[:-1]).unsqueeze(1))[:, None, None, :]  # (S, 1, 1, longest): real keys
    if window is not None:  # (S, 1, longest, longest): and near enough (a local layer never reaches the next block)
        allowed = allowed & ((within[:, None] - within[None, :]).abs() <= window)
    context = F.scaled_dot_product_attention(
        by_segment(query),
        by_segment(key),
        by_segment(value),
        attn_mask=allowed,
        dropout_p=dropout,
        scale=scale,
    )  # (S, heads, longest, d)
    return context.transpose(1, 2).reshape(segments * longest, heads, head_dim).index_select(0, padded)


class _FlashVarlen(torch.autograd.Function):
    """FlashAttention-2's variable-length kernel with dropout, forward and backward (aten's own ops).

    The forward kernel draws its dropout mask from the CUDA generator's Philox stream and returns the
    (seed, offset) it used; the backward kernel regenerates the same mask from them, so no mask is stored. A
    ``window`` is the kernel's own sliding window (left and right), within each segment.
    """

    @staticmethod
    def forward(ctx, query, key, value, bounds, longest: int, dropout: float, scale: float | None, window):
        context, logsumexp, seed, offset, _ = torch.ops.aten._flash_attention_forward(
            query,
            key,
            value,
            bounds,
            bounds,
            longest,
            longest,
            dropout,
            False,
            False,
            scale=scale,
            window_size_left=window,
            window_size_right=window,
        )
        ctx.save_for_backward(query, key, value, context, logsumexp, bounds, seed, offset)
        ctx.longest, ctx.dropout, ctx.scale, ctx.window = longest, dropout, scale, window
        return context

    @staticmethod
    def backward(ctx, grad_context):
        query, key, value, context, logsumexp, bounds, seed, offset = ctx.saved_tensors
        grad_query, grad_key, grad_value = torch.ops.aten._flash_attention_backward(
            grad_context.contiguous(),
            query,
            key,
            value,
            context,
            logsumexp,
            bounds,
            bounds,
            ctx.longest,
            ctx.longest,
            ctx.dropout,
            False,
            seed,
            offset,
            scale=ctx.scale,
            window_size_left=ctx.window,
            window_size_right=ctx.window,
        )
        return grad_query, grad_key, grad_value, None, None, None, None, None


def flash_applies(query: Tensor) -> bool:
    """Whether FlashAttention's varlen kernel takes ``query`` (T, heads, d): CUDA, half precision, d ≤ 256 and a
    multiple of 8 (its kernels' tile sizes)."""
    head_dim = query.shape[-1]
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0 and head_dim <= 256


def flash_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bounds: Tensor,
    longest: int,
    dropout: float,
    scale: float | None,
    window: int | None = None,
) -> Tensor:
    """The varlen flash kernel (CUDA, half precision); anything it does not take runs :func:`repadded_attention`."""
    if not flash_applies(query):
        return repadded_attention(query, key, value, bounds, longest, dropout, scale, window)
    bounds = bounds.to(torch.int32)
    if dropout == 0.0 and window is None:
        from torch.nn.attention.varlen import varlen_attn

        return varlen_attn(query, key, value, bounds, bounds, longest, longest, scale=scale)
    return _FlashVarlen.apply(query, key, value, bounds, longest, dropout, scale, window)


def segments_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bounds: Tensor,
    longest: int,
    dropout: float,
    scale: float | None,
    window: int | None = None,
) -> Tensor:
    """One SDPA call per segment (the bounds read on the host); under ``torch.compile``, which would stop at that
    read, :func:`repadded_attention`."""
    if torch.compiler.is_compiling():
        return repadded_attention(query, key, value, bounds, longest, dropout, scale, window)
    return per_block_attention(query, key, value, bounds, dropout, scale, window)


PACKED_PATHS: dict[str, PackedPath] = {
    "segments": segments_attention,
    "flash": flash_attention,
    "repadded": repadded_attention,
}
# The path each device type takes; any other device: "repadded".
DEVICE_PATHS: dict[str, str] = {"cpu": "segments", "cuda": "flash"}

# Devices on which data.packing: auto packs. The CPU: measured at least as fast as padded.
# CUDA: the varlen flash kernel computes no padding at all, where a padded batch computes every row to its
# longest block (the unpadding of MosaicBERT and ModernBERT: Portes et al. 2023, Warner et al. 2024).
PACKED_BY_DEFAULT: dict[str, bool] = {"cpu": True, "cuda": True}


def register_path(name: str, path: PackedPath, device_type: str | None = None) -> None:
    """Add a packed attention path under ``name``; with ``device_type``, make it that device's path."""
    PACKED_PATHS[name] = path
    if device_type is not None:
        DEVICE_PATHS[device_type] = name


def path_for(query: Tensor) -> str:
    """The name of the path a packed stream's ``query`` on its device takes."""
    return DEVICE_PATHS.get(query.device.type, "repadded")


def packs_by_default(device: torch.device | str) -> bool:
    """What ``data.packing: auto`` becomes on ``device`` (where the objective and its encoders can be packed)."""
    return PACKED_BY_DEFAULT.get(torch.device(device).type, False)


def packed_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, **kwargs):
    """transformers' attention interface for ``"spanlm_varlen"`` (:func:`spanlm.models.packed.varlen_attention`): a
    packed stream through the path of the device (:func:`path_for`), a padded batch through SDPA."""
    return varlen_attention(
        module, query, key, value, attention_mask, path=lambda q: PACKED_PATHS[path_for(q)], **kwargs
    )


def register_packed_attention() -> None:
    """Make ``"spanlm_varlen"`` transformers' name for :func:`packed_attention` (replacing the model layer's
    portable default; idempotent); its masks are SDPA's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(VARLEN_ATTENTION, packed_attention)
    AttentionMaskInterface.register(VARLEN_ATTENTION, sdpa_mask)


def use_packed_attention(model: nn.Module) -> None:
    """Set every encoder of ``model`` that takes packed streams (:data:`spanlm.models.packed.ATTENTION_FAMILIES`) to
    ``"spanlm_varlen"`` unless it has a varlen implementation of its own (``flash_attention_2`` / ``_3``), in
    place: parameters, state-dict keys and the saved config are unchanged. DeBERTa-V2's attention modules are
    switched to take the packed layout in place of their mask (spanlm.models.packed_deberta)."""
    from transformers import PreTrainedModel

    use_packed_disentangled_attention(model)
    register_packed_attention()
    for module in model.modules():
        if (
            isinstance(module, PreTrainedModel)
            and module.config.model_type in ATTENTION_FAMILIES
            and module.config._attn_implementation not in (VARLEN_ATTENTION, *NATIVE_VARLEN)
        ):
            module.set_attn_implementation(VARLEN_ATTENTION)
