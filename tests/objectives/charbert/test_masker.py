"""CharBERT noise: the edit operations, their mix, NLM labels, MLM skipping noised words, block lengths."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spanlm.masking.base import NoiseConfig
from spanlm.objectives.charbert.masker import NoiseMasker, noise_variants


@pytest.fixture(scope="module")
def masker(english):
    return NoiseMasker.from_corpus(NoiseConfig(), english)


def test_variant_enumeration():
    assert noise_variants("cat", "xy", 4) == ["xcat", "ycat", "cxat", "cyat", "caxt", "cayt"]  # before index 0..len-1
    assert noise_variants("word", "xy", 4) == [
        "wrd",
        "wod",
        "wrod",
        "wodr",
    ]  # delete i / swap (i, i+1), i in [1, len-2]
    assert noise_variants("hello", "x", 4)[3:] == ["hlelo", "hello", "helol"]  # swapping equal letters changes nothing


def test_term_vocabulary_and_alphabet(masker, english):
    tables = masker.tables
    assert "the" in tables.terms[:3] and "," in tables.terms[:3]  # most frequent first
    assert all(t == t.lower() for t in tables.terms)
    assert len(set(tables.terms)) == len(tables.terms)
    assert tables.alphabet.isalnum() and len(tables.alphabet) <= 81 and "e" in tables.alphabet[:5]
    small = NoiseMasker.from_corpus(NoiseConfig(term_vocab_size=50), english)
    assert small.tables.terms == tables.terms[:50]


def test_the_variants_are_tokenized_on_first_use_or_by_prepare(english, blocks):
    lazy, prepared = (NoiseMasker.from_corpus(NoiseConfig(term_vocab_size=200), english) for _ in range(2))
    assert "variants" not in vars(lazy.tables) and "variants" not in vars(prepared.tables)  # terms only
    prepared.prepare()
    assert "variants" in vars(prepared.tables)
    (batch,) = blocks(english, 128, 16, 1)
    first, second = lazy(batch, np.random.default_rng(3)), prepared(batch, np.random.default_rng(3))
    assert "variants" in vars(lazy.tables)  # built by the first batch
    np.testing.assert_array_equal(first.input_ids, second.input_ids)
    np.testing.assert_array_equal(first.nlm_index, second.nlm_index)
    assert len(first.nlm_index) > 0
    variants = prepared.tables.variants
    assert len(variants.first) == len(prepared.tables.hashes) and variants.offsets[-1] == len(variants.tokens)


def noised_words(masked, tokens):
    """(noised string, term id) per noised word; a word ends where positions jump or the label changes."""
    index, labels = masked.nlm_index.tolist(), masked.nlm_labels.tolist()
    words, current = [], []
    for i, (position, label) in enumerate(zip(index, labels)):
        current.append(tokens[position])
        if i + 1 == len(index) or index[i + 1] != position + 1 or labels[i + 1] != label:
            words.append(("".join(t[2:] if t.startswith("##") else t for t in current), label))
            current = []
    return words


def classify(noised: str, original: str) -> str:
    """Which edit turns ``original`` into ``noised`` (within the paper's index ranges), or 'invalid'."""
    n = len(original)
    if n < 4:
        ok = len(noised) == n + 1 and any(noised[:p] + noised[p + 1 :] == original for p in range(n))
        return "insert" if ok else "invalid"
    if len(noised) == n - 1 and any(original[:i] + original[i + 1 :] == noised for i in range(1, n - 1)):
        return "delete"
    if len(noised) == n and any(
        original[:i] + original[i + 1] + original[i] + original[i + 2 :] == noised for i in range(1, n - 1)
    ):
        return "swap"
    return "invalid"


def test_noised_words_are_the_papers_edits_of_their_nlm_target(masker, english, blocks):
    tokenizer = english.tokenizer
    found = {"insert": 0, "delete": 0, "swap": 0}
    for seed, batch in enumerate(blocks(english, 128, 32, 3)):
        masked = masker(batch, np.random.default_rng(seed))
        tokens = tokenizer.convert_ids_to_tokens(masked.input_ids.reshape(-1).tolist())
        for noised, label in noised_words(masked, tokens):
            kind = classify(noised, masker.terms[label])
            assert kind != "invalid", (noised, masker.terms[label])
            found[kind] += 1
    assert min(found.values()) > 20


def test_operation_mix_and_noise_rate(masker, english, blocks):
    totals = dict.fromkeys(
        [
            "words",
            "noised_words",
            "noise_insert",
            "noise_delete",
            "noise_swap",
            "noise_unusable",
            "noise_out_of_vocabulary",
        ],
        0,
    )
    batches = blocks(english, 128, 32, 8)
    for epoch in range(6):  # the noise is dynamic: the same blocks get new noise every pass
        for number, batch in enumerate(batches):
            counters = masker(batch, np.random.default_rng([epoch, number])).counters
            for key in totals:
                totals[key] += counters[key]
    drawn = totals["noised_words"] + totals["noise_unusable"] + totals["noise_out_of_vocabulary"]
    assert drawn / totals["words"] == pytest.approx(0.10, abs=0.005)
    assert totals["noise_unusable"] < 0.05 * totals["noised_words"]
    long_words = totals["noise_delete"] + totals["noise_swap"]
    assert long_words > 4000  # enough draws for the ±0.02 check of the delete / swap split below
    assert totals["noise_delete"] / long_words == pytest.approx(0.5, abs=0.02)
    assert totals["noise_insert"] + long_words == totals["noised_words"]


def test_mlm_skips_noised_words_and_rate(masker, english, blocks):
    targets = content = 0
    for seed, batch in enumerate(blocks(english, 128, 32, 6)):
        masked = masker(batch, np.random.default_rng(seed))
        assert not np.isin(masked.target_index, masked.nlm_index).any()
        targets += len(masked.target_index)
        content += int(masked.attention_mask.sum()) - 2 * batch.input_ids.shape[0]
    assert targets / content == pytest.approx(0.10, abs=0.005)


def test_undoing_noise_and_masking_gives_back_the_block(masker, english, blocks):
    """Targets restored to their labels and noised words to their terms: the original text again."""
    tokenizer = english.tokenizer
    batch = blocks(english, 128, 32, 1)[0]
    masked = masker(batch, np.random.default_rng(7))
    assert masked.counters["noise_dropped_words"] == 0  # rows may grow up to max_len 512
    ids = masked.input_ids.reshape(-1).copy()
    ids[masked.target_index] = masked.target_labels
    width = masked.input_ids.shape[1]
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    noised_at = dict(zip(masked.nlm_index.tolist(), masked.nlm_labels.tolist()))
    for row in range(len(batch.input_ids)):
        restored, previous = [], None
        for position in range(row * width, row * width + int(masked.attention_mask[row].sum())):
            label = noised_at.get(position)
            if label is None:
                restored.append(tokens[position])
            elif previous != (position - 1, label):
                restored.append(masker.terms[label])
            previous = (position, label) if label is not None else None
        original = tokenizer.convert_ids_to_tokens(batch.input_ids[row][batch.attention_mask[row]].tolist())
        assert " ".join(restored).replace(" ##", "") == " ".join(original).replace(" ##", "")


def test_rows_that_outgrow_max_len_drop_their_last_words(english, blocks):
    masker = NoiseMasker.from_corpus(NoiseConfig(max_len=128, word_prob=0.5), english)
    batch = blocks(english, 128, 32, 1)[0]
    masked = masker(batch, np.random.default_rng(0))
    assert masked.input_ids.shape[1] <= 128
    assert masked.counters["noise_dropped_words"] > 0
    lengths = masked.attention_mask.sum(axis=1)
    np.testing.assert_array_equal(masked.input_ids[np.arange(len(lengths)), lengths - 1], english.special_ids["sep"])
    np.testing.assert_array_equal(masked.input_ids[:, 0], english.special_ids["cls"])
    free = NoiseMasker(dataclasses.replace(masker.config, max_len=512), masker.vocab, masker.tables, masker.pad_id)
    grown = free(batch, np.random.default_rng(0))
    assert grown.counters["noise_dropped_words"] == 0 and grown.input_ids.shape[1] > 128
