"""Examples as model inputs: one sequence each, ``[CLS] text [SEP]`` or ``[CLS] text [SEP] pair [SEP]`` as the
tokenizer builds it (its own special tokens and token type ids, as ``pipeline("text-classification")`` does),
truncated to ``max_length`` (the longer of a pair first, transformers' ``longest_first``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from spanlm.cls.data import Example
from spanlm.finetune.batches import window_batch


@dataclasses.dataclass
class Features:
    """Every example's tokens, padded to the longest; ``batch(indices)`` cuts a batch to its own longest."""

    input_ids: np.ndarray  # (N, L) int64
    token_type_ids: np.ndarray  # (N, L) int64
    attention_mask: np.ndarray  # (N, L) bool
    offsets: np.ndarray  # (N, L, 2) int64: each token's characters in its example's text (the pair after a "\n")
    labels: np.ndarray | None  # (N,) int64 class ids or float32 targets; None: unlabelled
    texts: list[str]  # text, or text + "\n" + pair: what the offsets point into (CharBERT's featurizer spells them)
    featurizer: Callable | None = None  # CharBERT's char inputs from (ids, offsets, texts)
    pad_id: int = 0
    packed: bool = False  # a batch's sequences in one packed stream (spanlm.data.packing)

    def __len__(self) -> int:
        return len(self.input_ids)

    def batch(self, indices, targets: bool = True) -> dict[str, torch.Tensor | int]:
        indices = np.asarray(indices)
        length = int(self.attention_mask[indices].sum(1).max())
        rows = {
            name: getattr(self, name)[indices, :length] for name in ("input_ids", "token_type_ids", "attention_mask")
        }
        # The rows' own mask survives packing (the packed attention_mask is the stream's): mean pooling reads it.
        rows["sequence_mask"] = rows["attention_mask"].copy()
        if targets and self.labels is not None:
            rows["labels"] = self.labels[indices]
        texts = [self.texts[i] for i in indices]
        return window_batch(rows, self.offsets[indices, :length], texts, self.featurizer, self.packed, self.pad_id)


def make_features(
    tokenizer,
    examples: list[Example],
    max_length: int,
    labels: list[str] | None,
    featurizer: Callable | None = None,
) -> Features:
    """Tokenize ``examples``; their labels become ids in ``labels`` (classification) or float targets (None)."""
    texts = [e.text for e in examples]
    pairs = [e.text_pair for e in examples]
    paired = any(pair is not None for pair in pairs)
    encoded = tokenizer(
        texts,
        [pair or "" for pair in pairs] if paired else None,
        truncation=True,
        max_length=max_length,
        return_offsets_mapping=True,
    )
    # Segment ids where the tokenizer gives them (as it does inside pipeline("text-classification")): a tokenizer
    # that names no token_type_ids leaves every token in segment 0, in training as in the exported model's use.
    segments = encoded["token_type_ids"] if "token_type_ids" in encoded else None
    n, width = len(examples), max(len(ids) for ids in encoded["input_ids"])
    input_ids = np.full((n, width), tokenizer.pad_token_id or 0, dtype=np.int64)
    token_type_ids = np.zeros((n, width), dtype=np.int64)
    attention_mask = np.zeros((n, width), dtype=bool)
    offsets = np.zeros((n, width, 2), dtype=np.int64)
    joined = []
    for i, ids in enumerate(encoded["input_ids"]):
        input_ids[i, : len(ids)] = ids
        if segments is not None:
            token_type_ids[i, : len(ids)] = segments[i]
        attention_mask[i, : len(ids)] = True
        spans = np.asarray(encoded["offset_mapping"][i], dtype=np.int64).reshape(-1, 2)
        if paired:  # the pair's characters come after the text and a newline in the joined text
            second = np.asarray([s == 1 for s in encoded.sequence_ids(i)])
            spans[second] += len(texts[i]) + 1
        offsets[i, : len(ids)] = spans
        joined.append(texts[i] if not paired else f"{texts[i]}\n{pairs[i] or ''}")
    targets = None
    if all(e.label is not None for e in examples):
        if labels is None:
            targets = np.asarray([e.label for e in examples], dtype=np.float32)
        else:
            index = {label: i for i, label in enumerate(labels)}
            targets = np.asarray([index[e.label] for e in examples], dtype=np.int64)
    return Features(
        input_ids, token_type_ids, attention_mask, offsets, targets, joined, featurizer, tokenizer.pad_token_id or 0
    )
