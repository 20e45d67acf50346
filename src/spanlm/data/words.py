"""Token ids and word-start flags for a batch of sentences — vectorised over the whole batch.

Word boundaries come from the fast tokenizer's pre-tokenization (``Encoding.word_ids``), which is
right for WordPiece, byte-level BPE and SentencePiece alike; string prefixes such as "##", "Ġ" or "▁"
are never inspected. For Chinese, BERT tokenizes per character, so ``words: jieba`` segments the text
as jieba does (:func:`jieba_word_starts`: the same words, mostly computed in Rust and NumPy) and a
token starts a word when its first character opens a jieba word.
"""

from __future__ import annotations

import logging
import re
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
    id_lists = [e.ids for e in encodings]  # each .ids builds a new Python list: read once
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    ids = np.fromiter(chain.from_iterable(id_lists), dtype=np.int64, count=int(lengths.sum()))
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


# jieba's blocks (its ``re_han_default``): runs of ideographs, ASCII letters and digits and "+#&._%-".
IDEOGRAPHS = (0x4E00, 0x9FD5)  # the ideographs jieba's dictionary and HMM cover, inclusive
_BLOCK_ASCII = np.zeros(128, dtype=bool)
_BLOCK_ASCII[[ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+#&._%-"]] = True
_NOT_IDEOGRAPH = re.compile(r"[^\u4E00-\u9FD5]")


def jieba_word_starts(text: str) -> np.ndarray:
    """The character positions where jieba's default segmentation of ``text`` (``jieba.tokenize(text)``,
    HMM on) starts a word, for a text without "\\r\\n" — the same positions, computed mostly outside Python.

    jieba segments each of its blocks on its own: a block of ideographs by the dictionary's best
    route (a DAG of dictionary words), whose runs of single characters that together are no dictionary
    word go to its HMM; a block that mixes in ASCII letters, digits or "+#&._%-" the same way, with
    its own rules for the ASCII; every other character is a word of its own. Here rjieba (jieba-rs)
    finds the dictionary route of every ideograph block in one call — the same dictionary and arithmetic
    as jieba, and the slow part of its Python — and jieba's HMM runs as NumPy over all its runs at once
    (jieba-rs's own HMM decides near-ties differently); mixed blocks go to jieba itself.
    """
    import rjieba

    jieba = _jieba()
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ideograph = (codes >= IDEOGRAPHS[0]) & (codes <= IDEOGRAPHS[1])
    # Every other character becomes a newline: jieba-rs then sees exactly jieba's ideograph blocks, at the
    # same character positions, and each newline is a word of its own.
    words = rjieba.cut(_NOT_IDEOGRAPH.sub("\n", text), hmm=False)
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    starts = np.cumsum(lengths) - lengths
    is_start = np.zeros(len(text), dtype=bool)
    is_start[starts] = True
    # jieba's HMM runs: two or more consecutive single-ideograph words that together are no dictionary word.
    single = (lengths == 1) & ideograph[starts]
    runs = np.flatnonzero(np.diff(single, prepend=False, append=False)).reshape(-1, 2)  # [first, end) word indices
    runs = runs[runs[:, 1] - runs[:, 0] >= 2]
    begins, ends = starts[runs[:, 0]], starts[runs[:, 1] - 1] + 1
    unknown = np.array([not jieba.dt.FREQ.get(text[a:b]) for a, b in zip(begins.tolist(), ends.tolist())], dtype=bool)
    begins, ends = begins[unknown], ends[unknown]
    if len(begins):
        positions = _positions_in(begins, ends)
        states = hmm_states(codes[positions] - IDEOGRAPHS[0], ends - begins)
        is_start[positions] = (states == HMM_STATES.index("B")) | (states == HMM_STATES.index("S"))
        # A path opening in M or E (possible only where jieba's tables know none of the first characters)
        # gets words from jieba's own reading of such a path.
        odd = ~is_start[begins]
        _jieba_cut_into(is_start, text, begins[odd], ends[odd], jieba.finalseg.cut)
    # Blocks with ideographs and ASCII or ASCII alone (a number, "www.example.com"): jieba itself.
    block_ascii = (codes < 128) & _BLOCK_ASCII[np.minimum(codes, 127)]
    blocks = np.flatnonzero(np.diff(ideograph | block_ascii, prepend=False, append=False)).reshape(
        -1, 2
    )  # [begin, end)
    ascii_before = np.concatenate([[0], np.cumsum(block_ascii)])
    mixed = blocks[ascii_before[blocks[:, 1]] > ascii_before[blocks[:, 0]]]
    _jieba_cut_into(is_start, text, mixed[:, 0], mixed[:, 1], jieba.cut)
    return np.flatnonzero(is_start)


def _jieba_cut_into(is_start: np.ndarray, text: str, begins: np.ndarray, ends: np.ndarray, cut) -> None:
    """Mark the word starts of each piece ``text[begin:end]`` as ``cut`` (jieba's own segmentation) gives them."""
    if not len(begins):
        return
    is_start[_positions_in(begins, ends)] = False
    starts = []
    for begin, end in zip(begins.tolist(), ends.tolist()):
        for word in cut(text[begin:end]):
            starts.append(begin)
            begin += len(word)
    is_start[starts] = True


def _positions_in(begins: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Every position of the ranges [begin, end), concatenated."""
    lengths = ends - begins
    return np.repeat(begins - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))


HMM_STATES = "BMES"  # begin, middle, end of a word, single-character word


@cache
def _hmm_tables() -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int, float, float]]]:
    """jieba's HMM (``jieba.finalseg``) as arrays: start log-probabilities (4,), emission log-probabilities
    of every ideograph (ideographs, 4), and per state its two possible predecessors with the transition
    log-probabilities, the predecessor that jieba prefers on a tie first."""
    from jieba import finalseg

    start = np.array([finalseg.start_P[y] for y in HMM_STATES])
    ideographs = [chr(code) for code in range(IDEOGRAPHS[0], IDEOGRAPHS[1] + 1)]
    emit = np.array([[finalseg.emit_P[y].get(c, finalseg.MIN_FLOAT) for y in HMM_STATES] for c in ideographs])
    predecessors = []
    for y in HMM_STATES:
        # jieba takes max((probability, predecessor)): on equal probabilities, the later letter.
        high, low = sorted(finalseg.PrevStatus[y], reverse=True)
        predecessors.append(
            (
                HMM_STATES.index(high),
                HMM_STATES.index(low),
                HMM_STATES.index(y),
                finalseg.trans_P[high][y],
                finalseg.trans_P[low][y],
            )
        )
    return start, emit, predecessors


def hmm_states(chars: np.ndarray, run_lengths: np.ndarray) -> np.ndarray:
    """jieba's Viterbi path (``jieba.finalseg.viterbi``: states B/M/E/S as 0–3) of every run at once.

    ``chars``: the runs' characters concatenated, as offsets into the ideograph range; ``run_lengths``:
    each run's length (≥ 1). Every step adds in jieba's order and breaks ties as jieba's ``max`` over
    (probability, state) tuples does, so the paths are jieba's to the last bit.
    """
    start, emit, predecessors = _hmm_tables()
    order = np.argsort(-run_lengths, kind="stable")  # longest first: the runs still going are a prefix
    lengths = run_lengths[order]
    offsets = (np.cumsum(run_lengths) - run_lengths)[order]
    active = np.searchsorted(-lengths, -np.arange(1, lengths[0] + 1), side="right")  # runs longer than t, per step t
    probabilities = start + emit[chars[offsets]]  # (runs, 4)
    back = []  # per step t ≥ 1: (active[t], 4) the predecessor of each state
    final = np.empty(len(lengths), dtype=np.int8)
    for t in range(1, lengths[0] + 1):
        ending = slice(active[t] if t < len(active) else 0, active[t - 1])  # runs whose last character is t - 1
        # jieba: max((V[E], "E"), (V[S], "S")) — S on a tie.
        final[ending] = np.where(probabilities[ending, 3] >= probabilities[ending, 2], 3, 2)
        if t == len(active):
            break
        previous, em = probabilities[: active[t]], emit[chars[offsets[: active[t]] + t]]
        probabilities = np.empty_like(previous)
        steps = np.empty(previous.shape, dtype=np.int8)
        for high, low, y, from_high, from_low in predecessors:
            via_high = previous[:, high] + from_high + em[:, y]
            via_low = previous[:, low] + from_low + em[:, y]
            take_high = via_high >= via_low
            probabilities[:, y] = np.where(take_high, via_high, via_low)
            steps[:, y] = np.where(take_high, high, low)
        back.append(steps)
    states = np.empty(len(chars), dtype=np.int8)
    current = np.empty(0, dtype=np.int8)
    for t in range(lengths[0] - 1, -1, -1):  # back from each run's final state
        following = len(current)
        if t + 1 < lengths[0]:
            current = back[t][np.arange(following), current]
        current = np.concatenate([current, final[following : active[t]]])
        states[offsets[: active[t]] + t] = current
    return states


def jieba_word_index(texts: list[str], encodings, lengths: np.ndarray) -> np.ndarray:
    """For every token, the index of the jieba word holding its first character (global over the batch)."""
    # One text for the whole batch: a newline starts a block of its own in jieba, so no word crosses it.
    text_offsets = np.cumsum([0] + [len(text) + 1 for text in texts[:-1]])
    word_start_chars = jieba_word_starts("\n".join(texts))
    token_chars = np.array(list(chain.from_iterable(e.offsets for e in encodings)), dtype=np.int64).reshape(-1, 2)[:, 0]
    token_chars += np.repeat(text_offsets, lengths)  # sentence-local → batch-global character positions
    return np.searchsorted(word_start_chars, token_chars, side="right").astype(np.float64)
