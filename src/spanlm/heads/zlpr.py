"""ZLPR ("zero-bounded log-sum-exp & pairwise rank-based") loss for GlobalPointer logits.

Su et al. 2022 (arXiv 2208.02955) / kexue.fm/archives/7359: multi-label classification as "every
positive above 0, every negative below 0". For one (row, type) with its candidate cells' scores s::

    L = log(1 + Σ_{neg} e^{s}) + log(1 + Σ_{pos} e^{-s})

Masked cells (padding, lower triangle) carry ``finfo(dtype).min`` from the head, so e^{s} is exactly 0
and they drop out of both sums. The batch loss is the mean over the B·T (row, type) pairs, as Su's
``global_pointer_crossentropy`` (mean over batch × heads).

Dense form: a 0/1 label per cell, O(T·L²) labels per row. Sparse form (kexue.fm/archives/8888): only the
positives' flat cell indices α·L² + i·L + j, O(#entities) labels. The paper writes its negative term
through the sum over *all* cells::

    a = log(1 + Σ_all e^{s}),  b = log Σ_pos e^{s},  log(1 + Σ_neg e^{s}) = a + log(1 - e^{b - a})

and that rewrite is the known failure of the sparse form: once the positives dominate the sum (a
confident model, positive scores ≳ 16 above the negatives' log-sum-exp in float32) e^{b-a} rounds to 1,
1 - e^{b-a} to 0 or rounding garbage, and the loss becomes -inf, NaN or negative; Su's clamp at ε only
swaps that for a loss of a + log ε that pulls the positives down. Here the cancellation is avoided
instead of clamped: a log-sum-exp over L² cells materialises e^{s - m} for every cell anyway, so the
positive cells are set to e^{-∞} = 0 in that one buffer before the sum, giving log(1 + Σ_neg e^{s}) directly
— the dense loss's negative term, exact in every regime, never negative, no ε — with the same labels
(the positives' indices only) and one (B, T, L²) float32 buffer in forward and one in backward
(:class:`_NegativeTerm`). Autograd's logsumexp plus a gather would allocate several L²-sized
temporaries and a dense scatter for the positives' gradient; with this, head + loss peak at about two
logits-sized tensors. Positive cells must be unmasked, as in the dense form.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import Tensor


@dataclasses.dataclass
class ZlprConfig:
    """Dense or sparse ZLPR; ``auto`` = sparse when the sequence length L exceeds ``sparse_above``."""

    mode: Literal["auto", "dense", "sparse"] = "auto"
    sparse_above: int = 128

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "dense", "sparse"):
            raise ValueError(f"mode must be 'auto', 'dense' or 'sparse', got {self.mode!r}")
        if self.sparse_above < 0:
            raise ValueError(f"sparse_above must be non-negative, got {self.sparse_above}")


def global_pointer_loss(logits: Tensor, entity_spans: Tensor, config: ZlprConfig) -> Tensor:
    """Mean ZLPR loss of GlobalPointer ``logits`` (B, T, L, L) against ``entity_spans`` (B, N, 3)."""
    length = logits.shape[-1]
    if config.mode == "sparse" or (config.mode == "auto" and length > config.sparse_above):
        return zlpr_sparse(logits, entity_spans)
    return zlpr_dense(logits, span_labels(entity_spans, logits.shape))


def zlpr_dense(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean over the B·T (row, type) pairs of the ZLPR loss, with 0/1 ``labels`` shaped like ``logits``."""
    scores = logits.float().flatten(-2)  # (B, T, L·L); float32 sums whatever the autocast dtype
    positive = labels.flatten(-2).bool()  # (B, T, L·L)
    floor = torch.finfo(scores.dtype).min  # e^floor = 0: the cell leaves the sum, and stays finite
    zero = scores.new_zeros(())
    # log(1 + Σ e^x) = logaddexp(lse(x), 0): the "+1" without concatenating a 0 column to L² cells
    negative_term = torch.logaddexp(torch.where(positive, floor, scores).logsumexp(-1), zero)
    positive_term = torch.logaddexp(torch.where(positive, -scores, floor).logsumexp(-1), zero)
    return (negative_term + positive_term).mean()


def zlpr_sparse(logits: Tensor, entity_spans: Tensor) -> Tensor:
    """:func:`zlpr_dense` from the positives' indices only, without an L×L label tensor.

    Args:
        logits: (B, T, L, L) from :class:`spanlm.heads.global_pointer.GlobalPointer`.
        entity_spans: (B, N, 3) LongTensor of (type, start, end_inclusive) rows, padded with -1 rows.
            A span listed twice counts once, as in the dense labels.
    """
    batch, n_types, length, _ = logits.shape
    keys, valid = _positive_cells(entity_spans, n_types, length)  # (B, N) flat index α·L² + i·L + j
    rows = torch.arange(batch, device=keys.device).unsqueeze(1).expand_as(keys)[valid]  # (K,)
    cell = keys[valid]  # (K,)
    index = (rows, cell // (length * length), cell // length % length, cell % length)  # (b, α, i, j), each (K,)
    negative_term, positive = _NegativeTerm.apply(logits, index)  # (B, T) log(1 + Σ_neg e^{s}), (K,) s_pos
    floor = torch.finfo(positive.dtype).min
    # (B, T, N): -s of row b's n-th positive where it has type α, else the floor (N = a few gold spans)
    negated = torch.full(keys.shape, floor, dtype=positive.dtype, device=positive.device).index_put((valid,), -positive)
    of_type = valid.unsqueeze(1) & (
        keys.div(length * length, rounding_mode="floor").unsqueeze(1)
        == torch.arange(n_types, device=keys.device).view(1, n_types, 1)
    )
    positive_term = torch.logaddexp(
        torch.where(of_type, negated.unsqueeze(1), floor).logsumexp(-1), positive.new_zeros(())
    )  # (B, T) log(1 + Σ_pos e^{-s})
    return (negative_term + positive_term).mean()


class _NegativeTerm(torch.autograd.Function):
    """log(1 + Σ_neg e^{s}) per (row, type) and the K positives' scores, from logits (B, T, L, L).

    Forward and backward each allocate one float32 buffer of the logits' size and work on it in place:
    copy, positives → the float32 minimum (e^{min - m} = 0: they leave the sum), subtract the shift, exp.
    The negative term's gradient is e^{s - term} at the negatives (a softmax that includes the "+1") and
    0 at the positives, which then receive their gathered scores' gradient — all in that one buffer.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: tuple[Tensor, Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        positive = logits[index].float()  # (K,)
        buffer = _negatives_only(logits, index)  # (B, T, L, L) float32
        # shift m = max(0, max_neg s): every e^{s - m} ≤ 1, and the sum below is ≥ 1 (the max cell or
        # the "+1" = e^{0 - m}), so the log never sees an underflowed 0
        shift = buffer.amax((-2, -1)).clamp_(min=0)  # (B, T)
        total = buffer.sub_(shift[..., None, None]).exp_().sum((-2, -1))  # (B, T) Σ_neg e^{s - m}
        # log(1 + Σ_neg e^{s}) = m + log(Σ e^{s-m} + e^{-m}), as log1p: at m = 0 (all negatives < 0, the
        # usual case once trained) the sum is small and log(1 + sum) would round it away
        term = shift + torch.log1p(total + torch.expm1(-shift))  # (B, T)
        ctx.save_for_backward(logits, term, *index)
        return term, positive

    @staticmethod
    def backward(ctx, grad_term: Tensor, grad_positive: Tensor):
        logits, term, *index = ctx.saved_tensors
        grad = _negatives_only(logits, tuple(index))
        grad.sub_(term[..., None, None]).exp_().mul_(grad_term[..., None, None])  # (B, T, L, L)
        grad.index_put_(tuple(index), grad_positive, accumulate=True)
        return grad.to(logits.dtype), None


def _negatives_only(logits: Tensor, index: tuple[Tensor, ...]) -> Tensor:
    """A contiguous float32 copy of ``logits`` with the cells at ``index`` set to the float32 minimum."""
    buffer = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).copy_(logits)
    buffer[index] = torch.finfo(torch.float32).min
    return buffer


def span_labels(entity_spans: Tensor, shape: torch.Size | tuple[int, ...]) -> Tensor:
    """Dense 0/1 labels (B, T, L, L) bool from ``entity_spans`` (B, N, 3), for :func:`zlpr_dense`."""
    batch, n_types, length, _ = shape
    keys, valid = _positive_cells(entity_spans, n_types, length)
    labels = torch.zeros(batch, n_types * length * length, dtype=torch.bool, device=entity_spans.device)
    rows = torch.arange(batch, device=keys.device).unsqueeze(1).expand_as(keys)  # (B, N)
    labels[rows[valid], keys[valid]] = True
    return labels.view(batch, n_types, length, length)


def _positive_cells(entity_spans: Tensor, n_types: int, length: int) -> tuple[Tensor, Tensor]:
    """Flat cell index α·L² + i·L + j per span (B, N), sorted, and a (B, N) mask of real, first occurrences."""
    if entity_spans.dim() != 3 or entity_spans.shape[-1] != 3:
        raise ValueError(f"entity_spans must be (B, N, 3), got {tuple(entity_spans.shape)}")
    kind, start, end = entity_spans.long().unbind(-1)  # (B, N) each
    real = kind >= 0
    bad = real & ((kind >= n_types) | (start < 0) | (start > end) | (end >= length))
    if bool(bad.any()):
        b, n = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"entity span {entity_spans[b, n].tolist()} in row {b} is outside the {n_types} types "
            f"× {length} tokens of the logits (or ends before it starts)"
        )
    keys = torch.where(real, (kind * length + start) * length + end, -1).sort(-1).values  # (B, N), padding first
    first = torch.ones_like(real)
    first[:, 1:] = keys[:, 1:] != keys[:, :-1]  # a duplicate equals its sorted predecessor
    return keys, (keys >= 0) & first
