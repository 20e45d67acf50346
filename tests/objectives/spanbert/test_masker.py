"""SpanBERT: span lengths, budget, merging, span-level replacement and SBO targets."""

from __future__ import annotations

import numpy as np
import pytest

from spanlm.masking.base import KEPT, MASK, RANDOM, SpanConfig
from spanlm.masking.ops import Words, ceil_budget
from spanlm.objectives.spanbert.masker import SpanMasker, resolve_spans, span_length_distribution


def authors_loop(
    word_of: list[int],
    word_start: dict,
    word_end: dict,
    n_content: int,
    first: int,
    stream: list[tuple[int, int]],
    budget: int,
) -> tuple[set, list]:
    """SpanBERT's PairWithSpanMaskingScheme.mask for one block, over a given (length, anchor) stream.

    ``word_of[t]`` is the word of content token t (block positions first..first+n_content-1).
    """
    mask, spans = set(), []
    stream = iter(stream)
    while len(mask) < budget:
        span_len, anchor = next(stream)
        if anchor in mask:
            continue
        left, right = word_start[word_of[anchor]], word_end[word_of[anchor]]
        spans.append([left, left])
        for i in range(left, right):
            if len(mask) >= budget:
                break
            mask.add(i)
            spans[-1][-1] = i
        num_words, right2 = 1, right
        while num_words < span_len and right2 < first + n_content and len(mask) < budget:
            left2 = right2
            right2 = word_end[word_of[right2]]
            num_words += 1
            for i in range(left2, right2):
                if len(mask) >= budget:
                    break
                mask.add(i)
                spans[-1][-1] = i
    return mask, spans


def test_vectorised_spans_equal_the_authors_loop(english, blocks):
    """Same candidate stream in, same masked tokens and the same (unmerged) spans out."""
    rng = np.random.default_rng(0)
    for batch in blocks(english, 128, 16, 3):
        words = Words.of(batch.word_starts, batch.special_mask)
        token_word = words.token_word()
        batch_size, width = batch.input_ids.shape
        n_content = (~batch.special_mask).sum(axis=1)
        budget = ceil_budget(0.15, n_content)
        k = 64
        length = 1 + rng.geometric(0.35, size=(batch_size, k)).clip(max=10) - 1
        offset = rng.integers(0, n_content[:, None], size=(batch_size, k))
        anchor_token = np.arange(batch_size)[:, None] * width + 1 + offset  # content starts after [CLS]
        selection = resolve_spans(words, length, token_word[anchor_token], budget)
        assert selection.done.all()
        for row in range(batch_size):
            word_start = {
                w: int(words.start[w]) for w in range(words.row_first[row], words.row_first[row] + words.row_count[row])
            }
            word_end = {w: int(words.end(np.array([w]))[0]) for w in word_start}
            first = row * width + 1
            word_of = {t: int(token_word[t]) for t in range(first, first + n_content[row])}
            stream = list(zip(length[row].tolist(), anchor_token[row].tolist()))
            mask, spans = authors_loop(
                word_of, word_start, word_end, int(n_content[row]), first, stream, int(budget[row])
            )
            mine = selection.positions[(selection.positions >= row * width) & (selection.positions < (row + 1) * width)]
            assert set(mine.tolist()) == mask
            in_row = selection.span_row == row
            assert [
                [s, e - 1] for s, e in zip(selection.span_start[in_row].tolist(), selection.span_end[in_row].tolist())
            ] == spans


def test_length_distribution():
    probs = span_length_distribution(0.2, 10)
    assert probs.sum() == pytest.approx(1.0)
    assert probs[1] / probs[0] == pytest.approx(0.8)
    assert (np.arange(1, 11) * probs).sum() == pytest.approx(3.8, abs=0.01)  # "mean ≈ 3.8" (3.797)


def test_span_lengths_on_single_piece_words(vocab, make_batch):
    """Long blocks of one-token words: realised spans follow the clipped geometric (mean 3.8 ± 0.1)."""
    rng = np.random.default_rng(0)
    masker = SpanMasker(SpanConfig(), vocab)
    width = 2048  # long rows: the budget-cut last span and the block end are a small share of spans
    realised, whole = [], []
    for _ in range(18):
        masked = masker(make_batch(rng, 16, width), rng)
        realised.append(masked.span_words)
        row = masked.span_start // width
        cut = np.append(row[1:] != row[:-1], True) | (masked.span_end % width == width - 1)  # budget / block end
        whole.append(masked.span_words[~cut])
    realised, whole = np.concatenate(realised), np.concatenate(whole)
    assert realised.mean() == pytest.approx(3.8, abs=0.1)
    histogram = np.bincount(whole, minlength=11)[1:] / len(whole)
    assert len(whole) > 20000
    assert np.abs(histogram - span_length_distribution(0.2, 10)).max() < 0.01


def test_budget_is_exact_and_ratio_is_15_percent(vocab, make_batch):
    rng = np.random.default_rng(1)
    masker = SpanMasker(SpanConfig(), vocab)
    lengths = rng.integers(3, 513, size=32)
    targets = content = 0
    for _ in range(8):
        masked = masker(make_batch(rng, 32, 512, lengths=lengths), rng)
        per_row = np.bincount(masked.target_index // 512, minlength=32)
        np.testing.assert_array_equal(per_row, ceil_budget(0.15, lengths - 2))
        targets += per_row.sum()
        content += (lengths - 2).sum()
    assert targets / content == pytest.approx(0.15, abs=0.005)


def test_budget_is_met_even_when_candidates_run_out(vocab, make_batch):
    """A high rate with one-word spans needs more candidates than first drawn: the stream is extended."""
    rng = np.random.default_rng(2)
    masker = SpanMasker(SpanConfig(rate=0.9, p=1.0), vocab)
    masked = masker(make_batch(rng, 8, 256), rng)
    assert np.all(np.bincount(masked.target_index // 256, minlength=8) == ceil_budget(0.9, np.full(8, 254)))


def runs(masked):
    """Merged spans = maximal runs of consecutive targets: (run id per target, starts, ends inclusive)."""
    index = masked.target_index
    begins = np.append(True, index[1:] != index[:-1] + 1)
    ends = np.append(begins[1:], True)
    return np.cumsum(begins) - 1, index[begins], index[ends]


def test_merged_spans(english, blocks):
    masker = SpanMasker.from_corpus(SpanConfig(), english)
    merges = 0
    for batch in blocks(english, 256, 32, 4):
        masked = masker(batch, np.random.default_rng(4))
        run_id, starts, ends = runs(masked)
        # Every sampled span lies inside one run; spans that overlap or touch share a run.
        span_run = np.searchsorted(starts, masked.span_start, side="right") - 1
        assert np.all(masked.span_start >= starts[span_run]) and np.all(masked.span_end - 1 <= ends[span_run])
        merges += len(masked.span_start) - len(np.unique(span_run))
        # One 80/10/10 draw per merged span.
        kind_of_run = np.full(len(starts), -1)
        kind_of_run[run_id] = masked.target_kind
        assert np.all(masked.target_kind == kind_of_run[run_id])
    assert merges > 20


def test_span_level_80_10_10(vocab, make_batch):
    rng = np.random.default_rng(6)
    masker = SpanMasker(SpanConfig(), vocab)
    run_kinds = np.zeros(4, dtype=np.int64)
    for _ in range(10):
        masked = masker(make_batch(rng, 32, 512), rng)
        run_id, starts, _ = runs(masked)
        run_kinds += np.bincount(masked.target_kind[np.append(True, run_id[1:] != run_id[:-1])], minlength=4)
    assert run_kinds.sum() > 4000
    assert (run_kinds / run_kinds.sum())[[MASK, RANDOM, KEPT]] == pytest.approx([0.8, 0.1, 0.1], abs=0.02)


def test_per_token_replacement_option(english, blocks):
    masker = SpanMasker.from_corpus(SpanConfig(replacement="token"), english)
    masked = masker(blocks(english, 256, 32, 1)[0], np.random.default_rng(0))
    run_id, starts, _ = runs(masked)
    mixed = sum(len(set(masked.target_kind[run_id == r].tolist())) > 1 for r in range(len(starts)))
    assert mixed > 10
    shares = np.bincount(masked.target_kind, minlength=4) / len(masked.target_kind)
    assert shares[MASK] == pytest.approx(0.8, abs=0.04)


@pytest.mark.parametrize("max_targets", [15, 3])
def test_sbo_targets(english, blocks, max_targets):
    masker = SpanMasker.from_corpus(SpanConfig(max_targets=max_targets), english)
    edge_runs = 0
    for batch in blocks(english, 128, 32, 4):
        masked = masker(batch, np.random.default_rng(5))
        width = batch.input_ids.shape[1]
        special = batch.special_mask.reshape(-1)
        run_id, starts, ends = runs(masked)
        # Boundaries: inside the block, never [CLS]/[SEP]/pad, in the target's row, just outside its run.
        assert not special[masked.sbo_left].any() and not special[masked.sbo_right].any()
        assert np.all(masked.sbo_left // width == masked.sbo_index // width)
        assert np.all(masked.sbo_right // width == masked.sbo_index // width)
        run_of = np.searchsorted(starts, masked.sbo_index, side="right") - 1
        np.testing.assert_array_equal(masked.sbo_left, starts[run_of] - 1)
        np.testing.assert_array_equal(masked.sbo_right, ends[run_of] + 1)
        np.testing.assert_array_equal(masked.sbo_relative, masked.sbo_index - starts[run_of])
        np.testing.assert_array_equal(masked.sbo_labels, batch.input_ids.reshape(-1)[masked.sbo_index])
        # Per run: the first min(length, max_targets) positions, or none when the run touches the edge.
        at_edge = special[starts - 1] | special[ends + 1]
        expected = np.where(at_edge, 0, np.minimum(ends - starts + 1, max_targets))
        np.testing.assert_array_equal(np.bincount(run_of, minlength=len(starts)), expected)
        edge_runs += at_edge.sum()
    assert edge_runs > 0  # spans touching [CLS] or [SEP] occurred, and got no SBO target


def test_internal_endpoints_option(english, blocks):
    masker = SpanMasker.from_corpus(SpanConfig(endpoints="internal"), english)
    masked = masker(blocks(english, 128, 32, 1)[0], np.random.default_rng(0))
    _, starts, ends = runs(masked)
    run_of = np.searchsorted(starts, masked.sbo_index, side="right") - 1
    np.testing.assert_array_equal(masked.sbo_left, starts[run_of])
    np.testing.assert_array_equal(masked.sbo_right, ends[run_of])
    assert len(np.unique(run_of)) == len(starts)  # every span, edge or not, has SBO targets
