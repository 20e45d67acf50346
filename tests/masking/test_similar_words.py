"""The similar-word table: word hashing and types, and the three ways `spanlm prepare` builds it."""

from __future__ import annotations

import builtins
from collections import Counter

import numpy as np
import pytest

from helpers import EMBEDDED_CORPUS
from spanlm.config import from_dict
from spanlm.data.prepare import input_fingerprint, prepare
from spanlm.data.shards import PreparedCorpus
from spanlm.data.similar_words import SimilarWords, build_similar_words, count_word_types, word_hash
from spanlm.errors import InputError
from spanlm.pretrain.recipe import Recipe


def test_word_hash_identifies_id_sequences():
    tokens = np.array([7, 8, 7, 8, 8, 7, 7])
    hashes = word_hash(tokens, np.array([0, 2, 4, 5, 6]), np.array([2, 2, 1, 1, 1]))
    assert hashes[0] == hashes[1]  # [7, 8] twice
    assert hashes[2] != hashes[3] == hashes[4]  # [8] vs [7]
    assert (
        len({int(h) for h in word_hash(np.array([1, 2, 2, 1, 1, 1]), np.array([0, 2, 4]), np.array([2, 2, 2]))}) == 3
    )  # order matters
    assert (
        word_hash(np.array([5, 0]), np.array([0]), np.array([2]))[0]
        != word_hash(np.array([5]), np.array([0]), np.array([1]))[0]
    )


def test_word_types_count_every_word(english):
    types = count_word_types(english.ids, english.word_starts, english.sentence_offsets)
    starts = np.flatnonzero(np.asarray(english.word_starts))
    ids = np.asarray(english.ids)
    expected = Counter(tuple(ids[a:b]) for a, b in zip(starts, np.append(starts[1:], len(ids))))
    assert len(types) == len(expected)
    assert types.counts.sum() == len(starts)
    assert np.all(np.diff(types.hashes) > 0)
    for i in np.argsort(-types.counts)[:50]:
        assert expected[tuple(types.ids(english.ids, i))] == types.counts[i]


def test_word2vec_table(english):
    table = SimilarWords.load(english.directory)
    assert english.meta["similar_words"]["source"] == "word2vec"
    assert len(table) > 200 and np.all(np.diff(table.hashes) > 0)
    counts = np.diff(table.offsets)
    assert counts.min() >= 1 and counts.max() <= 5  # similar_words_k
    special = english.meta["all_special_ids"]
    for s in range(len(table)):
        for e in range(table.offsets[s], table.offsets[s + 1]):
            ids = table.tokens[table.token_offsets[e] : table.token_offsets[e] + table.lengths[s]]
            assert not np.isin(ids, special).any()
            assert word_hash(ids, np.array([0]), np.array([len(ids)]))[0] != table.hashes[s]  # never the word itself
    said = list(table.words).index("said")
    assert "said" not in table.neighbours[table.offsets[said] : table.offsets[said + 1]]


def test_lookup(english):
    table = SimilarWords.load(english.directory)
    rows = table.lookup(np.append(table.hashes[:3], 12345), np.append(table.lengths[:3], 1))
    assert rows.tolist() == [0, 1, 2, -1]
    assert table.lookup(table.hashes[:1], table.lengths[:1] + 1).tolist() == [-1]  # the length must match too
    picks = table.pick(np.zeros(10_000, dtype=np.int64), np.random.default_rng(0))
    assert set(picks.tolist()) == set(range(table.offsets[0], table.offsets[1]))


def recipe(tmp_path, **data):
    return from_dict(
        Recipe,
        {
            "data": {
                "inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")],
                "prepared_dir": str(tmp_path / "prepared"),
                **data,
            },
            "tokenizer": {"vocab_size": 1500},
        },
    )


def test_vector_file_and_fingerprint(tmp_path):
    vectors = tmp_path / "vectors.txt"
    # "alice" is closest to "queen", then "hatter"; "rabbit" closest to "turtle". Upper case is normalised.
    vectors.write_text(
        "6 3\nAlice 1 0 0\nqueen 0.9 0.1 0\nhatter 0.7 0.3 0\nrabbit 0 1 0\nturtle 0 0.9 0.1\nxyzzyq 0 0 1\n",
        encoding="utf-8",
    )
    configured = recipe(tmp_path, similar_words="vectors", similar_words_file=str(vectors), similar_words_k=2)
    assert input_fingerprint(configured, [EMBEDDED_CORPUS / "alice_in_wonderland.txt"]) != input_fingerprint(
        recipe(tmp_path), [EMBEDDED_CORPUS / "alice_in_wonderland.txt"]
    )
    table = SimilarWords.load(prepare(configured, log=lambda *_: None))
    listed = {
        str(w): table.neighbours[table.offsets[i] : table.offsets[i + 1]].tolist() for i, w in enumerate(table.words)
    }
    assert listed["alice"] == ["queen", "hatter"]
    assert listed["rabbit"][0] == "turtle"
    assert "xyzzyq" not in listed  # not a corpus word


def test_synonym_file_errors(tmp_path):
    from spanlm.errors import ConfigError

    with pytest.raises(ConfigError, match="needs similar_words_file"):
        recipe(tmp_path, similar_words="synonyms")
    bad = tmp_path / "bad.tsv"
    bad.write_text("alice\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"bad.tsv:1: expected word<TAB>synonym"):
        prepare(recipe(tmp_path, similar_words="synonyms", similar_words_file=str(bad)), log=lambda *_: None)


def test_missing_gensim_is_a_clear_error(tmp_path, english, monkeypatch):
    import types

    real_import = builtins.__import__

    def no_gensim(name, *args, **kwargs):
        if name == "gensim" or name.startswith("gensim."):
            raise ImportError("No module named 'gensim'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gensim)
    config = types.SimpleNamespace(
        similar_words="word2vec", similar_words_k=5, similar_words_min_count=3, num_proc=1, similar_words_file=None
    )
    with pytest.raises(InputError, match=r"pip install 'spanlm\[gensim\]'"):
        build_similar_words(PreparedCorpus(english.directory).directory, english.tokenizer, config, log=lambda *_: None)
