"""MacBERT N-gram masking with "MLM as correction" (Cui et al. 2020, §3.3).

Selection: 15% of a block's *words*, as n-grams of whole words with n = 1/2/3/4 drawn with
probabilities 0.4/0.3/0.2/0.1, laid out left to right without overlap. Concretely, per block:

1. draw i.i.d. n-gram lengths until their sum reaches the budget ``round(0.15 × words)``; the n-gram
   that would overshoot is kept with probability (remaining budget) / n, so the expected number of
   masked words is exactly the budget. That last keep-or-drop favours short n-grams, as any scheme
   that holds a budget does (the authors' "sample n, take it if it fits" walk drops long ones): the
   masked n-grams follow the 0.4/0.3/0.2/0.1 mix closely in long rows (4-grams 0.095 of them at 100
   words, ≈ 0.1 from a few hundred) and less so in short ones (0.067 at 20 words, 0.089 in 128-token
   blocks), and a short row may get one n-gram more or less than its budget, or none;
2. walk left to right placing the n-grams in order, each one jumping past the previous, with the
   free words spread uniformly among the gaps (every arrangement equally likely) — the left-to-right
   walk with exactly the start probabilities that place all of them.

Replacement, per word ("If an N-gram is selected to mask, we will find similar words individually"):
80% a similar word from the table ``spanlm prepare`` built, 10% random tokens, 10% kept. A word with
no same-length neighbour in the table gets random tokens instead — the paper's "in rare cases, when
there is no similar word, we will degrade to use random word replacement" — and is counted in
``counters["similar_fallback"]``. The model predicts the original tokens everywhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spanlm.data.similar_words import SimilarWords, word_hash
from spanlm.errors import ConfigError
from spanlm.masking.base import MASK, RANDOM, SIMILAR, MaskedBatch, NgramConfig, Vocabulary
from spanlm.masking.ops import TokenSampler, Words, ragged_arange, round_budget


def draw_ngrams(
    budget: np.ndarray, n_words: np.ndarray, probs: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """n-gram lengths per row: ``(lengths (B, M), count (B,))`` — the first ``count[b]`` are used.

    Their total is the row's budget, or one n-gram more with probability remaining / n (never more
    than the row's words).
    """
    batch_size = len(budget)
    columns = int(budget.max(initial=0)) + 1  # enough even if every draw is a unigram
    cdf = np.cumsum(probs)[:-1]
    lengths = 1 + np.searchsorted(cdf, rng.random((batch_size, columns)), side="right")  # (B, M)
    lengths = np.minimum(lengths, np.maximum(n_words, 1)[:, None])
    total = np.cumsum(lengths, axis=1)  # (B, M)
    count = (total <= budget[:, None]).sum(axis=1)  # (B,) n-grams that fit entirely
    used = np.where(count > 0, total[np.arange(batch_size), np.maximum(count - 1, 0)], 0)
    following = lengths[np.arange(batch_size), np.minimum(count, columns - 1)]
    remaining = budget - used
    overshoot = (remaining > 0) & (rng.random(batch_size) * following < remaining) & (used + following <= n_words)
    return lengths, count + overshoot


def place_ngrams(
    lengths: np.ndarray, count: np.ndarray, n_words: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Uniform non-overlapping left-to-right placement: ``(row, first word in row, length)`` per n-gram.

    With m n-grams covering T of W words there are W - T free words; an arrangement is a choice of m
    of the W - T + m slots for the n-grams (the others are free words), drawn uniformly as the m
    smallest of i.i.d. keys. The i-th chosen slot c_i puts n-gram i at word c_i - i + (words of the
    n-grams before it).
    """
    batch_size = len(count)
    column = np.arange(lengths.shape[1])
    used = np.where(column[None, :] < count[:, None], lengths, 0)  # (B, M)
    slots = n_words - used.sum(axis=1) + count  # (B,)
    width = int(slots.max(initial=0))
    keys = rng.random((batch_size, width))
    keys[np.arange(width)[None, :] >= slots[:, None]] = 2.0
    kth = np.sort(keys, axis=1)[np.arange(batch_size), np.maximum(count - 1, 0)] if width else np.zeros(batch_size)
    chosen = (keys <= kth[:, None]) & (count > 0)[:, None]  # (B, width): exactly count[b] per row
    row, slot = np.nonzero(chosen)  # slots ascending within a row: the n-grams in order
    i = np.arange(len(row)) - (np.cumsum(count) - count)[row]  # rank of the n-gram in its row
    before = (np.cumsum(used, axis=1) - used)[row, i]  # words in earlier n-grams of the row
    return row, slot - i + before, lengths[row, i]


class NgramMasker:
    def __init__(self, config: NgramConfig, vocab: Vocabulary, similar: SimilarWords):
        self.config = config
        self.vocab = vocab
        self.similar = similar
        self.sampler = TokenSampler(vocab, config.random_source)
        self.probs = np.asarray(config.ngram_probs, dtype=np.float64)

    @classmethod
    def from_corpus(cls, config: NgramConfig, corpus) -> NgramMasker:
        similar = (
            SimilarWords.load(corpus.directory) if config.proportions.similar > 0 else SimilarWords([], [], [0], [], [])
        )
        return cls(config, Vocabulary.from_corpus(corpus), similar)

    @classmethod
    def for_collator(cls, config: NgramConfig, vocabulary: Vocabulary, similar_words=None, **options) -> NgramMasker:
        """The masker over tokenizer features; ``similar_words``: a ``spanlm prepare`` directory made with
        ``data.similar_words`` set, or a loaded :class:`~spanlm.data.similar_words.SimilarWords`."""
        if isinstance(similar_words, (str, Path)):
            similar_words = SimilarWords.load(similar_words)
        if similar_words is None:
            if config.proportions.similar > 0:
                raise ConfigError(
                    "MacBERT (scheme 'ngram') replaces words by similar words: pass similar_words= a "
                    "`spanlm prepare` directory made with data.similar_words set, or set "
                    "masking.ngram.proportions.similar to 0"
                )
            similar_words = SimilarWords([], [], [0], [], [])
        return cls(config, vocabulary, similar_words)

    @staticmethod
    def statistics(pairs: list, counters) -> dict:
        """``spanlm preview``'s lines for MacBERT: the n-gram mix, the share of words masked, similar-word fallbacks."""
        grams = np.concatenate([m.span_words for _, m in pairs])
        mix = np.bincount(grams)[1:] / len(grams) if len(grams) else []
        return {
            "ngram_mix": {str(n + 1): round(float(p), 4) for n, p in enumerate(mix)},
            "word_mask_ratio": round(counters["masked_words"] / max(counters["words"], 1), 5),
            "similar_fallback_rate": round(counters["similar_fallback"] / max(counters["similar_drawn"], 1), 4),
        }

    def __call__(self, batch, rng: np.random.Generator) -> MaskedBatch:
        words = Words.of(batch.word_starts, batch.special_mask)
        budget = round_budget(self.config.rate, words.row_count)  # (B,) words to mask
        lengths, count = draw_ngrams(budget, words.row_count, self.probs, rng)
        row, first, n = place_ngrams(lengths, count, words.row_count, rng)
        gram_word = words.row_first[row] + first  # (G,) global index of each n-gram's first word
        chosen = ragged_arange(gram_word, n)  # (C,) masked words, ascending
        chosen_length = words.length[chosen]

        # --- per-word replacement: similar (80%) / random (10%) / kept (10%).
        kind = self.config.proportions.draw(rng, len(chosen))  # (C,)
        positions = ragged_arange(words.start[chosen], chosen_length)  # (T,) ascending
        position_word = np.repeat(np.arange(len(chosen)), chosen_length)  # (T,) index into `chosen`
        input_ids = batch.input_ids.copy()
        flat = input_ids.reshape(-1)  # view: writes go to input_ids
        labels = flat[positions].copy()

        wants_similar = np.flatnonzero(kind == SIMILAR)
        entry = np.full(len(chosen), -1)
        if len(wants_similar):
            word_tokens = labels[np.isin(position_word, wants_similar)]  # their ids, word after word
            word_length = chosen_length[wants_similar]
            hashes = word_hash(word_tokens, np.cumsum(word_length) - word_length, word_length)
            table_row = self.similar.lookup(hashes, word_length)
            found = table_row >= 0
            entry[wants_similar[found]] = self.similar.pick(table_row[found], rng)
            kind[wants_similar[~found]] = RANDOM  # no similar word: degrade to a random replacement
        token_kind = kind[position_word]
        flat[positions[token_kind == MASK]] = self.vocab.mask_id
        random_positions = positions[token_kind == RANDOM]
        flat[random_positions] = self.sampler.sample(rng, len(random_positions))
        similar_token = np.flatnonzero(token_kind == SIMILAR)
        # The i-th token of a word takes the i-th id of its neighbour (same token count by construction).
        inside = similar_token - (np.cumsum(chosen_length) - chosen_length)[position_word[similar_token]]
        flat[positions[similar_token]] = self.similar.tokens[
            self.similar.token_offsets[entry[position_word[similar_token]]] + inside
        ]

        return MaskedBatch(
            input_ids=input_ids,
            attention_mask=batch.attention_mask.copy(),
            target_index=positions,
            target_labels=labels,
            target_kind=token_kind,
            span_start=words.start[gram_word],
            span_end=words.end(gram_word + n - 1),
            span_words=n,
            counters={
                "similar_drawn": len(wants_similar),
                "similar_fallback": int(len(wants_similar) - (entry >= 0).sum()),
                "masked_words": len(chosen),
                "words": len(words),
            },
        )
