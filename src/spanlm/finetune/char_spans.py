"""Predicted character spans made whole: widened to grapheme clusters and trimmed of edge whitespace.

Why: a span comes from token offsets, and those can cut or pad what a reader sees as the answer. BERT's
normaliser strips a combining accent, so it belongs to no token and a span can end inside its cluster; a
byte-level BPE (RoBERTa's) makes a token of a run of spaces whose offsets are empty or all whitespace, so a span
can start or end on one — an entity of no characters, an answer with trailing spaces. NER and QA apply this to
every span they predict.
"""

from __future__ import annotations

import re

import numpy as np

NON_SPACE = re.compile(r"\S")


def whole_spans(text: str, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[start, end)`` character spans of ``text`` widened to whole grapheme clusters, then trimmed of the
    whitespace at both ends. A span with nothing but whitespace ends up empty (start >= end): callers drop it."""
    import regex

    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    if len(start) == 0:
        return start, end
    if not text.isascii() or "\r" in text:  # else every character is its own cluster
        bounds = np.array([match.start() for match in regex.finditer(r"\X", text)] + [len(text)], dtype=np.int64)
        start = bounds[np.searchsorted(bounds, start, "right") - 1]
        end = bounds[np.searchsorted(bounds, end, "left")]
    visible = np.array([match.start() for match in NON_SPACE.finditer(text)], dtype=np.int64)  # (V,) non-space chars
    if len(visible) == 0:
        return start, start
    after = np.searchsorted(visible, start, "left")  # the first non-space character at or after start
    start = np.where(after < len(visible), visible[np.minimum(after, len(visible) - 1)], len(text))
    before = np.searchsorted(visible, end, "left") - 1  # the last non-space character before end
    end = np.where(before >= 0, visible[np.maximum(before, 0)] + 1, 0)
    return start, np.maximum(end, start)
