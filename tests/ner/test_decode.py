"""GlobalPointer decoding: threshold, masked cells, nested spans, flat selection, ordering."""

import torch

from spanlm.heads.global_pointer import GlobalPointer, GlobalPointerConfig, cell_mask
from spanlm.ner.decode import decode_spans


def logits_with(cells, batch=2, types=3, length=8, background=-5.0):
    """Logits at ``background`` with the given {(b, type, start, end): score} cells set."""
    logits = torch.full((batch, types, length, length), background)
    for (b, kind, start, end), score in cells.items():
        logits[b, kind, start, end] = score
    return logits


def test_masked_cells_are_never_decoded():
    length = 9
    mask = torch.ones(3, length, dtype=torch.bool)
    mask[:, 0] = False  # [CLS]
    mask[0, 6:] = False  # padding
    mask[2, 4] = False  # [SEP] in the middle of a packed row
    allowed = cell_mask(mask, length)  # (B, L, L)
    logits = torch.full((3, 2, length, length), 7.0).masked_fill(~allowed.unsqueeze(1), torch.finfo(torch.float32).min)
    rows = decode_spans(logits)
    for b, row in enumerate(rows):
        assert len(row) == 2 * int(allowed[b].sum())  # every candidate cell of both types, nothing else
        assert all(mask[b, i] and mask[b, j] and i <= j for _, i, j, _ in row)


def test_head_output_decodes_only_allowed_cells():
    torch.manual_seed(0)
    head = GlobalPointer(16, 4, GlobalPointerConfig(kind="standard", head_size=8))
    with torch.no_grad():
        head.dense.bias.fill_(3.0)  # most cells positive
        mask = torch.ones(2, 10, dtype=torch.bool)
        mask[1, 5:] = False
        mask[:, 0] = False
        rows = decode_spans(head(torch.randn(2, 10, 16), mask))
    assert sum(len(row) for row in rows) > 50
    assert all(mask[b, i] and mask[b, j] and i <= j for b, row in enumerate(rows) for _, i, j, _ in row)


def test_nested_and_multi_type_spans_are_all_returned_sorted():
    logits = logits_with(
        {(0, 0, 1, 5): 2.0, (0, 1, 2, 3): 1.5, (0, 2, 1, 5): 0.5, (0, 0, 4, 4): 3.0, (1, 1, 0, 7): 0.125}
    )
    rows = decode_spans(logits)
    assert rows[0] == [(0, 1, 5, 2.0), (2, 1, 5, 0.5), (1, 2, 3, 1.5), (0, 4, 4, 3.0)]  # by (start, end, type)
    assert rows[1] == [(1, 0, 7, 0.125)]


def test_threshold_is_strict_and_adjustable():
    logits = logits_with({(0, 0, 1, 2): 0.0, (0, 1, 3, 3): 0.75, (1, 2, 2, 6): 1.25})
    assert decode_spans(logits) == [[(1, 3, 3, 0.75)], [(2, 2, 6, 1.25)]]
    assert decode_spans(logits, threshold=1.0) == [[], [(2, 2, 6, 1.25)]]
    assert decode_spans(logits, threshold=-6.0)[0][0] == (0, 0, 0, -5.0)


def test_flat_keeps_the_highest_scores_without_overlaps():
    logits = logits_with(
        {
            (0, 0, 1, 4): 2.0,  # overlaps the best span (2, 3): dropped
            (0, 1, 2, 3): 3.0,  # best
            (0, 2, 2, 3): 1.0,  # same span, another type, lower score: dropped
            (0, 1, 4, 5): 2.5,  # touches (2, 3) without sharing a token: kept
            (0, 0, 5, 6): 1.0,  # overlaps (4, 5): dropped
            (0, 2, 7, 7): 0.25,  # alone: kept
            (1, 0, 0, 0): 0.375,
        }
    )
    assert decode_spans(logits, flat=True) == [[(1, 2, 3, 3.0), (1, 4, 5, 2.5), (2, 7, 7, 0.25)], [(0, 0, 0, 0.375)]]
    assert len(decode_spans(logits)[0]) == 6  # nested decoding keeps them all


def test_flat_ties_keep_the_earlier_span():
    logits = logits_with({(0, 1, 2, 4): 1.0, (0, 0, 3, 5): 1.0})
    assert decode_spans(logits, flat=True)[0] == [(1, 2, 4, 1.0)]


def test_no_spans():
    assert decode_spans(torch.full((3, 2, 5, 5), -1.0)) == [[], [], []]
    assert decode_spans(torch.full((2, 2, 5, 5), -1.0), flat=True) == [[], []]
