"""CharBERT char inputs: vocabulary, token spellings (WordPiece and byte-level BPE), the char stream."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from helpers import make_recipe
from spanlm.data.chars import (
    PAD_CHAR,
    CharFeaturizer,
    CharVocab,
    Spelling,
    build_char_vocab,
    char_stream,
    token_surfaces,
)
from spanlm.data.prepare import prepare
from spanlm.data.shards import PreparedCorpus

TEXT = "The unbelievable backhanded compliment surprised everyone, naïve café owners included."
BPE_TEXT = "Unbelievable backhanded compliments! naïve café 東京 owners"


@pytest.fixture(scope="module")
def wordpiece(embedded_prepared):
    return PreparedCorpus(embedded_prepared)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A byte-level BPE tokenizer (cased) trained on a little text with accents and CJK characters."""
    text = "\n".join(
        [BPE_TEXT, "The backhand was unbelievable.", "Café owners in 東京 are naïve.", "compliment " * 3] * 20
    )
    recipe = make_recipe(
        tmp_path_factory.mktemp("bpe"),
        {"a.txt": text},
        tokenizer={"kind": "bpe", "vocab_size": 300, "lowercase": False},
    )
    return PreparedCorpus(prepare(recipe, log=lambda *_: None))


def test_char_vocabulary_layout_and_frequency_order():
    vocab = CharVocab.build(["ab", "b", "", None, "c"], np.array([1, 5, 9, 9, 2]), size=4)
    # counts: a 1, b 1 + 5, c 2 → b, c kept (size - 2), pad 0, unk last
    assert vocab.chars == ["b", "c"] and vocab.size == 4 and vocab.unk_id == 3
    assert vocab.encode("bca") == [1, 2, 3]


def test_char_vocabulary_of_a_corpus(wordpiece):
    vocab = build_char_vocab(wordpiece, 40)
    assert vocab.size == 40 and vocab.chars[0] == "e"  # the most frequent English letter first
    with pytest.raises(ValueError, match="single characters"):  # as an export's config.json could hold it
        CharVocab(["e", "ab"])


def surfaces_match_offsets(tokenizer, text, normalize):
    """Each token's spelling is its surface form at the tokenizer's character offsets."""
    surfaces = token_surfaces(tokenizer)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    checked = 0
    for token_id, (start, end) in zip(encoding["input_ids"], encoding["offset_mapping"]):
        if surfaces[token_id] is None:  # a byte-level fragment of a multi-byte character
            continue
        assert surfaces[token_id] == normalize(text[start:end]).strip(), (
            tokenizer.convert_ids_to_tokens(token_id),
            text[start:end],
        )
        checked += 1
    return checked, len(encoding["input_ids"])


def test_wordpiece_spellings_are_the_surface_at_the_offsets(wordpiece):
    tokenizer = wordpiece.tokenizer
    pieces = tokenizer.tokenize("unbelievable")
    assert len(pieces) > 1 and pieces[1].startswith("##")  # continuation pieces do occur
    checked, total = surfaces_match_offsets(tokenizer, TEXT, tokenizer.backend_tokenizer.normalizer.normalize_str)
    assert checked == total
    surfaces = token_surfaces(tokenizer)
    assert all(surfaces[i] == "" for i in tokenizer.all_special_ids)
    assert not any(s and s.startswith("##") for s in surfaces)


def test_byte_level_bpe_spellings_are_the_surface_at_the_offsets(bpe):
    tokenizer = bpe.tokenizer
    assert any(t.startswith("Ġ") for t in tokenizer.tokenize(BPE_TEXT))  # space-marked pieces do occur
    checked, total = surfaces_match_offsets(tokenizer, BPE_TEXT, lambda s: s)
    assert checked >= total - 6  # only fragments of 東 / 京 (3 UTF-8 bytes each) may lack a spelling
    surfaces = token_surfaces(tokenizer)
    assert "café" in surfaces or any("é" in (s or "") for s in surfaces)  # multi-byte characters decoded
    assert not any(s and ("Ġ" in s or s != s.strip()) for s in surfaces)


def spelled(stream, row, column):
    """The char ids of token (row, column) as the stream lays them out."""
    return stream["char_ids"][row, stream["char_first"][row, column] : stream["char_last"][row, column] + 1].tolist()


def test_stream_layout_blank_and_padding(wordpiece):
    tokenizer = wordpiece.tokenizer
    vocab = build_char_vocab(wordpiece, 200)
    spelling = Spelling.from_tokenizer(tokenizer, vocab)
    rows = [tokenizer(TEXT)["input_ids"], tokenizer("Alice was tired")["input_ids"]]
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = np.array([r + [pad] * (width - len(r)) for r in rows])
    blank = np.zeros_like(ids, dtype=bool)
    blank[0, 3] = True
    stream = char_stream(ids, blank, spelling, pad)
    surfaces = token_surfaces(tokenizer)
    for row, tokens in enumerate(rows):
        for column, token in enumerate(tokens):
            chars = spelled(stream, row, column)
            if token in tokenizer.all_special_ids or blank[row, column]:
                assert chars == [PAD_CHAR]  # [CLS], [SEP], a blanked token: one pad char, nothing to read
            else:
                assert chars == vocab.encode(surfaces[token])
            separator = stream["char_last"][row, column] + 1
            assert stream["char_ids"][row, separator] == PAD_CHAR  # tokens are separated by the pad char
            if column + 1 < len(tokens):
                assert stream["char_first"][row, column + 1] == separator + 1
        # Padding takes no characters: the row ends right after its last real token's separator.
        assert stream["char_lengths"][row] == stream["char_last"][row, len(tokens) - 1] + 2
        assert (stream["char_first"][row, len(tokens) :] == 0).all()
    assert stream["char_ids"].shape[1] == stream["char_lengths"].max()


def test_featurizer_spells_unknown_tokens_from_the_text_and_pickles(wordpiece):
    tokenizer = wordpiece.tokenizer
    vocab = build_char_vocab(wordpiece, 200)
    featurizer = CharFeaturizer(
        vocab,
        Spelling.from_tokenizer(tokenizer, vocab),
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
        tokenizer.backend_tokenizer.normalizer,
    )
    text = "Alice saw ☃ today"  # the snowman is not in the WordPiece vocabulary: [UNK]
    encoding = tokenizer(text, return_offsets_mapping=True)
    ids = np.array([encoding["input_ids"]])
    offsets = np.array([encoding["offset_mapping"]])
    unk = encoding["input_ids"].index(tokenizer.unk_token_id)
    inputs = featurizer(ids, offsets, [text])
    assert spelled(inputs, 0, unk) == [vocab.unk_id]  # the snowman's one character, unknown to the char vocabulary
    plain = char_stream(ids, np.zeros_like(ids, dtype=bool), featurizer.spelling, tokenizer.pad_token_id)
    assert plain["char_ids"][0, plain["char_first"][0, unk]] == PAD_CHAR  # without the text: the pad char
    # Everything else is spelt exactly as in pretraining.
    for column in range(ids.shape[1]):
        if column != unk:
            assert spelled(inputs, 0, column) == spelled(plain, 0, column)
    again = pickle.loads(pickle.dumps(featurizer))(ids, offsets, [text])
    for key, value in inputs.items():
        np.testing.assert_array_equal(again[key], value)
