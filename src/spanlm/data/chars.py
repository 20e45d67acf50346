"""CharBERT's character inputs: the character vocabulary, every token's spelling, the per-row char stream.

CharBERT (Ma et al. 2020, §3.1; REFERENCE.md §7) reads each sequence a second time as characters: the
characters of all its tokens in order, sub-word markers stripped, tokens separated by the pad
character, run through one BiGRU; a token's char vector is the GRU output at its first and at its last
character. Special tokens and MLM targets are spelt as a single pad character, so the char channel
never shows the characters of a token the MLM head must predict.

**Spellings come from the token ids.** CharBERT's noise re-tokenises misspelt words
(:mod:`spanlm.masking.noise`), so during pretraining the characters the model must read are those of
the *noisy* tokens, which exist only as ids. Every id therefore has one spelling — its vocabulary piece
with the tokenizer's sub-word marker removed: WordPiece ``##`` (the model's continuing-subword prefix),
byte-level BPE ``Ġ`` (the ByteLevel decoder turns the piece back into text), SentencePiece ``▁``
(Metaspace). The stream is then one table lookup per batch, fully vectorised, and fine-tuning spells
tokens exactly as pretraining did (an uncased tokenizer's lower-cased pieces included). A byte-level
piece that is only part of a UTF-8 character has no spelling of its own and reads as the unk
character. The one id without a spelling is [UNK]: at fine-tuning time, where the text and the
tokenizer's character offsets are at hand, :class:`CharFeaturizer` spells an [UNK] token from its
surface form in the text — the case CharBERT's character channel exists for.

**The character vocabulary** is built from the corpus: the characters of every token weighted by the
token's corpus frequency (``token_counts.npy`` of the prepared shards, so no second pass over the text),
the most frequent ``size - 2`` of them, plus pad (id 0) and unk (the last id) — the authors' layout
(``bert_char_vocab``: 1001 entries, 0 = pad).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import numpy as np

from spanlm.errors import InputError
from spanlm.masking.ops import ragged_arange

PAD_CHAR = 0
CHARS_FILE = "chars.json"
# Byte-level pieces that end inside a multi-byte UTF-8 character decode to U+FFFD.
_REPLACEMENT = "\ufffd"


def token_surfaces(tokenizer) -> list[str | None]:
    """Every id's spelling: its piece without the sub-word marker; "" for special tokens, None when unknown.

    None marks a piece that is not text on its own (a byte-level fragment of a UTF-8 character).
    """
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    model = backend["model"]
    prefix = model.get("continuing_subword_prefix") or ""
    suffix = model.get("end_of_word_suffix") or ""
    decoder_kind = (backend.get("decoder") or {}).get("type")
    # Byte-level and Metaspace pieces are not text as they stand (Ġ = a space byte, bytes as symbols,
    # ▁ = a space): the tokenizer's own decoder turns one piece back into its text.
    decoder = tokenizer.backend_tokenizer.decoder if decoder_kind in ("ByteLevel", "Metaspace") else None
    special = set(tokenizer.all_special_ids)
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    surfaces: list[str | None] = []
    for index, piece in enumerate(pieces):  # once per vocabulary entry, when the objective is built
        if index in special or piece is None:
            surfaces.append("")
            continue
        if prefix and piece.startswith(prefix) and len(piece) > len(prefix):
            piece = piece[len(prefix):]
        if suffix and piece.endswith(suffix) and len(piece) > len(suffix):
            piece = piece[: -len(suffix)]
        if decoder is not None:
            piece = decoder.decode([piece])
            if _REPLACEMENT in piece:
                surfaces.append(None)
                continue
        surfaces.append(piece.strip())
    return surfaces


@dataclasses.dataclass
class CharVocab:
    """Characters → ids: 0 = pad, 1..n = ``chars`` (most frequent first), n + 1 = unk."""

    chars: list[str]

    @property
    def size(self) -> int:
        return len(self.chars) + 2

    @property
    def unk_id(self) -> int:
        return len(self.chars) + 1

    @classmethod
    def build(cls, surfaces: list[str | None], counts: np.ndarray, size: int) -> CharVocab:
        """The ``size - 2`` most frequent characters of ``surfaces`` weighted by ``counts`` (ties by character)."""
        if size < 3:
            raise ValueError("the character vocabulary needs room for pad, unk and one character")
        frequency: Counter[str] = Counter()
        for surface, count in zip(surfaces, np.asarray(counts).tolist()):
            if surface and count:
                for char in surface:
                    frequency[char] += count
        ranked = sorted(frequency, key=lambda char: (-frequency[char], char))
        return cls(chars=ranked[: size - 2])

    def lookup(self) -> dict[str, int]:
        return {char: index + 1 for index, char in enumerate(self.chars)}

    def encode(self, text: str) -> list[int]:
        table = self.lookup()
        return [table.get(char, self.unk_id) for char in text]

    def save(self, directory: Path) -> None:
        (Path(directory) / CHARS_FILE).write_text(json.dumps({"chars": self.chars}, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> CharVocab:
        path = Path(directory) / CHARS_FILE
        try:
            chars = json.loads(path.read_text(encoding="utf-8"))["chars"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InputError(f"{path}: not a CharBERT character vocabulary ({error})") from None
        if not isinstance(chars, list) or not all(isinstance(c, str) and len(c) == 1 for c in chars):
            raise InputError(f"{path}: 'chars' must be a list of single characters")
        return cls(chars=chars)


@dataclasses.dataclass
class Spelling:
    """Every token id's character ids, flat: id ``t`` is ``chars[offsets[t]:offsets[t + 1]]``.

    Special tokens have an empty spelling; the stream gives them (and every blank token) one pad char.
    """

    offsets: np.ndarray  # (V+1,) int64
    chars: np.ndarray  # (S,) int64 character ids

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab: CharVocab) -> Spelling:
        table = vocab.lookup()
        encoded = [[vocab.unk_id] if surface is None else [table.get(c, vocab.unk_id) for c in surface]
                   for surface in token_surfaces(tokenizer)]
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        chars = np.fromiter((c for e in encoded for c in e), dtype=np.int64, count=int(lengths.sum()))
        return cls(offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), chars=chars)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def build_char_vocab(corpus, size: int) -> CharVocab:
    """The character vocabulary of a prepared corpus: token spellings weighted by corpus frequency."""
    tokenizer = corpus.tokenizer
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    shared = min(len(tokenizer), len(corpus.token_counts))
    counts[:shared] = np.asarray(corpus.token_counts[:shared])
    return CharVocab.build(token_surfaces(tokenizer), counts, size)


def char_stream(input_ids: np.ndarray, blank: np.ndarray, spelling: Spelling, pad_id: int,
                override: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The char inputs of a batch: each row's tokens spelt one after another, a pad char after each.

    ``input_ids`` (B, L); ``blank`` (B, L) bool: tokens spelt as a single pad char (MLM targets);
    special tokens (empty spelling) get one pad char too, and padding (``pad_id``) no characters at all.
    ``override``: (flat positions, their char counts, their chars concatenated) replacing the spelling
    of those tokens (the featurizer's [UNK] tokens).

    Returns ``char_ids`` (B, C) int64 (0 = pad), ``char_lengths`` (B,) int64 (characters per row, the
    last separator included), and ``char_first`` / ``char_last`` (B, L) int64: where each token's
    characters begin and end in its row (0 for padding).
    """
    batch_size, width = input_ids.shape
    flat_ids = input_ids.reshape(-1).astype(np.int64)
    padding = flat_ids == pad_id
    spelled = ~blank.reshape(-1) & ~padding
    source_start = spelling.offsets[flat_ids]  # (B·L,) where each token's chars are in the table
    length = np.where(spelled, spelling.lengths[flat_ids], 0)
    source_chars = spelling.chars
    if override is not None:
        positions, counts, chars = override
        source_start = source_start.copy()
        source_start[positions] = len(source_chars) + np.cumsum(counts) - counts
        length[positions] = counts
        source_chars = np.concatenate([source_chars, chars])
    # Every real token takes at least one character slot (a blank or special token: the pad char),
    # then one separator; padding takes none.
    slots = np.where(padding, 0, np.maximum(length, 1) + 1).reshape(batch_size, width)  # (B, L)
    start = np.cumsum(slots, axis=1) - slots  # (B, L) offset of each token's first char in its row
    row_length = slots.sum(axis=1)  # (B,)
    stream_width = max(int(row_length.max(initial=0)), 1)
    char_ids = np.zeros(batch_size * stream_width, dtype=np.int64)
    row = np.repeat(np.arange(batch_size, dtype=np.int64), width)
    destination = row * stream_width + start.reshape(-1)  # (B·L,) flat position of each token's first char
    char_ids[ragged_arange(destination, length)] = source_chars[ragged_arange(source_start, length)]
    first = np.where(padding.reshape(batch_size, width), 0, start)
    last = np.where(padding.reshape(batch_size, width), 0, start + np.maximum(length, 1).reshape(batch_size, width) - 1)
    return {
        "char_ids": char_ids.reshape(batch_size, stream_width),
        "char_lengths": np.maximum(row_length, 1),  # a row of padding only still gets one (pad) step
        "char_first": first,
        "char_last": last,
    }


class CharFeaturizer:
    """Picklable ``f(input_ids (B, L), offsets (B, L, 2), texts) -> char inputs`` for fine-tuning batches.

    Tokens are spelt as in pretraining (:class:`Spelling`), except [UNK] tokens, which are spelt from
    their characters in ``texts[b][start:end]`` (after the tokenizer's normaliser, so an uncased model
    sees them lower-cased as it saw everything else). ``offsets`` are the fast tokenizer's character
    offsets of each token in its text; rows are right-padded with the pad id.
    """

    def __init__(self, vocab: CharVocab, spelling: Spelling, pad_id: int, unk_id: int | None, normalizer=None):
        self.vocab, self.spelling, self.pad_id, self.unk_id = vocab, spelling, pad_id, unk_id
        self.normalizer = normalizer

    def __call__(self, input_ids: np.ndarray, offsets: np.ndarray, texts: list[str]) -> dict[str, np.ndarray]:
        input_ids = np.asarray(input_ids)
        override = None
        if self.unk_id is not None:
            rows, columns = np.nonzero(input_ids == self.unk_id)
            if len(rows):
                # [UNK] is rare, so spelling those few tokens one by one costs nothing next to the batch.
                surfaces = [self._normalize(texts[r][int(offsets[r, c, 0]):int(offsets[r, c, 1])]).strip()
                            for r, c in zip(rows.tolist(), columns.tolist())]
                encoded = [self.vocab.encode(s) for s in surfaces]
                counts = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
                chars = np.fromiter((c for e in encoded for c in e), dtype=np.int64, count=int(counts.sum()))
                override = (rows * input_ids.shape[1] + columns, counts, chars)
        return char_stream(input_ids, np.zeros(input_ids.shape, dtype=bool), self.spelling, self.pad_id, override)

    def _normalize(self, text: str) -> str:
        return self.normalizer.normalize_str(text) if self.normalizer is not None else text
