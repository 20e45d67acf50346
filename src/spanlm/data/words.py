"""Token ids and word-start flags for a batch of sentences — vectorised over the whole batch.

Word boundaries come from the fast tokenizer's pre-tokenization (``Encoding.word_ids``), which is
right for WordPiece, byte-level BPE and SentencePiece alike; string prefixes such as "##", "Ġ" or "▁"
are never inspected. For Chinese, BERT tokenizes per character, so ``words: jieba`` segments the text
with jieba and a token starts a word when its first character opens a jieba word.
"""

from __future__ import annotations

import logging
from functools import cache
from itertools import chain

import numpy as np

from spanlm.data.tokenizer import encode_text


def encode_sentences(tokenizer, texts: list[str], words: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokenize ``texts`` without special tokens (the text of one, e.g. a literal "[MASK]", is ordinary text).

    Returns ``ids`` (int64, all sentences concatenated), ``word_starts`` (bool, same length) and
    ``lengths`` (int64, tokens per sentence).
    """
    encodings = encode_text(tokenizer, texts)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=np.int64, count=int(lengths.sum()))
    sentence_first = np.zeros(len(ids), dtype=bool)
    sentence_first[(np.cumsum(lengths) - lengths)[lengths > 0]] = True
    if words == "jieba":
        word_index = jieba_word_index(texts, encodings, lengths)
    else:
        # None (a non-special added token of a loaded tokenizer, matched in the text) becomes NaN: a word of its own.
        word_index = np.array(list(chain.from_iterable(e.word_ids for e in encodings)), dtype=np.float64)
    word_starts = sentence_first.copy()
    word_starts[1:] |= word_index[1:] != word_index[:-1]  # NaN != anything, so added tokens start words
    return ids, word_starts, lengths


@cache
def _jieba():
    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return jieba


def jieba_word_index(texts: list[str], encodings, lengths: np.ndarray) -> np.ndarray:
    """For every token, the index of the jieba word holding its first character (global over the batch)."""
    jieba = _jieba()
    word_start_chars, text_offsets, offset = [], np.zeros(len(texts), dtype=np.int64), 0
    for i, text in enumerate(texts):  # jieba itself is per-sentence Python; the token mapping below is vectorised
        text_offsets[i] = offset
        word_start_chars.extend(offset + start for _, start, _ in jieba.tokenize(text))
        offset += len(text) + 1
    token_chars = np.array(list(chain.from_iterable(e.offsets for e in encodings)), dtype=np.int64).reshape(-1, 2)[:, 0]
    token_chars += np.repeat(text_offsets, lengths)  # sentence-local → batch-global character positions
    return np.searchsorted(np.array(word_start_chars, dtype=np.int64), token_chars, side="right").astype(np.float64)
