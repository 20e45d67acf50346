"""Documents → fixed-size token windows with their entity spans, at training and prediction time.

A document of ``n`` content tokens is read through windows of at most ``max_len`` tokens, special
tokens included: ``prefix + tokens[k·step : k·step + C] + suffix`` for ``k = 0 … K-1``, where ``C =
max_len - #specials`` is the content capacity, ``stride`` the overlap of consecutive windows and
``step = C - stride``. ``K = 1`` when ``n ≤ C``, else ``1 + ⌈(n - C) / step⌉``, so the last window reaches
the last token: nothing beyond ``max_len`` is lost. The special tokens (the tokenizer's own template:
BERT's [CLS]/[SEP], RoBERTa's <s>/</s>) are taken from the tokenizer and never start or end an entity
(``token_mask``).

Training targets: an entity (token span ``s..e`` of its document) is a target in every window that
holds it whole, i.e. windows ``k`` with ``k·step ≤ s`` and ``e < k·step + C``; an entity longer than
``C`` tokens fits no window and is counted. Windows, entity placement and padding are computed with
NumPy over all documents at once.

Encoders with extra inputs (CharBERT) expose ``featurizer()``; its callable gets each batch's ids,
character offsets and document texts and adds its arrays to the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from spanlm.errors import ConfigError, InputError
from spanlm.finetune.batches import window_batch
from spanlm.ner.align import AlignmentReport, char_to_token, tokenize_documents
from spanlm.ner.data import NerDocument

Featurizer = Callable[[np.ndarray, np.ndarray, list[str]], dict[str, np.ndarray]]


def special_template(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a single sequence (e.g. [CLS] … [SEP])."""
    encoded = tokenizer("a", add_special_tokens=True, return_special_tokens_mask=True)
    ids, special = encoded["input_ids"], encoded["special_tokens_mask"]
    content = [i for i, flag in enumerate(special) if not flag]
    if not content:
        raise InputError(
            f"{tokenizer.name_or_path}: the tokenizer produces no content token for 'a'; cannot find its "
            "special-token template"
        )
    return ids[: content[0]], ids[content[-1] + 1 :]


@dataclasses.dataclass
class Windows:
    """All windows of a list of documents, in document order; rows padded to the longest window."""

    input_ids: np.ndarray  # (W, L) int64
    attention_mask: np.ndarray  # (W, L) bool
    token_mask: np.ndarray  # (W, L) bool: content tokens (may start / end an entity)
    offsets: np.ndarray  # (W, L, 2) int64: [start, end) characters in the window's document; 0 for specials / padding
    document: np.ndarray  # (W,) int64: index of the window's document
    entity_spans: np.ndarray  # (W, N, 3) int64: (type, start, end inclusive) window positions, -1 rows pad
    texts: list[str]  # the documents' texts (for a featurizer)
    featurizer: Featurizer | None = None
    pad_id: int = 0  # the tokenizer's padding id
    # A batch's windows one after another in one packed stream (spanlm.data.packing); False: one window per row.
    packed: bool = False

    def __len__(self) -> int:
        return len(self.document)

    def batch(self, indices, targets: bool = True) -> dict[str, torch.Tensor | int]:
        """Model inputs (and ``entity_spans``) of windows ``indices``, cut to the longest of them."""
        indices = np.asarray(indices)
        length = int(self.attention_mask[indices].sum(1).max())
        rows = {
            "input_ids": self.input_ids[indices, :length],
            "attention_mask": self.attention_mask[indices, :length],
            "token_mask": self.token_mask[indices, :length],
        }
        if targets:
            spans = self.entity_spans[indices]  # (B, N, 3)
            width = max(int((spans[..., 0] >= 0).sum(1).max()), 1)  # rows are packed to the front
            rows["entity_spans"] = spans[:, :width]
        texts = [self.texts[d] for d in self.document[indices]]
        return window_batch(rows, self.offsets[indices, :length], texts, self.featurizer, self.packed, self.pad_id)


@dataclasses.dataclass
class WindowReport:
    """Alignment of the entities plus what windowing did."""

    alignment: AlignmentReport
    windows: int = 0
    documents: int = 0
    split_documents: int = 0  # documents longer than one window
    too_long: int = 0  # aligned entities longer than a window's content (in no window whole)

    def summary(self) -> dict:
        return {
            "documents": self.documents,
            "windows": self.windows,
            "split_documents": self.split_documents,
            "entities_too_long": self.too_long,
            **self.alignment.summary(),
        }

    def lines(self, name: str) -> list[str]:
        out = self.alignment.lines(name)
        if self.too_long:
            out.append(
                f"{name}: {self.too_long} entities are longer than a window's content and are not trained on; "
                "raise data.max_len"
            )
        return out


def make_windows(
    tokenizer,
    documents: list[NerDocument],
    labels: list[str],
    max_len: int,
    stride: int,
    featurizer: Featurizer | None = None,
) -> tuple[Windows, WindowReport]:
    """Tokenize ``documents`` once and cut them into windows with their entity spans."""
    prefix, suffix = special_template(tokenizer)
    capacity = max_len - len(prefix) - len(suffix)  # content tokens per window (C)
    if capacity < 1:
        raise ConfigError(
            f"data.max_len {max_len} leaves no room for tokens after {len(prefix) + len(suffix)} special tokens"
        )
    if not 0 <= stride < capacity:
        raise ConfigError(
            f"data.stride {stride} must be at least 0 and less than the {capacity} content tokens of a window"
        )
    step = capacity - stride
    tokens = tokenize_documents(tokenizer, [document.text for document in documents])
    n = tokens.lengths  # (D,)
    n_windows = np.where(n <= capacity, 1, 1 + -(-(n - capacity) // step))  # (D,) ceil division
    first_window = np.concatenate([[0], np.cumsum(n_windows)])  # (D + 1,)
    count = int(first_window[-1])

    # Window w: document d, number k within it, first content token k·step, length ≤ C.
    document = np.repeat(np.arange(len(documents)), n_windows)  # (W,)
    start = (np.arange(count) - first_window[document]) * step  # (W,)
    length = np.minimum(capacity, n[document] - start)  # (W,)
    n_prefix, n_suffix = len(prefix), len(suffix)
    width = n_prefix + int(length.max(initial=0)) + n_suffix
    column = np.arange(width)[None, :]  # (1, L)
    content = (column >= n_prefix) & (column < n_prefix + length[:, None])  # (W, L)
    source = np.clip(
        tokens.token_starts[document][:, None] + start[:, None] + column - n_prefix,
        0,
        max(len(tokens.input_ids) - 1, 0),
    )  # (W, L)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = np.full((count, width), pad, dtype=np.int64)
    offsets = np.zeros((count, width, 2), dtype=np.int64)
    if len(tokens.input_ids):
        input_ids[content] = tokens.input_ids[source[content]]
        offsets[content] = tokens.offsets[source[content]]
    input_ids[:, :n_prefix] = prefix
    suffix_columns = n_prefix + length[:, None] + np.arange(n_suffix)[None, :]  # (W, S)
    input_ids[np.arange(count)[:, None], suffix_columns] = suffix
    attention_mask = column < (n_prefix + length + n_suffix)[:, None]

    spans, alignment, too_long = _window_entities(
        documents, labels, tokens, n_windows, first_window, step, capacity, n_prefix
    )
    report = WindowReport(
        alignment,
        windows=count,
        documents=len(documents),
        split_documents=int((n_windows > 1).sum()),
        too_long=too_long,
    )
    windows = Windows(
        input_ids,
        attention_mask,
        content,
        offsets,
        document,
        spans,
        [d.text for d in documents],
        featurizer,
        pad_id=pad,
    )
    return windows, report


def _window_entities(
    documents: list[NerDocument],
    labels: list[str],
    tokens,
    n_windows: np.ndarray,
    first_window: np.ndarray,
    step: int,
    capacity: int,
    n_prefix: int,
) -> tuple[np.ndarray, AlignmentReport, int]:
    """(W, N, 3) entity spans per window (padded with -1 rows), the alignment report, entities in no window."""
    label_index = {label: i for i, label in enumerate(labels)}
    unknown = sorted({e.label for d in documents for e in d.entities} - set(label_index))
    if unknown:
        raise InputError(f"entity labels {unknown} are not in the label set {labels}")
    flat = [
        (d, e.start, e.end, label_index[e.label]) for d, document in enumerate(documents) for e in document.entities
    ]
    doc, char_start, char_end, kind = (
        (np.array(column, dtype=np.int64) for column in zip(*flat)) if flat else (np.zeros(0, np.int64),) * 4
    )
    text_lengths = np.array([len(d.text) for d in documents], dtype=np.int64)
    first, last, exact, aligned = char_to_token(tokens, doc, char_start, char_end, text_lengths)
    report = AlignmentReport(
        entities=len(doc),
        exact=int(exact.sum()),
        snapped=int((aligned & ~exact).sum()),
        unaligned=int((~aligned).sum()),
    )
    for i in np.flatnonzero(aligned & ~exact)[:5]:
        text, base = documents[doc[i]].text, tokens.token_starts[doc[i]]
        snapped = text[tokens.offsets[base + first[i], 0] : tokens.offsets[base + last[i], 1]]
        report.examples.append((documents[doc[i]].id, text[char_start[i] : char_end[i]], snapped))

    doc, first, last, kind = doc[aligned], first[aligned], last[aligned], kind[aligned]
    # Windows k holding s..e whole: k·step ≤ s and e < k·step + C, within the document's K windows.
    k_low = np.maximum(0, -(-(last - capacity + 1) // step))
    k_high = np.minimum(n_windows[doc] - 1, first // step)
    per_entity = np.maximum(k_high - k_low + 1, 0)  # (E,)
    too_long = int((per_entity == 0).sum())
    entity = np.repeat(np.arange(len(doc)), per_entity)  # (P,) one row per (entity, window) placement
    k = k_low[entity] + np.arange(len(entity)) - np.repeat(np.cumsum(per_entity) - per_entity, per_entity)
    window = first_window[doc[entity]] + k
    rows = np.stack(
        [window, kind[entity], first[entity] - k * step + n_prefix, last[entity] - k * step + n_prefix], 1
    )  # (P, 4)
    rows = (
        np.unique(rows, axis=0) if len(rows) else rows.reshape(0, 4)
    )  # snapping can make two spans one; sorted by window
    count = int(first_window[-1])
    per_window = np.bincount(rows[:, 0], minlength=count)  # (W,)
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(per_window) - per_window, per_window)  # rank within its window
    spans = np.full((count, max(int(per_window.max(initial=0)), 1), 3), -1, dtype=np.int64)
    spans[rows[:, 0], slot] = rows[:, 1:]
    return spans, report, too_long
