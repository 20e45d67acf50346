"""Vectorised building blocks shared by the maskers: words of a batch, budgets, ragged ranges,
random replacement tokens and the 80/10/10 corruption step.

Everything works on *flat* B×L positions so that a whole batch is one set of array operations; rows
never mix because every row starts with [CLS] and ends with [SEP], which are never part of a word.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spanlm.masking.base import MASK, RANDOM, Proportions, Vocabulary


def ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths  # where each range begins in the output
    return np.repeat(np.asarray(starts, dtype=np.int64) - offsets, lengths) + np.arange(total, dtype=np.int64)


def segment_first(segment: np.ndarray) -> np.ndarray:
    """For a non-decreasing array of segment ids, the index where each element's segment begins."""
    return np.searchsorted(segment, segment, side="left")


def round_budget(rate: float, n: np.ndarray) -> np.ndarray:
    """``round(rate × n)`` (halves up), at least 1 where n > 0 — BERT's num_to_predict."""
    n = np.asarray(n, dtype=np.int64)
    budget = np.floor(rate * n + 0.5).astype(np.int64)
    return np.minimum(np.where(n > 0, np.maximum(budget, 1), 0), n)


def ceil_budget(rate: float, n: np.ndarray) -> np.ndarray:
    """``ceil(rate × n)`` — SpanBERT's mask_num. The epsilon keeps 0.15 × 20 = 3.0000000000000004 at 3."""
    n = np.asarray(n, dtype=np.int64)
    return np.minimum(np.ceil(rate * n - 1e-9).astype(np.int64), n)


def units(word_starts: np.ndarray, special_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat ``(start, length)`` of every unit of a batch: each word, and each special token alone.

    A unit begins at a word start, at a special token, and right after one — so a hand-built batch
    whose first content token lacks the word-start flag still gets a proper word there.
    """
    special = special_mask.reshape(-1)
    after_special = np.zeros_like(special)
    after_special[1:] = special[:-1]
    start = np.flatnonzero(word_starts.reshape(-1) | special | after_special)
    return start, np.diff(np.append(start, special.size))


@dataclasses.dataclass
class Words:
    """The whole words of a batch (the units of :func:`units` that are not special), in flat order."""

    start: np.ndarray  # (U,) flat position of each word's first token
    length: np.ndarray  # (U,) tokens in the word
    row: np.ndarray  # (U,) batch row of the word
    row_first: np.ndarray  # (B,) index of the row's first word (words of a row are consecutive)
    row_count: np.ndarray  # (B,) words in the row
    n_tokens: int  # B × L

    @classmethod
    def of(cls, word_starts: np.ndarray, special_mask: np.ndarray) -> Words:
        return cls.from_units(*units(word_starts, special_mask), special_mask)

    @classmethod
    def from_units(cls, unit_start: np.ndarray, unit_length: np.ndarray, special_mask: np.ndarray) -> Words:
        batch_size, width = special_mask.shape
        is_word = ~special_mask.reshape(-1)[unit_start]
        start, length = unit_start[is_word], unit_length[is_word]
        row = start // width
        return cls(
            start=start,
            length=length,
            row=row,
            row_first=np.searchsorted(row, np.arange(batch_size)),
            row_count=np.bincount(row, minlength=batch_size),
            n_tokens=special_mask.size,
        )

    def __len__(self) -> int:
        return len(self.start)

    def token_word(self) -> np.ndarray:
        """(B*L,) index of the word holding each token, -1 for special and pad tokens."""
        out = np.full(self.n_tokens, -1, dtype=np.int64)
        out[ragged_arange(self.start, self.length)] = np.repeat(np.arange(len(self.start)), self.length)
        return out

    def end(self, word: np.ndarray) -> np.ndarray:
        """Flat position one past the last token of ``word``."""
        return self.start[word] + self.length[word]


class TokenSampler:
    """Random replacement tokens that are never special ([CLS], [SEP], [PAD], [MASK], [UNK], ...)."""

    def __init__(self, vocab: Vocabulary, source: str):
        normal = np.ones(vocab.size, dtype=bool)
        normal[[i for i in vocab.special_ids if i < vocab.size]] = False
        self.source = source
        if source == "uniform":
            self.ids = np.flatnonzero(normal)
            if len(self.ids) == 0:
                raise ValueError("the vocabulary has no normal (non-special) tokens to sample")
        elif source == "unigram":
            if vocab.token_counts is None:
                raise ValueError("unigram random replacement needs the corpus token counts")
            counts = np.where(normal, np.asarray(vocab.token_counts, dtype=np.int64)[: vocab.size], 0)
            self.cumulative = np.cumsum(counts)
            if self.cumulative[-1] == 0:
                raise ValueError("the corpus has no normal tokens: unigram replacement is impossible")
        else:
            raise ValueError(f"unknown random_source {source!r}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.source == "uniform":
            return self.ids[rng.integers(0, len(self.ids), size=n)]
        # Inverse-CDF over integer counts: exact, and zero-count ids (specials) are never hit.
        return np.searchsorted(self.cumulative, rng.integers(0, self.cumulative[-1], size=n), side="right")


class TokenMasker:
    """State every token-corrupting masker has: its config, the vocabulary and a replacement sampler."""

    def __init__(self, config, vocab: Vocabulary):
        self.config = config
        self.vocab = vocab
        self.sampler = TokenSampler(vocab, config.random_source)

    @classmethod
    def from_corpus(cls, config, corpus):
        return cls(config, Vocabulary.from_corpus(corpus))

    @classmethod
    def for_collator(cls, config, vocabulary: Vocabulary, **options):
        """The masker over tokenizer features (``spanlm.collators``): the vocabulary is all it needs."""
        return cls(config, vocabulary)


def corrupt(
    input_ids: np.ndarray,
    positions: np.ndarray,
    unit: np.ndarray,
    proportions: Proportions,
    sampler: TokenSampler,
    mask_id: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One [MASK] / random / keep draw per *unit* over the flat target ``positions`` of ``input_ids`` (B, L).

    ``unit`` (non-decreasing, 0-based) groups the targets: a word, a span, or each token alone. Returns
    the corrupted copy (B, L), the original ids at ``positions`` (the labels) and the per-position
    kinds. (Similar-word replacement needs a neighbour table: the n-gram masker does its own
    corruption, and the other schemes' configs reject a similar share.)
    """
    corrupted = input_ids.copy()
    flat = corrupted.reshape(-1)  # a view: the writes below land in `corrupted`
    labels = flat[positions].copy()
    n_units = int(unit[-1]) + 1 if len(unit) else 0
    kind = proportions.draw(rng, n_units)[unit]
    flat[positions[kind == MASK]] = mask_id
    random_positions = positions[kind == RANDOM]
    flat[random_positions] = sampler.sample(rng, len(random_positions))
    return corrupted, labels, kind


def whole_word_targets(words: Words, chosen: np.ndarray, per_word: bool) -> tuple[np.ndarray, np.ndarray]:
    """Flat token positions of the ``chosen`` words (ascending) and their corruption unit ids."""
    positions = ragged_arange(words.start[chosen], words.length[chosen])
    unit = np.repeat(np.arange(len(chosen)), words.length[chosen]) if per_word else np.arange(len(positions))
    return positions, unit
