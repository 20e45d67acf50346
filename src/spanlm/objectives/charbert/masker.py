"""CharBERT noisy LM (NLM) and its whole-word MLM (Ma et al. 2020, §3.3).

Per word, with probability 0.10: a word of fewer than 4 characters gets a random character inserted;
a longer word loses one character or has two adjacent characters swapped (50/50, index in
[1, len-2]). The noised word is re-tokenised and every one of its tokens is an NLM target: the
original lower-cased word's id in a term vocabulary of the ~30k most frequent words. The MLM part masks
whole words at rate 0.10 (80/10/10) and never picks a noised word.

**Dynamic noise, from pre-tokenised variants.** The authors noise the raw text as it is read, so every
pass over the data sees fresh noise; static noise written at preparation time would show the model the
same misspellings every epoch and cost a second copy of the corpus. Re-tokenising strings per batch
would be far too slow for a DataLoader worker, but the set of possible noised forms of a word is small
and known in advance: len-2 deletions, len-2 swaps, and (position × character) insertions for short
words. So :class:`NoiseTables` enumerates *every* variant of every term-vocabulary word once, before the
first batch is noised (:meth:`NoiseMasker.prepare`, which pretraining calls before its DataLoader workers
fork; building a CharBERT only to export or fine-tune it never pays for it), tokenizes them in one batch,
and the masker then draws the operation, index and character per occurrence exactly as the paper does and
looks the variant's ids up — paper-exact and fully vectorised. Words outside the term vocabulary (rare ones,
and words holding [UNK]) are not noised: their NLM target would be "unknown", which teaches nothing.

Details the paper leaves open follow the authors' ``create_adv_word``: insertion before an index in
[0, len-1], characters from a fixed alphabet (theirs: the first 81 entries of the character vocabulary;
here the ``insert_chars`` most frequent letters and digits of the term vocabulary); a noising that
leaves the tokens unchanged (swapping two equal letters) does not count as noised. Neither does one
the tokenizer can only spell with [UNK] (it would hide every character from CharBERT's char channel);
both are counted in ``counters["noise_unusable"]``. Noised words change
a block's length: blocks keep their width, and a block that grows loses its last words (counted in
``counters["noise_dropped_words"]``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections import Counter

import numpy as np

from spanlm.data.similar_words import count_word_types, decode_types, word_hash
from spanlm.data.tokenizer import encode_text
from spanlm.masking.base import FLAT, KEEP, MaskedBatch, NoiseConfig, Vocabulary
from spanlm.masking.ops import TokenSampler, Words, ragged_arange, round_budget, units
from spanlm.masking.wwm import mask_words, select_words

INSERT, DELETE, SWAP = 0, 1, 2


def noise_variants(word: str, alphabet: str, short_word: int) -> list[str]:
    """Every noised form of ``word``, in the order the masker indexes them.

    Short words: insertion of ``alphabet[c]`` before index p at ``p * len(alphabet) + c``, p in
    [0, len-1]. Longer words: deletion of index i at ``i - 1``, then swap of (i, i+1) at
    ``len - 2 + i - 1``, i in [1, len-2].
    """
    n = len(word)
    if n < short_word:
        return [word[:p] + c + word[p:] for p in range(n) for c in alphabet]
    deletions = [word[:i] + word[i + 1 :] for i in range(1, n - 1)]
    swaps = [word[:i] + word[i + 1] + word[i] + word[i + 2 :] for i in range(1, n - 1)]
    return deletions + swaps


@dataclasses.dataclass
class NoiseVariants:
    """Every noised form of every type of the tables, tokenized: type t's variants start at ``first[t]``."""

    first: np.ndarray  # (T,) int64 index of the type's first variant
    offsets: np.ndarray  # (V+1,) int64 variant v's ids are tokens[offsets[v]:offsets[v+1]]
    tokens: np.ndarray  # (X,) int64
    usable: np.ndarray  # (V,) bool: tokenizes differently from the word and without [UNK]


@dataclasses.dataclass
class NoiseTables:
    """Term vocabulary and every noised variant of its words, keyed by word hash (token ids).

    The variants (:attr:`variants`) are tokenized when first read: the term vocabulary alone (the NLM head's
    size and labels) is what a model built to be exported or fine-tuned needs."""

    hashes: np.ndarray  # (T,) int64 word_hash, sorted: word types of the term vocabulary
    lengths: np.ndarray  # (T,) int64 tokens per type
    term: np.ndarray  # (T,) int64 term id of each type
    chars: np.ndarray  # (T,) int64 characters of the word
    terms: list[str]  # term id -> lower-cased word
    alphabet: str  # characters that insertion draws from
    words: list[tuple[str, str]]  # (T,) each type's (prefix, word): what its variants are made from
    short_word: int  # words shorter than this get insertions, longer ones deletions and swaps
    tokenizer: object  # the corpus's tokenizers.Tokenizer, for the variants
    special_ids: list[int]

    @classmethod
    def build(cls, corpus, config: NoiseConfig) -> NoiseTables:
        tokenizer = corpus.tokenizer
        types = count_word_types(corpus.ids, corpus.word_starts, corpus.sentence_offsets)
        keys, prefixes, valid = decode_types(tokenizer, corpus.ids, types, corpus.meta["all_special_ids"])

        # Term vocabulary: the most frequent lower-cased words (ties broken alphabetically, so the
        # ids do not depend on hash order).
        term_counts: Counter[str] = Counter()
        for key, count, ok in zip(keys, types.counts.tolist(), valid.tolist()):
            if ok:
                term_counts[key.lower()] += count
        terms = sorted(term_counts, key=lambda t: (-term_counts[t], t))[: config.term_vocab_size]
        term_id = {t: i for i, t in enumerate(terms)}
        members = [i for i in range(len(types)) if valid[i] and keys[i].lower() in term_id]

        # Insertion alphabet: the most frequent letters and digits of the term words.
        letters: Counter[str] = Counter()
        for t in terms:
            for ch in t:
                if ch.isalnum():
                    letters[ch] += term_counts[t]
        alphabet = "".join(sorted(letters, key=lambda ch: (-letters[ch], ch))[: config.insert_chars])
        if not alphabet:
            raise ValueError("the corpus has no letters or digits to build the noise alphabet from")

        members_array = np.asarray(members, dtype=np.int64)
        return cls(
            hashes=types.hashes[members_array],
            lengths=types.lengths[members_array],
            term=np.array([term_id[keys[i].lower()] for i in members], dtype=np.int64),
            chars=np.array([len(keys[i]) for i in members], dtype=np.int64),
            terms=terms,
            alphabet=alphabet,
            words=[(prefixes[i], keys[i]) for i in members],
            short_word=config.short_word,
            tokenizer=tokenizer,
            special_ids=list(corpus.meta["all_special_ids"]),
        )

    @functools.cached_property
    def variants(self) -> NoiseVariants:
        """Every variant of every type, tokenized in one batch (built once, on first use)."""
        texts, first = [], []
        for prefix, word in self.words:  # one step per word type, once
            first.append(len(texts))
            texts.extend(prefix + v for v in noise_variants(word, self.alphabet, self.short_word))
        encodings = encode_text(self.tokenizer, texts)
        counts = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        tokens = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int64, count=int(counts.sum()))
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        owner = np.repeat(np.arange(len(first), dtype=np.int64), np.diff(np.append(first, len(texts))).astype(np.int64))
        hashes = np.zeros(len(texts), dtype=np.int64)
        nonempty = counts > 0
        hashes[nonempty] = word_hash(tokens, offsets[:-1][nonempty], counts[nonempty])
        changed = nonempty & ((hashes != self.hashes[owner]) | (counts != self.lengths[owner]))
        # A variant the tokenizer can only spell with [UNK] (WordPiece maps a word it cannot piece
        # together to [UNK]) would hide every character from the char channel: not usable as noise.
        special = np.isin(tokens, self.special_ids)
        has_special = np.bincount(np.repeat(np.arange(len(texts)), counts), weights=special, minlength=len(texts)) > 0
        return NoiseVariants(
            first=np.asarray(first, dtype=np.int64), offsets=offsets, tokens=tokens, usable=changed & ~has_special
        )

    def lookup(self, hashes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Row of every word in the tables, -1 for words outside the term vocabulary."""
        if len(self.hashes) == 0:
            return np.full(len(hashes), -1, dtype=np.int64)
        row = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
        return np.where((self.hashes[row] == hashes) & (self.lengths[row] == lengths), row, -1)


class NoiseMasker:
    def __init__(self, config: NoiseConfig, vocab: Vocabulary, tables: NoiseTables, pad_id: int):
        self.config = config
        self.vocab = vocab
        self.tables = tables
        self.pad_id = pad_id
        self.sampler = TokenSampler(vocab, config.mlm.random_source)

    @classmethod
    def from_corpus(cls, config: NoiseConfig, corpus) -> NoiseMasker:
        return cls(
            config, Vocabulary.from_corpus(corpus), NoiseTables.build(corpus, config), int(corpus.special_ids["pad"])
        )

    @property
    def terms(self) -> list[str]:
        """The NLM label names (term id -> word)."""
        return self.tables.terms

    def prepare(self) -> None:
        """Tokenize every noised variant now (the costly part of the tables), so that DataLoader workers forked
        after this share them instead of each building its own."""
        _ = self.tables.variants

    def with_rate(self, rate: float) -> NoiseMasker:
        """A copy whose whole-word MLM masks at ``rate`` (the noise probability is not a masking budget)."""
        scheduled = copy.copy(self)
        scheduled.config = dataclasses.replace(self.config, mlm=dataclasses.replace(self.config.mlm, rate=rate))
        return scheduled

    @staticmethod
    def statistics(pairs: list, counters: Counter) -> dict:
        """``spanlm preview``'s lines for noise: the share of noised words, the operations, the NLM targets."""
        blocks = sum(m.batch_size for _, m in pairs)
        noised = counters["noised_words"]
        return {
            "noised_word_ratio": round(noised / max(counters["words"], 1), 5),
            "noise_operations": {
                op: round(counters[f"noise_{op}"] / max(noised, 1), 4) for op in ("insert", "delete", "swap")
            },
            "nlm_targets_per_block": round(sum(len(m.nlm_index) for _, m in pairs) / max(blocks, 1), 3),
        }

    legend = "~y~{x} noised word, NLM target x"  # what mark shows, in spanlm preview's legend

    @staticmethod
    def mark(shown: list[str], masked: MaskedBatch, row: int, low: int, length: int, terms) -> None:
        """Mark the noised tokens of row ``row`` in ``shown`` (``~y~{x}``: noised word y, NLM target x)."""
        noised = (masked.nlm_index >= low) & (masked.nlm_index < low + length)
        columns = (masked.nlm_index[noised] - low).tolist()
        labels = masked.nlm_labels[noised].tolist()
        for i, (column, label) in enumerate(zip(columns, labels)):
            # A noised word ends where the next noised token is not adjacent or has another label (two
            # equal adjacent noised words would show as one; the display is all this is used for).
            ends_word = i + 1 == len(columns) or columns[i + 1] != column + 1 or labels[i + 1] != label
            term = terms[label] if terms is not None else str(label)
            shown[column] = f"~{shown[column]}~" + (f"{{{term}}}" if ends_word else "")

    def __call__(self, batch, rng: np.random.Generator) -> MaskedBatch:
        flat_ids = batch.input_ids.reshape(-1)
        unit_start, unit_length = units(batch.word_starts, batch.special_mask)
        words = Words.from_units(unit_start, unit_length, batch.special_mask)

        # --- which words are noised, and how: a coin per word, then one operation, index and character
        # per noised word, as drawn by the authors' create_adv_word. Only words that drew noise are
        # looked up in the term vocabulary (the coin does not depend on it), which keeps this cheap.
        drawn = np.flatnonzero(rng.random(len(words)) < self.config.word_prob)
        table_row = self._table_rows(flat_ids, words, drawn)
        target, row = drawn[table_row >= 0], table_row[table_row >= 0]  # (Z,) word, (Z,) table row
        n_chars = self.tables.chars[row]
        short = n_chars < self.config.short_word
        insert_at = (rng.random(len(target)) * n_chars).astype(np.int64)  # [0, len-1]
        insert_char = rng.integers(0, len(self.tables.alphabet), size=len(target))
        delete = rng.random(len(target)) < self.config.delete_prob
        index = 1 + (rng.random(len(target)) * np.maximum(n_chars - 2, 1)).astype(np.int64)  # [1, len-2]
        offset = np.where(
            short, insert_at * len(self.tables.alphabet) + insert_char, np.where(delete, 0, n_chars - 2) + index - 1
        )
        variant = self.tables.variants.first[row] + offset
        operation = np.where(short, INSERT, np.where(delete, DELETE, SWAP))
        # Swapping the two l's of "hello" is no noise, and a variant spelt with [UNK] is no use.
        usable = self.tables.variants.usable[variant]
        target, row, variant, operation = target[usable], row[usable], variant[usable], operation[usable]

        layout = self._splice(batch, unit_start, unit_length, target, variant)
        noisy, noisy_words = _Layout(layout["input_ids"], layout["attention_mask"]), layout["words"]

        # --- NLM targets: every token of every noised word that still fits in its block.
        new_index = layout["new_word"][target]  # (Z,) index among the noisy batch's words, -1 if dropped
        survived = new_index >= 0
        new_index = new_index[survived]
        nlm_index = ragged_arange(noisy_words.start[new_index], noisy_words.length[new_index])
        nlm_labels = np.repeat(self.tables.term[row[survived]], noisy_words.length[new_index])

        # --- MLM: whole words at rate 0.10 over the noisy block, never a noised word.
        eligible = np.ones(len(noisy_words), dtype=bool)
        eligible[new_index] = False
        budget = round_budget(
            self.config.mlm.rate, np.maximum(noisy.attention_mask.sum(axis=1) - 2, 0)
        )  # no [CLS]/[SEP]
        chosen = select_words(noisy_words, budget, rng, eligible)
        masked = mask_words(noisy, noisy_words, chosen, self.config.mlm, self.sampler, self.vocab.mask_id, rng)
        # CharBERT noisy LM: every token of a noised word, labelled with the original word's term id.
        masked.add(FLAT, nlm_index=nlm_index).add(KEEP, nlm_labels=nlm_labels)
        op_counts = np.bincount(operation[survived], minlength=3)
        masked.counters = {
            "words": len(words),
            "noised_words": int(survived.sum()),
            "noise_insert": int(op_counts[INSERT]),
            "noise_delete": int(op_counts[DELETE]),
            "noise_swap": int(op_counts[SWAP]),
            "noise_out_of_vocabulary": int((table_row < 0).sum()),
            "noise_unusable": int((~usable).sum()),
            "noise_dropped_words": layout["dropped_words"],
        }
        return masked

    def _table_rows(self, flat_ids: np.ndarray, words: Words, which: np.ndarray) -> np.ndarray:
        """Table row of the words ``which`` (-1: not in the term vocabulary)."""
        length = words.length[which]
        tokens = flat_ids[ragged_arange(words.start[which], length)]  # their ids, word after word
        return self.tables.lookup(word_hash(tokens, np.cumsum(length) - length, length), length)

    def _splice(
        self, batch, unit_start: np.ndarray, unit_length: np.ndarray, target: np.ndarray, variant: np.ndarray
    ) -> dict:
        """Rebuild the batch with the noised words' variant ids in place of their own.

        Every row is its units in order — [CLS], the words, [SEP] — each copied from the original ids
        or from a variant, at the running offset within the row. Rows may grow up to ``max_len``
        tokens; a row that would outgrow it drops its last words (the [SEP] always stays).
        """
        batch_size, width = batch.input_ids.shape
        special = batch.special_mask.reshape(-1)
        # Real units in flat order: [CLS], the words, [SEP] of every row. Their words are those of
        # Words.from_units on the same units, so the j-th word unit is word j.
        real = batch.attention_mask.reshape(-1)[unit_start]
        unit_start, unit_length = unit_start[real], unit_length[real]
        is_word = ~special[unit_start]
        unit_row = unit_start // width
        row_change = unit_row[1:] != unit_row[:-1]
        is_first, is_last = np.append(True, row_change), np.append(row_change, True)  # [CLS], [SEP]
        first_unit = np.flatnonzero(is_first)  # (B,) every row has its [CLS]
        noised_unit = np.flatnonzero(is_word)[target]
        is_noised = np.zeros(len(unit_start), dtype=bool)
        is_noised[noised_unit] = True
        new_length = unit_length.copy()
        new_length[noised_unit] = self.tables.variants.offsets[variant + 1] - self.tables.variants.offsets[variant]

        # Offsets within each row; every unit but [SEP] must end by out_width - 1, and since offsets
        # grow along the row the units that fit are a prefix of it.
        offset = np.cumsum(new_length) - new_length
        offset -= np.repeat(offset[first_unit], np.diff(np.append(first_unit, len(offset))))
        end = offset + new_length
        out_width = int(min(self.config.max_len, end[is_last].max(initial=2)))
        fits = end <= out_width - 1
        last_fit = first_unit + np.add.reduceat(fits & ~is_last, first_unit) - 1  # (B,) the [CLS] always fits
        sep_offset = end[last_fit]
        fits[is_last] = True
        offset[is_last] = sep_offset
        destination = unit_row * out_width + offset  # (units,) flat position in the new batch

        # Copy the kept original units token by token (each token moves by its unit's shift), then
        # paste the variants' ids.
        input_ids = np.full(batch_size * out_width, self.pad_id, dtype=np.int64)
        copy = np.repeat(fits & ~is_noised, unit_length)  # (real tokens,)
        source = np.flatnonzero(batch.attention_mask.reshape(-1))[copy]
        input_ids[source + np.repeat(destination - unit_start, unit_length)[copy]] = batch.input_ids.reshape(-1)[source]
        paste = fits[noised_unit]
        pasted = noised_unit[paste]
        input_ids[ragged_arange(destination[pasted], new_length[pasted])] = self.tables.variants.tokens[
            ragged_arange(self.tables.variants.offsets[variant[paste]], new_length[pasted])
        ]

        row_length = np.zeros(batch_size, dtype=np.int64)
        row_length[unit_row[first_unit]] = sep_offset + 1
        attention = np.arange(out_width)[None, :] < row_length[:, None]  # (B, L')

        # The noisy batch's words are the kept word units where they landed; new_word maps every
        # original word to its index among them (-1 when dropped at the block end).
        kept = fits & is_word
        kept_words = fits[is_word]
        row = unit_row[kept]
        words = Words(
            start=destination[kept],
            length=new_length[kept],
            row=row,
            row_first=np.searchsorted(row, np.arange(batch_size)),
            row_count=np.bincount(row, minlength=batch_size),
            n_tokens=batch_size * out_width,
        )
        return {
            "input_ids": input_ids.reshape(batch_size, out_width),
            "attention_mask": attention,
            "words": words,
            "new_word": np.where(kept_words, np.cumsum(kept_words) - 1, -1),
            "dropped_words": int((~kept_words).sum()),
        }


@dataclasses.dataclass
class _Layout:
    """The noisy batch, as much of a BlockBatch as the whole-word step reads."""

    input_ids: np.ndarray  # (B, L')
    attention_mask: np.ndarray  # (B, L')
