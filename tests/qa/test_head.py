"""Start/end head masking, BERT's loss, and span decoding over windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spanlm.qa.data import QAExample
from spanlm.qa.head import SpanHead, span_loss
from spanlm.qa.predict import best_spans, collect
from spanlm.qa.windows import Windows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_only_context_and_cls_can_be_chosen_and_logits_stay_finite(dtype):
    torch.manual_seed(0)
    head = SpanHead(8).to(dtype)
    context = torch.tensor([[False, False, False, True, True, False], [False, False, True, True, True, True]])
    start, end = head(torch.randn(2, 6, 8, dtype=dtype), context)
    allowed = context.clone()
    allowed[:, 0] = True
    minimum = torch.finfo(dtype).min
    for logits in (start, end):
        assert logits.dtype == dtype and torch.isfinite(logits).all()
        assert (logits[~allowed] == minimum).all() and (logits[allowed] > minimum).all()
    loss, start_loss, end_loss = span_loss(start, end, torch.tensor([3, 0]), torch.tensor([4, 0]))
    assert torch.isfinite(loss)
    expected = F.cross_entropy(start.float(), torch.tensor([3, 0]))
    torch.testing.assert_close(start_loss, expected)
    torch.testing.assert_close(loss, (start_loss + end_loss) / 2)


def test_best_span_respects_order_length_and_context():
    # Positions: 0 [CLS], 1 question, 2..6 context, 7 [SEP].
    context = torch.tensor([[False, False, True, True, True, True, True, False]])
    start = torch.tensor([[5.0, 100.0, 1.0, 0.0, 0.0, 0.0, 9.0, 100.0]])
    end = torch.tensor([[4.0, 100.0, 8.0, 0.0, 3.0, 0.0, 1.0, 100.0]])
    # Unconstrained the question/[SEP] tokens or the pair (6, 2) with j < i would win.
    score, i, j, null = best_spans(start, end, context, max_answer_length=30)
    assert (i.item(), j.item(), score.item(), null.item()) == (6, 6, 10.0, 9.0)
    score, i, j, _ = best_spans(
        start.clone().index_fill_(1, torch.tensor([6]), 0.0), end, context, max_answer_length=30
    )
    assert (i.item(), j.item(), score.item()) == (2, 2, 9.0)
    # With the best pair longer than the limit: start 2 (1.0) + end 4 (3.0) = 4 is three tokens long.
    end2 = torch.tensor([[0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0]])
    start2 = torch.tensor([[0.0, 0.0, 2.0, 0.0, 0.5, 0.0, 0.0, 0.0]])
    assert best_spans(start2, end2, context, max_answer_length=3)[1:3] == (torch.tensor([2]), torch.tensor([4]))
    _, i, j, _ = best_spans(start2, end2, context, max_answer_length=2)
    assert (i.item(), j.item()) == (4, 4)


def test_collect_takes_the_best_window_and_the_smallest_null():
    context = "abcdefghij"
    # Two windows of example 0 (context tokens of 2 characters), one of example 1.
    offsets = np.zeros((3, 4, 2), dtype=np.int64)
    offsets[0, 1:] = [[0, 2], [2, 4], [4, 6]]
    offsets[1, 1:] = [[4, 6], [6, 8], [8, 10]]
    offsets[2, 1:] = [[0, 2], [2, 4], [4, 6]]
    mask = np.array([[False, True, True, True]] * 3)
    windows = Windows(
        np.zeros((3, 4), dtype=np.int64),
        np.zeros((3, 4), dtype=np.int64),
        np.ones((3, 4), dtype=bool),
        mask,
        offsets,
        np.array([0, 0, 1]),
        np.zeros(3, dtype=np.int64),
        np.zeros(3, dtype=np.int64),
    )
    examples = [QAExample("e0", "q", context, [], []), QAExample("e1", "q", context, [], [])]
    score, start, end = np.array([1.0, 3.0, 2.0]), np.array([1, 2, 3]), np.array([2, 3, 3])
    null = np.array([0.5, 4.0, 1.0])
    first, second = collect(examples, windows, score, start, end, null)
    assert (first.text, first.start, first.end, first.score) == ("ghij", 6, 10, 3.0)
    assert first.null_margin == 0.5 - 3.0  # the smallest null score over the windows, minus the best span
    assert (second.text, second.start, second.end, second.null_margin) == ("ef", 4, 6, -1.0)
