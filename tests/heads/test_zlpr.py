"""ZLPR loss: dense = the formula, sparse = dense (values and gradients) in every regime, guards, dispatch."""

import math

import pytest
import torch

from spanlm.config import from_dict
from spanlm.errors import ConfigError
from spanlm.heads import zlpr
from spanlm.heads.global_pointer import cell_mask
from spanlm.heads.zlpr import ZlprConfig, global_pointer_loss, span_labels, zlpr_dense, zlpr_sparse

MIN = torch.finfo(torch.float32).min


def masked_logits(seed, batch=3, types=4, length=10, scale=3.0, lengths=(10, 6, 8)):
    """Random logits with the head's masks: padding beyond each row's length and j < i at the minimum."""
    generator = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(batch, types, length, length, generator=generator)
    mask = torch.arange(length) < torch.tensor(lengths)[:, None]
    return logits.masked_fill(~cell_mask(mask, length).unsqueeze(1), MIN)


def reference_loss(logits, labels):
    """ZLPR per (row, type), one cell at a time, then the mean: docs/objectives.md §8 written out."""
    losses = []
    for row, row_labels in zip(logits.flatten(2).flatten(0, 1).tolist(), labels.flatten(2).flatten(0, 1).tolist()):
        negative = sum(math.exp(s) for s, y in zip(row, row_labels) if not y and s > MIN)
        positive = sum(math.exp(-s) for s, y in zip(row, row_labels) if y)
        losses.append(math.log(1 + negative) + math.log(1 + positive))
    return sum(losses) / len(losses)


SPANS = torch.tensor(
    [
        # row 0: nested spans, two types on one span, a duplicate, padding rows
        [[0, 1, 4], [0, 2, 3], [1, 2, 3], [0, 1, 4], [3, 0, 9], [-1, -1, -1], [-1, -1, -1]],
        # row 1: no entities at all
        [[-1, -1, -1]] * 7,
        # row 2: many entities, every type
        [[0, 0, 0], [1, 0, 7], [2, 3, 5], [3, 4, 4], [2, 6, 7], [1, 1, 1], [0, 5, 7]],
    ]
)


def test_dense_equals_the_reference_formula():
    logits = masked_logits(0)
    labels = span_labels(SPANS, logits.shape)
    assert zlpr_dense(logits, labels).item() == pytest.approx(reference_loss(logits, labels), rel=1e-5)


def test_span_labels_mark_exactly_the_spans():
    labels = span_labels(SPANS, (3, 4, 10, 10))
    assert int(labels.sum()) == 4 + 0 + 7  # the duplicate once
    assert labels[0, 0, 1, 4] and labels[0, 1, 2, 3] and labels[2, 1, 0, 7] and not labels[1].any()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_equals_dense_values_and_gradients(seed):
    logits = masked_logits(seed).requires_grad_(True)
    dense = zlpr_dense(logits, span_labels(SPANS, logits.shape))
    (dense_grad,) = torch.autograd.grad(dense, logits)
    sparse = zlpr_sparse(logits, SPANS)
    (sparse_grad,) = torch.autograd.grad(sparse, logits)
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sparse_grad, dense_grad, rtol=1e-5, atol=1e-7)


def test_sparse_has_no_cancellation_when_positives_dominate():
    """Positives at +60, negatives far below: a + log(1 - e^{b-a}) would round 1 - e^{b-a} to 0 here
    (the known failure of that rewrite, docs/objectives.md); the sparse loss must still equal the dense one and
    stay ≥ 0."""
    logits = masked_logits(3, scale=1.0) - 12.0
    labels = span_labels(SPANS, logits.shape)
    logits = torch.where(labels, torch.tensor(60.0), logits).requires_grad_(True)
    dense = zlpr_dense(logits, labels)
    sparse = zlpr_sparse(logits, SPANS)
    assert 0 <= sparse.item() < 1e-3
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-9)
    (dense_grad,) = torch.autograd.grad(dense, logits)
    (sparse_grad,) = torch.autograd.grad(sparse, logits)
    torch.testing.assert_close(sparse_grad, dense_grad, rtol=1e-4, atol=1e-12)
    # the all-cells rewrite really does cancel here: the reason the sparse form avoids it
    scores = logits.detach().flatten(2)
    a = torch.logaddexp(scores.logsumexp(-1), torch.tensor(0.0))
    b = torch.where(labels.flatten(2), scores, MIN).logsumexp(-1)
    has_positive = labels.flatten(2).any(-1)  # (B, T)
    assert bool((-torch.expm1(b - a))[has_positive].eq(0).all())  # 1 - e^{b-a} = 0: log(0)


def test_sparse_accepts_non_contiguous_logits():
    base = masked_logits(4).permute(0, 2, 3, 1).contiguous()  # (B, L, L, T)
    logits = base.permute(0, 3, 1, 2)  # a (B, T, L, L) view with other strides
    assert not logits.is_contiguous()
    torch.testing.assert_close(
        zlpr_sparse(logits, SPANS), zlpr_dense(logits.contiguous(), span_labels(SPANS, logits.shape))
    )


def test_duplicates_count_once_and_padding_rows_are_ignored():
    logits = masked_logits(5)
    unique = SPANS.clone()
    unique[0, 3] = -1  # row 0 without its duplicate
    torch.testing.assert_close(zlpr_sparse(logits, SPANS), zlpr_sparse(logits, unique))
    padded = torch.cat([SPANS, torch.full((3, 4, 3), -1)], 1)
    torch.testing.assert_close(zlpr_sparse(logits, padded), zlpr_sparse(logits, SPANS))


def test_no_entities_anywhere():
    logits = masked_logits(6)
    empty = torch.full((3, 2, 3), -1)
    torch.testing.assert_close(
        zlpr_sparse(logits, empty), zlpr_dense(logits, torch.zeros_like(logits, dtype=torch.bool))
    )
    none = torch.zeros(3, 0, 3, dtype=torch.long)
    torch.testing.assert_close(zlpr_sparse(logits, none), zlpr_sparse(logits, empty))


@pytest.mark.parametrize("bad", [[4, 1, 2], [0, 5, 4], [0, 3, 10], [0, -2, 3]])
def test_spans_outside_the_logits_are_rejected(bad):
    spans = SPANS.clone()
    spans[2, 0] = torch.tensor(bad)
    with pytest.raises(ValueError, match=r"row 2"):
        zlpr_sparse(masked_logits(0), spans)


def test_auto_mode_switches_at_sparse_above(monkeypatch):
    logits = masked_logits(7)
    calls = []
    monkeypatch.setattr(zlpr, "zlpr_sparse", lambda *args: calls.append("sparse") or torch.tensor(0.0))
    monkeypatch.setattr(zlpr, "zlpr_dense", lambda *args: calls.append("dense") or torch.tensor(0.0))
    global_pointer_loss(logits, SPANS, ZlprConfig(sparse_above=10))  # L = 10: not above
    global_pointer_loss(logits, SPANS, ZlprConfig(sparse_above=9))
    global_pointer_loss(logits, SPANS, ZlprConfig(mode="dense", sparse_above=0))
    global_pointer_loss(logits, SPANS, ZlprConfig(mode="sparse"))
    assert calls == ["dense", "sparse", "dense", "sparse"]


def test_config_is_validated_through_from_dict():
    assert from_dict(ZlprConfig, {"mode": "sparse"}).mode == "sparse"
    with pytest.raises(ConfigError, match="mode"):
        from_dict(ZlprConfig, {"mode": "fast"})
    with pytest.raises(ConfigError, match="sparse_above"):
        from_dict(ZlprConfig, {"sparse_above": -1})
