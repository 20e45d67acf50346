"""Character ↔ token alignment through the fast tokenizer's offset mapping.

Documents are tokenized once, without special tokens, in one batched call; every token keeps its
``[start, end)`` characters in its document (``return_offsets_mapping``), whatever normalisation the
tokenizer applied (lower-casing, accent stripping, CJK splitting, byte-level pieces).

A character span ``[s, e)`` covers the tokens that overlap it: the first token ending after ``s`` to
the last token starting before ``e``. When those tokens' outer offsets are exactly ``s`` and ``e`` the
span is *exact* (it maps back to the same characters); otherwise it is *snapped* to the covering
tokens (e.g. "Paris" inside the single token "Parisian", or a span starting inside a WordPiece) and
counted in :class:`AlignmentReport` — never dropped. A span no token overlaps (only whitespace or
characters the tokenizer deletes) cannot be represented at all and is counted as *unaligned*.

All documents are aligned in one ``np.searchsorted`` over the concatenated token offsets, shifted by a
per-document character base, so there is no loop over characters, tokens or entities.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spanlm.errors import InputError


@dataclasses.dataclass
class TokenizedDocuments:
    """The content tokens (no special tokens) of a list of texts, concatenated."""

    input_ids: np.ndarray  # (T,) int64
    offsets: np.ndarray  # (T, 2) int64: [start, end) characters of each token in its own text
    token_starts: np.ndarray  # (D + 1,) int64: document d owns tokens token_starts[d]:token_starts[d + 1]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.token_starts)  # (D,)


def tokenize_documents(tokenizer, texts: list[str]) -> TokenizedDocuments:
    """One batched fast-tokenizer call over ``texts`` → flat ids and character offsets."""
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(
            f"{getattr(tokenizer, 'name_or_path', tokenizer)}: NER needs a fast tokenizer (character offsets)"
        )
    if not texts:
        return TokenizedDocuments(np.zeros(0, np.int64), np.zeros((0, 2), np.int64), np.zeros(1, np.int64))
    # verbose=False: documents longer than the model are expected here; windows cut them later.
    # split_special_tokens: a literal "[SEP]" or "<s>" in a document is text, not a separator.
    encoded = tokenizer(
        texts,
        add_special_tokens=False,
        return_offsets_mapping=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
        split_special_tokens=True,
    )
    lengths = np.fromiter((len(ids) for ids in encoded["input_ids"]), dtype=np.int64, count=len(texts))
    token_starts = np.concatenate([[0], np.cumsum(lengths)])
    input_ids = np.fromiter(
        (i for ids in encoded["input_ids"] for i in ids), dtype=np.int64, count=int(token_starts[-1])
    )
    offsets = np.array([pair for spans in encoded["offset_mapping"] for pair in spans], dtype=np.int64).reshape(
        -1, 2
    )  # (T, 2)
    return TokenizedDocuments(input_ids, offsets, token_starts)


@dataclasses.dataclass
class AlignmentReport:
    """How the character spans of one file mapped onto tokens."""

    entities: int = 0
    exact: int = 0
    snapped: int = 0  # widened to the covering tokens (kept)
    unaligned: int = 0  # no token overlaps the span (cannot be represented; not trained)
    examples: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)  # (doc id, given text, snapped text)

    def summary(self) -> dict:
        return {"entities": self.entities, "exact": self.exact, "snapped": self.snapped, "unaligned": self.unaligned}

    def lines(self, name: str, limit: int = 5) -> list[str]:
        out = []
        if self.snapped:
            cases = ", ".join(f"{doc}: {given!r}→{snapped!r}" for doc, given, snapped in self.examples[:limit])
            out.append(
                f"{name}: {self.snapped} of {self.entities} entities are not on token boundaries and were snapped "
                f"to the covering tokens: {cases}"
            )
        if self.unaligned:
            out.append(
                f"{name}: {self.unaligned} entities cover no token (whitespace or characters the tokenizer drops) "
                "and cannot be trained on"
            )
        return out


def char_to_token(
    tokens: TokenizedDocuments, document: np.ndarray, start: np.ndarray, end: np.ndarray, text_lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Character spans ``[start, end)`` of documents ``document`` → covering token spans.

    Returns ``(first_token, last_token, exact, aligned)``, all (E,): token indices relative to the
    document (last inclusive), whether the tokens' outer offsets equal the span, and whether any token
    overlaps it (where not, the token indices are meaningless).
    """
    n_tokens = len(tokens.input_ids)
    if len(document) == 0 or n_tokens == 0:
        zeros = np.zeros(len(document), np.int64)
        return zeros, zeros, np.zeros(len(document), bool), np.zeros(len(document), bool)
    # Shift every document's characters past the previous ones (+1 so documents never touch): the
    # concatenated token starts and ends are then sorted and one searchsorted serves all documents.
    char_base = np.concatenate([[0], np.cumsum(text_lengths + 1)])  # (D + 1,)
    token_document = np.repeat(np.arange(len(tokens.lengths)), tokens.lengths)  # (T,)
    starts = tokens.offsets[:, 0] + char_base[token_document]  # (T,)
    ends = tokens.offsets[:, 1] + char_base[token_document]
    # Byte-level tokenizers give every piece of a multi-byte character the whole character: starts and
    # ends are non-decreasing, which is all searchsorted needs; the running maximum guards the rest.
    g_start, g_end = start + char_base[document], end + char_base[document]
    first = np.searchsorted(
        np.maximum.accumulate(ends), g_start, side="right"
    )  # first token ending after the span's start
    last = np.searchsorted(np.maximum.accumulate(starts), g_end, side="left") - 1  # last token starting before its end
    lo, hi = tokens.token_starts[document], tokens.token_starts[document + 1]
    aligned = (first < hi) & (last >= lo) & (first <= last)
    first_c, last_c = np.clip(first, 0, n_tokens - 1), np.clip(last, 0, n_tokens - 1)
    exact = aligned & (starts[first_c] == g_start) & (ends[last_c] == g_end)
    return first - lo, last - lo, exact, aligned


def token_to_char(offsets: np.ndarray, first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token spans (last inclusive) of one offset table (T, 2) → character spans ``[start, end)``."""
    return offsets[first, 0], offsets[last, 1]
