"""BERT MLM: exactly round(15%) of non-special tokens per block, 80/10/10 per token."""

from __future__ import annotations

import numpy as np
import pytest

from spanlm.masking.base import KEPT, MASK, RANDOM, MlmConfig, Proportions
from spanlm.masking.ops import round_budget
from spanlm.objectives.mlm.masker import MlmMasker


def test_rate_and_80_10_10(vocab, make_batch):
    rng = np.random.default_rng(0)
    masker = MlmMasker(MlmConfig(), vocab)
    lengths = rng.integers(3, 513, size=32)  # ragged rows: padding is never selected
    targets = content = 0
    kinds = np.zeros(4, dtype=np.int64)
    for _ in range(10):
        batch = make_batch(rng, 32, 512, lengths=lengths)
        masked = masker(batch, rng)
        per_row = np.bincount(masked.target_index // 512, minlength=32)
        np.testing.assert_array_equal(per_row, round_budget(0.15, lengths - 2))
        targets += len(masked.target_index)
        content += int((lengths - 2).sum())
        kinds += np.bincount(masked.target_kind, minlength=4)
    assert targets / content == pytest.approx(0.15, abs=0.005)
    shares = kinds / kinds.sum()
    assert shares[[MASK, RANDOM, KEPT]] == pytest.approx([0.8, 0.1, 0.1], abs=0.02)


def test_selection_is_uniform_over_positions(vocab, make_batch):
    rng = np.random.default_rng(1)
    masker = MlmMasker(MlmConfig(), vocab)
    hits = np.zeros(64, dtype=np.int64)
    for _ in range(400):
        masked = masker(make_batch(rng, 32, 64), rng)
        hits += np.bincount(masked.target_index % 64, minlength=64)
    inner = hits[1:-1] / hits[1:-1].sum()
    assert hits[0] == hits[-1] == 0
    assert np.abs(inner - 1 / 62).max() < 0.003  # every content position equally likely


def test_unigram_random_tokens_follow_the_corpus(vocab, make_batch):
    rng = np.random.default_rng(2)
    config = MlmConfig(proportions=Proportions(mask=0.0, random=1.0, keep=0.0), random_source="unigram")
    masked = MlmMasker(config, vocab)(make_batch(rng, 32, 512), rng)
    replaced = masked.input_ids.reshape(-1)[masked.target_index]
    assert not np.isin(replaced, vocab.special_ids).any()
    assert (replaced < 500).mean() == pytest.approx(0.75, abs=0.03)  # counts ∝ 1000 - id: 3/4 of the mass below 500
