"""MacBERT: 15% of words as 1-4-grams (40/30/20/10), similar-word correction with a random fallback."""

from __future__ import annotations

import numpy as np
import pytest

from spanlm.data.similar_words import SimilarWords, word_hash
from spanlm.masking.base import KEPT, RANDOM, SIMILAR, NgramConfig
from spanlm.masking.ops import Words, round_budget
from spanlm.objectives.macbert.masker import NgramMasker


def shifted_table(vocab_size: int = 1000, first: int = 5) -> SimilarWords:
    """Every one-token word id i has the single neighbour i + 1 (wrapping within the normal ids)."""
    ids = np.arange(first, vocab_size)
    hashes = word_hash(ids, np.arange(len(ids)), np.ones(len(ids), dtype=np.int64))
    order = np.argsort(hashes)
    neighbours = first + (ids[order] - first + 1) % (vocab_size - first)
    return SimilarWords(hashes[order], np.ones(len(ids)), np.arange(len(ids) + 1), np.arange(len(ids)), neighbours)


def empty_table() -> SimilarWords:
    return SimilarWords(np.zeros(0, dtype=np.int64), [], [0], [], [])


def test_ngram_mix_word_budget_and_layout(vocab, make_batch):
    rng = np.random.default_rng(0)
    masker = NgramMasker(NgramConfig(), vocab, shifted_table())
    lengths = rng.integers(3, 513, size=32)
    grams = []
    masked_words = budget = 0
    for _ in range(10):
        batch = make_batch(rng, 32, 512, lengths=lengths)
        masked = masker(batch, rng)
        grams.append(masked.span_words)
        # N-grams: whole consecutive words of one row, in order, never overlapping.
        assert np.all(masked.span_end - masked.span_start == masked.span_words)  # one token per word here
        row = masked.span_start // 512
        assert np.all((masked.span_end - 1) // 512 == row)
        same_row = row[1:] == row[:-1]
        assert np.all(masked.span_start[1:][same_row] >= masked.span_end[:-1][same_row])
        per_row = np.bincount(row, weights=masked.span_words, minlength=32)
        row_budget = round_budget(0.15, lengths - 2)
        assert np.all(np.abs(per_row - row_budget) <= 3)  # at most one n-gram over
        masked_words += per_row.sum()
        budget += row_budget.sum()
        assert masked.counters["masked_words"] == len(masked.target_index)
    mix = np.bincount(np.concatenate(grams), minlength=5)[1:] / sum(len(g) for g in grams)
    assert mix == pytest.approx([0.4, 0.3, 0.2, 0.1], abs=0.02)
    assert masked_words / budget == pytest.approx(1.0, abs=0.5 / 15)  # 15% ± 0.5% of the words


def test_correction_proportions_per_word(vocab, make_batch):
    rng = np.random.default_rng(1)
    masker = NgramMasker(NgramConfig(), vocab, shifted_table())
    kinds = np.zeros(4, dtype=np.int64)
    for _ in range(6):
        batch = make_batch(rng, 32, 512)
        masked = masker(batch, rng)
        kinds += np.bincount(masked.target_kind, minlength=4)
        similar = masked.target_index[masked.target_kind == SIMILAR]
        original = batch.input_ids.reshape(-1)[similar]
        np.testing.assert_array_equal(masked.input_ids.reshape(-1)[similar], 5 + (original - 5 + 1) % 995)
        assert masked.counters["similar_fallback"] == 0
    assert (kinds / kinds.sum())[[SIMILAR, RANDOM, KEPT]] == pytest.approx([0.8, 0.1, 0.1], abs=0.02)


def test_no_similar_word_falls_back_to_random(vocab, make_batch):
    rng = np.random.default_rng(2)
    masked = NgramMasker(NgramConfig(), vocab, empty_table())(make_batch(rng, 32, 512), rng)
    assert not np.any(masked.target_kind == SIMILAR)
    assert masked.counters["similar_fallback"] == masked.counters["similar_drawn"] > 0
    assert np.mean(masked.target_kind == RANDOM) == pytest.approx(0.9, abs=0.03)


def similar_replacements(batch, masked):
    """(original ids, new ids) of every word replaced by a similar word."""
    words = Words.of(batch.word_starts, batch.special_mask)
    word = words.token_word()[masked.target_index]
    out = []
    for w in np.unique(word[masked.target_kind == SIMILAR]):
        positions = np.arange(words.start[w], words.end(np.array([w]))[0])
        out.append((batch.input_ids.reshape(-1)[positions].tolist(), masked.input_ids.reshape(-1)[positions].tolist()))
    return out


def test_english_replacements_come_from_the_word2vec_table(english, blocks):
    table = SimilarWords.load(english.directory)
    masker = NgramMasker.from_corpus(NgramConfig(), english)
    neighbours_of = {}
    for s in range(len(table)):
        for e in range(table.offsets[s], table.offsets[s + 1]):
            start = table.token_offsets[e]
            neighbours_of.setdefault(int(table.hashes[s]), []).append(
                table.tokens[start : start + table.lengths[s]].tolist()
            )
    replaced = multi = 0
    for batch in blocks(english, 128, 32, 3):
        masked = masker(batch, np.random.default_rng(0))
        for original, new in similar_replacements(batch, masked):
            key = int(word_hash(np.array(original), np.array([0]), np.array([len(original)]))[0])
            assert new in neighbours_of[key]
            assert len(new) == len(original) and new != original
            replaced += 1
            multi += len(original) > 1
        assert masked.counters["similar_fallback"] < 0.2 * masked.counters["similar_drawn"]
    assert replaced > 200 and multi > 0


def test_chinese_synonym_file(chinese, blocks):
    table = SimilarWords.load(chinese.directory)
    listed = {
        str(w): table.neighbours[table.offsets[i] : table.offsets[i + 1]].tolist() for i, w in enumerate(table.words)
    }
    # Only same-length synonyms are kept: 小姐们 (three characters) never replaces 姑娘.
    assert listed["宝玉"] == ["黛玉", "凤姐"] and listed["姑娘"] == ["丫头"] and listed["说道"] == ["笑道", "问道"]
    masker = NgramMasker.from_corpus(NgramConfig(), chinese)
    tokenizer = chinese.tokenizer
    seen = 0
    for seed, batch in enumerate(blocks(chinese, 128, 32, 6)):
        masked = masker(batch, np.random.default_rng(seed))
        for original, new in similar_replacements(batch, masked):
            original_word = "".join(tokenizer.convert_ids_to_tokens(original))
            assert "".join(tokenizer.convert_ids_to_tokens(new)) in listed[original_word]
            seen += 1
        # Most words have no synonym in this small file: they fall back to random characters.
        assert masked.counters["similar_fallback"] > 0
    assert seen > 5
