"""SpanBERT span masking and span-boundary (SBO) targets (Joshi et al. 2020, §3.1–3.2).

The authors' masker (fairseq ``span_masking`` / ``PairWithSpanMaskingScheme.mask``) is a loop per block:

    while masked < budget:                       # budget = ceil(0.15 × n) sub-word tokens
        ℓ ~ Geometric(p) clipped to 1..10        # span length in *words*, renormalised
        anchor ~ Uniform(block tokens)
        if anchor is masked: continue            # the only rejection
        mask whole words forward from the anchor's word start until ℓ words, the block end, or the
        budget is reached (the last span may stop mid-word)
    merge spans that overlap or touch; one 80/10/10 draw per merged span; SBO targets (s-1, e+1)

Here the same process runs for the whole batch at once. Each row gets a stream of K i.i.d. candidate
(ℓ, anchor) pairs — exactly what the loop would draw, rejected ones included. Whether candidate k is
accepted depends only on accepted candidates j < k covering its anchor; that chain is resolved with a
(B, K, K) coverage matrix in a few rounds. The budget is then applied in candidate order, counting
only tokens no earlier span masked, and the last span is cut at the budget. If a row's K candidates
run out before its budget is met, K more are appended (the stream simply continues) and it is redone.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spanlm.masking.base import FLAT, KEEP, MaskedBatch, SpanConfig, Vocabulary
from spanlm.masking.ops import TokenMasker, Words, ceil_budget, corrupt, ragged_arange, segment_first


def span_length_distribution(p: float, max_span: int) -> np.ndarray:
    """P(ℓ) ∝ p (1-p)^(ℓ-1) for ℓ = 1..max_span, renormalised (clipped, not resampled)."""
    lengths = np.arange(1, max_span + 1)
    weights = p * (1 - p) ** (lengths - 1)
    return weights / weights.sum()


@dataclasses.dataclass
class SpanSelection:
    """Result of :func:`resolve_spans`: the tokens masked and the spans as the loop produced them."""

    positions: np.ndarray  # (T,) flat positions masked, in the order the spans masked them
    span_start: np.ndarray  # (S,) flat first token of each accepted span (before merging)
    span_end: np.ndarray  # (S,) flat one past its last token
    span_words: np.ndarray  # (S,) words it covered
    span_row: np.ndarray  # (S,)
    done: np.ndarray  # (B,) bool: the row reached its budget


def resolve_spans(words: Words, length: np.ndarray, anchor: np.ndarray, budget: np.ndarray) -> SpanSelection:
    """Run SpanBERT's masking loop over given candidate streams, vectorised.

    ``length`` (B, K) are span lengths in words, ``anchor`` (B, K) the (global) index of the word holding
    each anchor token, ``budget`` (B,) tokens to mask per row. Candidates are considered in column order.
    """
    batch_size, n_candidates = anchor.shape
    row_end = (words.row_first + words.row_count)[:, None]  # (B, 1) one past the row's last word
    stop = np.minimum(anchor + length, row_end)  # (B, K) one past the candidate's last word

    # --- acceptance: candidate k is rejected iff an *accepted* earlier candidate j covers its anchor.
    # covers[b, j, k]: span j would cover the anchor of k, for j < k. Spans are whole words (only the
    # final, budget-cut span is partial, and nothing after it matters), so "anchor token masked" is
    # "anchor word inside an accepted span".
    earlier = np.triu(np.ones((n_candidates, n_candidates), dtype=bool), k=1)  # (K, K): j < k
    covers = (anchor[:, :, None] <= anchor[:, None, :]) & (anchor[:, None, :] < stop[:, :, None]) & earlier  # (B, K, K)
    accepted = np.zeros((batch_size, n_candidates), dtype=bool)
    undecided = np.repeat((budget > 0)[:, None], n_candidates, axis=1)  # rows without content mask nothing
    # Each round settles at least the earliest undecided candidate of every row (all its predecessors
    # are decided), and usually all of them: overlaps are rare at a 15% rate.
    while undecided.any():
        blocked = (covers & accepted[:, :, None]).any(axis=1)  # (B, K) rejected for sure
        maybe_blocked = (covers & (accepted | undecided)[:, :, None]).any(axis=1)  # (B, K)
        accepted |= undecided & ~maybe_blocked  # nothing before it can cover it: accepted for sure
        undecided &= maybe_blocked & ~blocked

    # --- budget: masked tokens accrue in candidate order, a word counting only for the first span
    # that reaches it; the span crossing the budget is cut after the token that meets it.
    span_row, span_column = np.nonzero(accepted)  # row-major = candidate order within each row
    first_word = anchor[span_row, span_column]
    n_words = stop[span_row, span_column] - first_word
    entry_word = ragged_arange(first_word, n_words)  # every (span, word) pair, spans in order
    entry_span = np.repeat(np.arange(len(first_word)), n_words)
    _, first_claim = np.unique(entry_word, return_index=True)  # the earliest span reaching each word
    first_claim.sort()  # back to (span, word) order
    new_word, new_span = entry_word[first_claim], entry_span[first_claim]
    new_row = span_row[new_span]
    new_length = words.length[new_word]
    used_before = np.cumsum(new_length) - new_length
    used_before -= used_before[segment_first(new_row)]  # (E,) tokens masked earlier in the same row
    take = np.clip(budget[new_row] - used_before, 0, new_length)  # (E,) tokens of this word masked
    kept = take > 0
    positions = ragged_arange(words.start[new_word[kept]], take[kept])
    done = np.bincount(new_row, weights=take, minlength=batch_size) >= budget

    # --- the spans as the loop recorded them: every accepted span up to the one that met the budget.
    # A full span ends after its last word (even where an earlier span had masked it already); the
    # span that meets the budget ends after the token that met it.
    span_end = words.end(stop[span_row, span_column] - 1)
    span_words = n_words.copy()
    last_span = np.full(batch_size, -1)  # (B,) the row's last contributing span
    if kept.any():
        kept_row, kept_span, kept_word = new_row[kept], new_span[kept], new_word[kept]
        last_entry = np.flatnonzero(np.append(kept_row[1:] != kept_row[:-1], True))  # last masked word per row
        final = kept_span[last_entry]
        last_span[kept_row[last_entry]] = final
        span_end[final] = words.start[kept_word[last_entry]] + take[kept][last_entry]
        span_words[final] = kept_word[last_entry] - first_word[final] + 1
    in_budget = np.arange(len(first_word)) <= last_span[span_row]
    return SpanSelection(
        positions=positions,
        span_start=words.start[first_word][in_budget],
        span_end=span_end[in_budget],
        span_words=span_words[in_budget],
        span_row=span_row[in_budget],
        done=done | (budget == 0),
    )


class SpanMasker(TokenMasker):
    config: SpanConfig
    # What a collator returns beside the MLM labels: the SBO inputs and labels that
    # spanlm.models.span_boundary.SpanBoundaryModel adds to a stock *ForMaskedLM.
    collated = ("sbo_left", "sbo_right", "sbo_relative", "sbo_labels")

    def __init__(self, config: SpanConfig, vocab: Vocabulary):
        super().__init__(config, vocab)
        probs = span_length_distribution(config.p, config.max_span)
        self.length_cdf = np.cumsum(probs)[:-1]  # searchsorted(u) + 1 is a length; the last edge is 1
        self.mean_length = float((np.arange(1, config.max_span + 1) * probs).sum())

    def __call__(self, batch, rng: np.random.Generator) -> MaskedBatch:
        batch_size, width = batch.input_ids.shape
        special = batch.special_mask.reshape(-1)
        words = Words.of(batch.word_starts, batch.special_mask)
        n_content = (~batch.special_mask).sum(axis=1)  # (B,) the "sentence" SpanBERT masks
        budget = ceil_budget(self.config.rate, n_content)  # (B,)
        selection = self._select(words, n_content, budget, rng)

        # --- merged spans: overlapping or touching spans merge, so they are the runs of masked tokens.
        mask = np.zeros(batch_size * width, dtype=bool)
        mask[selection.positions] = True
        positions = np.flatnonzero(mask)
        run_begins = np.ones(len(positions), dtype=bool)
        run_begins[1:] = positions[1:] != positions[:-1] + 1
        run_id = np.cumsum(run_begins) - 1  # (T,) merged span of each target
        run_start = positions[run_begins]
        run_end = positions[np.append(run_begins[1:], True)] if len(positions) else positions  # inclusive
        sbo = self._sbo_targets(run_start, run_end, special, batch.input_ids.reshape(-1), width)
        unit = run_id if self.config.replacement == "span" else np.arange(len(positions))
        input_ids, labels, kind = corrupt(
            batch.input_ids, positions, unit, self.config.proportions, self.sampler, self.vocab.mask_id, rng
        )
        masked = MaskedBatch(
            input_ids=input_ids,
            attention_mask=batch.attention_mask.copy(),
            target_index=positions,
            target_labels=labels,
            target_kind=kind,
            span_start=selection.span_start,
            span_end=selection.span_end,
            span_words=selection.span_words,
        )
        # SBO: target sbo_index[i] of a span [s, e] is predicted from the boundary tokens sbo_left[i],
        # sbo_right[i] (flat positions, as sbo_index) and its 0-based position sbo_relative[i] in the span.
        return masked.add(FLAT, **{name: sbo[name] for name in ("sbo_index", "sbo_left", "sbo_right")}).add(
            KEEP, sbo_relative=sbo["sbo_relative"], sbo_labels=sbo["sbo_labels"]
        )

    @staticmethod
    def statistics(pairs: list, counters) -> dict:
        """``spanlm preview``'s line for SpanBERT: SBO targets per block."""
        blocks = sum(m.batch_size for _, m in pairs)
        return {"sbo_targets_per_block": round(sum(len(m.sbo_index) for _, m in pairs) / max(blocks, 1), 3)}

    def _select(
        self, words: Words, n_content: np.ndarray, budget: np.ndarray, rng: np.random.Generator
    ) -> SpanSelection:
        """Draw candidate streams long enough for every row's budget and resolve them."""
        batch_size = len(n_content)
        token_word = words.token_word()
        content = np.flatnonzero(token_word >= 0)  # flat positions of all content tokens, row by row
        content_first = np.cumsum(n_content) - n_content  # (B,) where each row's content begins there
        # Enough candidates for the expected number of spans (budget / tokens per span), plus rejections.
        tokens_per_word = n_content / np.maximum(words.row_count, 1)
        expected = budget / np.maximum(self.mean_length * tokens_per_word, 1.0)
        step = int(np.ceil(1.3 * expected.max() + 8)) if batch_size else 1
        length = np.zeros((batch_size, 0), dtype=np.int64)
        anchor = np.zeros((batch_size, 0), dtype=np.int64)
        while True:
            new_length = 1 + np.searchsorted(self.length_cdf, rng.random((batch_size, step)), side="right")  # (B, step)
            # Anchor: a uniform content token of the row, snapped to (the index of) its word. A row
            # without content draws a dummy that resolve_spans ignores (its budget is 0).
            offset = rng.integers(0, np.maximum(n_content, 1)[:, None], size=(batch_size, step))  # (B, step)
            anchor_token = (
                content[np.minimum(content_first[:, None] + offset, len(content) - 1)] if len(content) else offset
            )
            new_anchor = token_word[anchor_token] if len(content) else offset
            length = np.concatenate([length, new_length], axis=1)
            anchor = np.concatenate([anchor, new_anchor], axis=1)
            selection = resolve_spans(words, length, anchor, budget)
            if selection.done.all():
                return selection

    def _sbo_targets(
        self, run_start: np.ndarray, run_end: np.ndarray, special: np.ndarray, ids: np.ndarray, width: int
    ) -> dict:
        """SBO targets per merged span [s, e]: boundaries (s-1, e+1), none at the block edge."""
        if self.config.endpoints == "external":
            left, right = run_start - 1, run_end + 1
            # A span touching [CLS] or [SEP] has no outside token on that side: MLM only (the
            # authors' `start > 0 and end < sent_length - 1` on the block without specials).
            valid = ~special[left] & ~special[right] & (left // width == run_start // width)
        else:
            left, right = run_start, run_end
            valid = np.ones(len(run_start), dtype=bool)
        count = np.where(valid, np.minimum(run_end - run_start + 1, self.config.max_targets), 0)
        index = ragged_arange(run_start, count)
        relative = index - np.repeat(run_start, count)
        return dict(
            sbo_index=index,
            sbo_left=np.repeat(left, count),
            sbo_right=np.repeat(right, count),
            sbo_relative=relative,
            sbo_labels=ids[index].copy(),
        )
