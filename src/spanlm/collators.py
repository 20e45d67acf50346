"""spanlm's maskers as collators for the Hugging Face ``Trainer`` or any ``DataLoader``.

The same maskers spanlm pretrains with (BERT MLM, whole-word, SpanBERT spans with SBO targets,
MacBERT n-grams with similar words), fed with tokenizer features instead of a prepared corpus::

    from spanlm.collators import MaskingCollator, count_tokens, tokenize_words

    dataset = dataset.map(tokenize_words(tokenizer, max_length=128), batched=True, remove_columns=["text"])
    collator = MaskingCollator(tokenizer, scheme="span", seed=0, token_counts=count_tokens(dataset, len(tokenizer)))
    batch = collator([dataset[i] for i in range(8)])   # input_ids, attention_mask, labels (-100 elsewhere), sbo_*

Whole words come from each feature's ``word_ids`` (the fast tokenizer's, or jieba's for Chinese: see
:func:`tokenize_words`); a token whose word id is None is a special token and never a target. The
output follows transformers' convention — ``labels`` holds the original id at every target and -100
elsewhere, so a stock ``*ForMaskedLM`` computes the MLM loss — plus, for ``scheme="span"``, the
Span Boundary Objective's inputs as flat positions into the (B, L) batch (``sbo_left``, ``sbo_right``,
``sbo_relative``) and its labels (``sbo_labels``), which :class:`spanlm.models.span_boundary.SpanBoundaryModel`
adds to a stock ``*ForMaskedLM``.

Randomness: every batch is masked with a NumPy generator seeded from ``seed`` and, inside a DataLoader
worker, the worker's id — so workers never repeat each other's masks and a run is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np

from spanlm.data.blocks import BlockBatch
from spanlm.data.words import jieba_word_index
from spanlm.errors import ConfigError
from spanlm.masking.base import SCHEMES, MaskingConfig, Vocabulary

IGNORE_INDEX = -100  # transformers' label of a position without a target


def tokenize_words(
    tokenizer,
    max_length: int | None = None,
    words: Literal["tokenizer", "jieba"] = "tokenizer",
    text_column: str = "text",
) -> Callable[[dict], dict]:
    """A function for ``dataset.map(..., batched=True)``: texts → ``input_ids``, ``attention_mask``, ``word_ids``.

    Special tokens are added (and their word id is None); the *text* of a special token ("[MASK]",
    "<s>") is tokenized as ordinary text, as in ``spanlm prepare``. ``words="jieba"`` numbers words by
    jieba's segmentation (Chinese, which BERT tokenizes per character), else the fast tokenizer's own.
    """

    def encode(batch: dict) -> dict:
        texts = batch[text_column]
        encoded = tokenizer(texts, truncation=max_length is not None, max_length=max_length, split_special_tokens=True)
        word_ids = [encoded.word_ids(i) for i in range(len(texts))]
        if words == "jieba":
            encodings = encoded.encodings
            lengths = np.array([len(e.ids) for e in encodings], dtype=np.int64)
            index = jieba_word_index(texts, encodings, lengths).astype(np.int64)  # global over the batch
            starts = np.cumsum(lengths) - lengths
            word_ids = [
                [None if own is None else int(index[start + t]) for t, own in enumerate(row)]
                for row, start in zip(word_ids, starts)
            ]
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "word_ids": word_ids}

    return encode


def count_tokens(rows: Iterable, vocab_size: int, column: str = "input_ids") -> np.ndarray:
    """Corpus frequency of every id (``vocab_size``,): the distribution SpanBERT's random replacements follow.

    ``rows``: a ``datasets.Dataset`` (read in Arrow batches) or any iterable of dicts / id lists.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    batches = rows.iter(batch_size=1024) if hasattr(rows, "iter") else ({column: [row]} for row in rows)
    for batch in batches:
        ids = batch[column] if isinstance(batch, dict) else batch
        ids = [row[column] if isinstance(row, dict) else row for row in ids]
        flat = np.fromiter((i for row in ids for i in row), dtype=np.int64)
        counts += np.bincount(flat, minlength=vocab_size)[:vocab_size]
    return counts


class MaskingCollator:
    """Tokenizer features → one masked batch of ``scheme`` (see the module docstring).

    Args:
        tokenizer: the fast tokenizer the features were made with (vocabulary size, [MASK], padding).
        scheme: ``mlm`` (BERT), ``wwm`` (whole words), ``span`` (SpanBERT + SBO), ``ngram`` (MacBERT), or any
            registered scheme whose masker has ``for_collator`` (``spanlm.masking.base.register_scheme``).
        masking: the settings of every scheme (``spanlm.masking.base.MaskingConfig``; the scheme's
            section is used), e.g. ``MaskingConfig(span=SpanConfig(p=0.2, max_targets=15))``.
        seed: seeds the masks (with the DataLoader worker's id inside a worker).
        token_counts: corpus frequencies (:func:`count_tokens`) for ``random_source: unigram`` (SpanBERT's
            default, as in the authors' code).
        similar_words: MacBERT's similar-word table: a ``spanlm prepare`` directory made with
            ``data.similar_words`` set, or a loaded :class:`~spanlm.data.similar_words.SimilarWords`.
        pad_to_multiple_of: pad the length to a multiple of this (e.g. 8 for tensor cores).
    """

    def __init__(
        self,
        tokenizer,
        scheme: str = "mlm",
        masking: MaskingConfig | None = None,
        seed: int = 0,
        token_counts: np.ndarray | None = None,
        similar_words=None,
        pad_to_multiple_of: int | None = None,
    ):
        offered = [name for name, known in SCHEMES.items() if hasattr(known.masker_class(), "for_collator")]
        if scheme not in offered:
            raise ConfigError(
                f"scheme must be {', '.join(offered[:-1])} or {offered[-1]} (a scheme that needs no prepared corpus), "
                f"not {scheme!r}"
            )
        masking = masking or MaskingConfig()
        settings = masking.section(scheme)
        if getattr(settings, "random_source", None) == "unigram" and token_counts is None:
            raise ConfigError(
                f"masking.{scheme}.random_source is 'unigram' (random replacements follow the corpus "
                "frequencies): pass token_counts=spanlm.collators.count_tokens(dataset, len(tokenizer)), "
                f"or set masking.{scheme}.random_source='uniform'"
            )
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise ConfigError("the tokenizer needs a mask and a pad token")
        self.tokenizer, self.scheme, self.seed = tokenizer, scheme, seed
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_id = int(tokenizer.pad_token_id)
        vocabulary = Vocabulary(
            size=len(tokenizer),
            mask_id=int(tokenizer.mask_token_id),
            special_ids=tuple(int(i) for i in tokenizer.all_special_ids),
            token_counts=None if token_counts is None else np.asarray(token_counts, dtype=np.int64),
        )
        self.masker = SCHEMES[scheme].masker_class().for_collator(settings, vocabulary, similar_words=similar_words)
        self._rng: np.random.Generator | None = None
        self._rng_worker: int | None = None

    def _generator(self) -> np.random.Generator:
        """This process's generator: seeded by (seed, DataLoader worker id), made on first use in each worker."""
        import torch

        info = torch.utils.data.get_worker_info()
        worker = -1 if info is None else info.id
        if self._rng is None or self._rng_worker != worker:
            self._rng = np.random.default_rng([self.seed, worker + 1])
            self._rng_worker = worker
        return self._rng

    def __call__(self, features: list[dict]) -> dict:
        import torch

        batch = self.block_batch(features)
        masked = self.masker(batch, self._generator())
        ids = masked.input_ids  # (B, L) the corrupted input
        labels = np.full(ids.size, IGNORE_INDEX, dtype=np.int64)
        labels[masked.target_index] = masked.target_labels
        out = {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(batch.attention_mask.astype(np.int64)),
            "labels": torch.from_numpy(labels.reshape(ids.shape)),
        }
        if "token_type_ids" in features[0]:
            out["token_type_ids"] = torch.from_numpy(
                self._pad([f["token_type_ids"] for f in features], ids.shape[1], 0)
            )
        for name in getattr(self.masker, "collated", ()):  # the scheme's own inputs (SpanBERT's SBO targets)
            out[name] = torch.from_numpy(np.ascontiguousarray(getattr(masked, name)))
        return out

    def block_batch(self, features: list[dict]) -> BlockBatch:
        """Pad the features into the (B, L) arrays the maskers read; word starts from ``word_ids``."""
        if not features:
            raise ConfigError("the collator got an empty list of features")
        if "input_ids" not in features[0]:
            raise ConfigError(f"every feature needs input_ids (got keys {sorted(features[0])})")
        has_words = "word_ids" in features[0]
        if not has_words and getattr(self.masker, "reads_words", True):
            raise ConfigError(
                f"scheme {self.scheme!r} masks whole words: every feature needs word_ids — tokenize with "
                "spanlm.collators.tokenize_words(tokenizer), or add encoding.word_ids() to each feature"
            )
        lengths = np.array([len(f["input_ids"]) for f in features], dtype=np.int64)
        width = int(lengths.max())
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = self._pad([f["input_ids"] for f in features], width, self.pad_id)
        attention = np.arange(width)[None, :] < lengths[:, None]  # (B, L)
        if has_words:
            # None (a special token) → -1; padding is -1 too. A word starts where the id changes.
            word_ids = self._pad([[-1 if w is None else w for w in f["word_ids"]] for f in features], width, -1)
            special = word_ids < 0
            previous = np.concatenate([np.full((len(features), 1), -1), word_ids[:, :-1]], axis=1)
            word_starts = ~special & (word_ids != previous)
        else:
            structural = [i for i in self.tokenizer.all_special_ids if i != self.tokenizer.unk_token_id]
            special = ~attention | np.isin(input_ids, structural)
            word_starts = ~special
        return BlockBatch(
            input_ids=input_ids, word_starts=word_starts, attention_mask=attention, special_mask=special | ~attention
        )

    @staticmethod
    def _pad(rows: list, width: int, value: int) -> np.ndarray:
        out = np.full((len(rows), width), value, dtype=np.int64)
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        out[np.arange(width)[None, :] < lengths[:, None]] = np.fromiter(
            (x for r in rows for x in r), dtype=np.int64, count=int(lengths.sum())
        )
        return out
