"""Whole-word masking (Cui et al. 2019, Chinese BERT-wwm): all pieces of a word are masked together.

Words are the prepared shards' word starts — the fast tokenizer's pre-tokenized words, or jieba words
for Chinese — so nothing is segmented here. The selection is BERT's create_pretraining_data.py with
``do_whole_word_mask``: shuffle the words, walk through them and take each word whose pieces still fit
into the budget ``round(rate × n)`` (a word that would overshoot is skipped, the walk goes on).
"""

from __future__ import annotations

import numpy as np

from spanlm.masking.base import MaskedBatch, WholeWordConfig
from spanlm.masking.ops import TokenMasker, TokenSampler, Words, corrupt, round_budget, whole_word_targets


def greedy_fill(lengths: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Which items a sequential "take it if it still fits" walk takes, for every row at once.

    ``lengths`` (B, W) are the item sizes in walk order (0 = no item), ``budget`` (B,). The sequential
    rule is: ``if used + length <= budget: take``. Vectorised in rounds: each round jumps to the first
    item that fits the remaining budget, then takes the longest run of items whose cumulative size
    still fits (a prefix, because sizes are non-negative). The item that overflows is skipped, and the
    next round starts after it. Every round lowers the remaining budget by at least one, and after the
    first overflow the remaining budget is below the longest word, so there are only a few rounds.
    """
    batch_size, width = lengths.shape
    column = np.arange(width)
    take = np.zeros((batch_size, width), dtype=bool)
    remaining = budget.astype(np.int64)
    scan_from = np.zeros(batch_size, dtype=np.int64)
    while width:
        fits = (lengths > 0) & (lengths <= remaining[:, None]) & (column >= scan_from[:, None])  # (B, W)
        active = fits.any(axis=1)
        if not active.any():
            break
        start = np.where(active, fits.argmax(axis=1), width)  # (B,) first item that fits
        window = column >= start[:, None]
        running = np.cumsum(np.where(window, lengths, 0), axis=1)  # (B, W) size used from `start` on
        taken = window & (running <= remaining[:, None]) & (lengths > 0)
        take |= taken
        overflow = window & (running > remaining[:, None])
        scan_from = np.where(overflow.any(axis=1), overflow.argmax(axis=1) + 1, width)
        remaining = remaining - (lengths * taken).sum(axis=1)
    return take


def select_words(
    words: Words, budget: np.ndarray, rng: np.random.Generator, eligible: np.ndarray | None = None
) -> np.ndarray:
    """Indices (ascending) of the words BERT's whole-word walk masks, ``budget`` (B,) tokens per row.

    ``eligible`` (U,) bool excludes words (CharBERT's MLM skips noised words).
    """
    batch_size = len(words.row_first)
    width = int(words.row_count.max()) if len(words) else 0
    column = np.arange(len(words)) - words.row_first[words.row]  # (U,) word's column in its row
    # Padded (B, W) layout of the row's words; a random permutation per row = argsort of uniform keys.
    keys = np.full((batch_size, width), 2.0)
    keys[words.row, column] = rng.random(len(words))
    sizes = np.zeros((batch_size, width), dtype=np.int64)
    sizes[words.row, column] = words.length if eligible is None else np.where(eligible, words.length, 0)
    order = np.argsort(keys, axis=1)  # (B, W) walk order: columns
    # The walk usually fills the budget long before the end of the row, so walk a prefix first; only
    # if some row could still take a word beyond it is the whole order walked (same result, exactly).
    prefix = min(width, 2 * int(budget.max(initial=0)) + 32)
    walked = np.take_along_axis(sizes, order[:, :prefix], axis=1)  # (B, prefix)
    take = greedy_fill(walked, budget)
    if prefix < width and np.any((budget > (walked * take).sum(axis=1)) & (words.row_count > prefix)):
        take = greedy_fill(np.take_along_axis(sizes, order, axis=1), budget)
    rows, step = np.nonzero(take)
    return np.sort(words.row_first[rows] + order[rows, step])


class WholeWordMasker(TokenMasker):
    config: WholeWordConfig

    def __call__(self, batch, rng: np.random.Generator) -> MaskedBatch:
        words = Words.of(batch.word_starts, batch.special_mask)
        budget = round_budget(self.config.rate, (~batch.special_mask).sum(axis=1))  # (B,)
        chosen = select_words(words, budget, rng)
        return mask_words(batch, words, chosen, self.config, self.sampler, self.vocab.mask_id, rng)


def mask_words(
    batch, words: Words, chosen: np.ndarray, config: WholeWordConfig, sampler: TokenSampler, mask_id: int, rng
) -> MaskedBatch:
    """Corrupt the ``chosen`` words of ``batch`` 80/10/10 (per word or per token) into a MaskedBatch."""
    positions, unit = whole_word_targets(words, chosen, per_word=config.replacement == "word")
    input_ids, labels, kind = corrupt(batch.input_ids, positions, unit, config.proportions, sampler, mask_id, rng)
    return MaskedBatch(
        input_ids=input_ids,
        attention_mask=batch.attention_mask.copy(),
        target_index=positions,
        target_labels=labels,
        target_kind=kind,
        span_start=words.start[chosen],
        span_end=words.end(chosen),
        span_words=np.ones(len(chosen), dtype=np.int64),
    )
