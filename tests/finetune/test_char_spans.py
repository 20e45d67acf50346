"""Predicted spans made whole: grapheme clusters kept, edge whitespace trimmed, spans of only spaces dropped."""

from __future__ import annotations

import numpy as np
import pytest

from spanlm.finetune.char_spans import whole_spans


@pytest.mark.parametrize(
    "text, span, expected",
    [
        ("Holmes  \t  Watson", (0, 8), (0, 6)),  # trailing spaces and tab
        ("Holmes  \t  Watson", (6, 17), (11, 17)),  # leading
        ("Holmes  \t  Watson", (6, 11), None),  # only whitespace: empty
        ("Holmes  \t  Watson", (8, 8), None),  # empty stays empty
        ("Holmes  \t  Watson", (3, 3), None),  # inside a word too
        ("   ", (0, 3), None),  # a text of spaces
        ("Cafe\u0301 noir", (0, 4), (0, 5)),  # a cut combining accent joins its letter
        ("Holmes\r\nWatson", (0, 7), (0, 6)),  # half a CRLF widened, then trimmed
        ("x", (0, 1), (0, 1)),
    ],
)
def test_whole_spans(text, span, expected):
    start, end = whole_spans(text, np.array([span[0]]), np.array([span[1]]))
    got = (int(start[0]), int(end[0]))
    if expected is None:
        assert got[0] == got[1]
    else:
        assert got == expected and text[got[0] : got[1]] == text[got[0] : got[1]].strip() != ""


def test_every_span_of_a_byte_level_bpe_is_whole_or_dropped(tmp_path):
    """A byte-level BPE (RoBERTa's) makes tokens of runs of spaces with empty or blank offsets: spans from every
    pair of its tokens, as a decoder may predict them, come out non-empty and without edge whitespace, or not at
    all — the entities an NER model returns read back as entities."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    from spanlm.ner.data import NerDocument
    from spanlm.ner.predict import Spans, whole

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["Holmes met Watson in London ."] * 20, vocab_size=300, min_frequency=1)
    bpe.save(str(tmp_path / "tokenizer.json"))
    tokenizer = RobertaTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    texts = ["Holmes  \t  Watson", "   ", "in  London ."]
    documents = [NerDocument(str(i), text, []) for i, text in enumerate(texts)]
    rows = []
    for d, text in enumerate(texts):
        offsets = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
        rows += [(d, a[0], b[1]) for i, a in enumerate(offsets) for b in offsets[i:]]
    blank = [(d, s, e) for d, s, e in rows if not texts[d][s:e].strip()]
    assert blank, "the tokenizer made no token of spaces alone: the test checks nothing"
    document, start, end = (np.array(column, dtype=np.int64) for column in zip(*rows))
    spans = whole(Spans(document, np.zeros_like(start), start, end, np.zeros(len(rows))), documents)
    assert len(spans.start) == len(rows) - len(blank)
    for d, s, e in zip(spans.document, spans.start, spans.end):
        piece = texts[d][s:e]
        assert piece and piece == piece.strip(), (texts[d], s, e)
