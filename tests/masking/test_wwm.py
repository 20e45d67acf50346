"""Whole-word masking: never splits a word (WordPiece pieces, jieba words), BERT's budget walk."""

from __future__ import annotations

import numpy as np
import pytest

from spanlm.masking.base import KEPT, MASK, RANDOM, WholeWordConfig
from spanlm.masking.ops import Words, round_budget
from spanlm.masking.wwm import WholeWordMasker, greedy_fill


def greedy_reference(lengths: list[int], budget: int) -> list[bool]:
    """BERT create_pretraining_data.py: skip a word that would overshoot, keep walking."""
    used, take = 0, []
    for length in lengths:
        fits = length > 0 and used + length <= budget
        take.append(fits)
        used += length if fits else 0
    return take


def test_greedy_fill_equals_the_sequential_walk():
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.choice([0, 1, 1, 1, 2, 3, 5, 9], size=(16, 40))
        budget = rng.integers(0, 30, size=16)
        expected = np.array([greedy_reference(row.tolist(), b) for row, b in zip(lengths, budget)])
        np.testing.assert_array_equal(greedy_fill(lengths, budget), expected)


def assert_whole_words(batch, masked) -> int:
    """Every word is fully targeted or not at all; returns how many multi-token words were masked."""
    words = Words.of(batch.word_starts, batch.special_mask)
    targeted = np.zeros(batch.input_ids.size, dtype=np.int64)
    targeted[masked.target_index] = 1
    # Sums over [start_i, start_i+1): the word's tokens plus any special tokens after it (never targets).
    per_word = np.add.reduceat(targeted, words.start) if len(words) else targeted[:0]
    assert np.all((per_word == 0) | (per_word == words.length)), "a word was split"
    return int(((per_word == words.length) & (words.length > 1)).sum())


def test_english_pieces_are_never_split(english, blocks):
    masker = WholeWordMasker.from_corpus(WholeWordConfig(), english)
    multi = 0
    for batch in blocks(english, 128, 32, 4):
        multi += assert_whole_words(batch, masker(batch, np.random.default_rng(0)))
    assert multi > 20  # the test sees words of several WordPiece pieces


def test_chinese_jieba_words_are_never_split(chinese, blocks):
    masker = WholeWordMasker.from_corpus(WholeWordConfig(), chinese)
    multi = 0
    for batch in blocks(chinese, 128, 32, 4):
        words = Words.of(batch.word_starts, batch.special_mask)
        assert (words.length > 1).mean() > 0.2  # jieba joins characters into words
        multi += assert_whole_words(batch, masker(batch, np.random.default_rng(0)))
    assert multi > 50


def test_budget_and_per_word_replacement(english, blocks):
    masker = WholeWordMasker.from_corpus(WholeWordConfig(), english)
    targets = content = 0
    word_kinds = np.zeros(4, dtype=np.int64)
    for batch in blocks(english, 128, 32, 8, seed=1):
        masked = masker(batch, np.random.default_rng(3))
        n_content = (~batch.special_mask).sum(axis=1)
        per_row = np.bincount(masked.target_index // batch.input_ids.shape[1], minlength=len(n_content))
        assert np.all(per_row <= round_budget(0.15, n_content))
        assert np.mean(per_row == round_budget(0.15, n_content)) > 0.95  # the skip rule almost always fills it
        targets += per_row.sum()
        content += n_content.sum()
        # All pieces of a word share one draw.
        word = np.searchsorted(masked.span_start, masked.target_index, side="right") - 1
        first = np.append(True, word[1:] != word[:-1])
        kind_of_word = masked.target_kind[first]
        assert np.all(masked.target_kind == kind_of_word[np.cumsum(first) - 1])
        word_kinds += np.bincount(kind_of_word, minlength=4)
    assert targets / content == pytest.approx(0.15, abs=0.005)
    assert (word_kinds / word_kinds.sum())[[MASK, RANDOM, KEPT]] == pytest.approx([0.8, 0.1, 0.1], abs=0.02)


def test_per_token_replacement_option(english, blocks):
    masker = WholeWordMasker.from_corpus(WholeWordConfig(replacement="token"), english)
    mixed = 0
    for batch in blocks(english, 128, 32, 4):
        masked = masker(batch, np.random.default_rng(0))
        word = np.searchsorted(masked.span_start, masked.target_index, side="right") - 1
        for w in np.unique(word[np.append(word[1:] == word[:-1], False)]):
            mixed += len(set(masked.target_kind[word == w].tolist())) > 1
    assert mixed > 0
