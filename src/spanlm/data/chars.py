"""CharBERT's character inputs: the character vocabulary, every token's spelling, the per-row char stream.

CharBERT (Ma et al. 2020, §3.1) reads each sequence a second time as characters: the
characters of all its tokens in order, sub-word markers stripped, tokens separated by the pad
character, run through one BiGRU; a token's char vector is the GRU output at its first and at its last
character. Special tokens and MLM targets are spelt as a single pad character, so the char channel
never shows the characters of a token the MLM head must predict.

**Spellings come from the token ids.** CharBERT's noise re-tokenises misspelt words
(:mod:`spanlm.objectives.charbert.masker`), so during pretraining the characters the model must read are those of
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
(``bert_char_vocab``: 1001 entries, 0 = pad). An export keeps it in its config.json.

The vocabulary, the spellings, the stream and the featurizer are defined in
:mod:`spanlm.models.modeling_charbert`, the modeling file every CharBERT export ships, so a
transformers user builds the char inputs with the very code spanlm trains with; this module adds the
corpus side (:func:`build_char_vocab`).
"""

from __future__ import annotations

import numpy as np

# The char inputs are implemented in the CharBERT modeling file that every export ships, so that
# transformers users build them as spanlm does; spanlm's own code imports them from here.
from spanlm.models.modeling_charbert import PAD_CHAR, CharFeaturizer, CharVocab, Spelling, char_stream, token_surfaces

__all__ = ["PAD_CHAR", "CharFeaturizer", "CharVocab", "Spelling", "build_char_vocab", "char_stream", "token_surfaces"]


def build_char_vocab(corpus, size: int) -> CharVocab:
    """The character vocabulary of a prepared corpus: token spellings weighted by corpus frequency."""
    tokenizer = corpus.tokenizer
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    shared = min(len(tokenizer), len(corpus.token_counts))
    counts[:shared] = np.asarray(corpus.token_counts[:shared])
    return CharVocab.build(token_surfaces(tokenizer), counts, size)
