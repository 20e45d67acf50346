"""Entities from GlobalPointer logits, over windows, back in characters — and the exported NER model.

Per window, every (type, start, end) cell above the threshold is an entity (nested and multi-type
spans allowed; ``decode_spans``). Window positions map to characters through the window's offset
table; a document read through overlapping windows takes, per (type, start, end) in characters, the
best score any window gave it. Flat decoding (``flat``) then keeps non-overlapping entities per
document, highest score first — after merging, so no two windows can each keep one of an
overlapping pair.

:class:`NerModel` is what ``spanlm ner train`` exports to ``<run>/model/`` and ``ner eval`` / ``ner
predict`` load: the encoder (a Hugging Face directory ``AutoModel`` loads), ``ner_head.safetensors``,
``labels.json`` (the type ids' labels) and ``recipe.yaml``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from spanlm.finetune.batches import to_device
from spanlm.finetune.char_spans import whole_spans
from spanlm.finetune.task import encoder_featurizer, load_task_model
from spanlm.models.encoder import load_encoder
from spanlm.models.hf_model import EncoderConfig
from spanlm.models.packed import resolve_packing
from spanlm.ner.config import NerRecipe
from spanlm.ner.data import Entity, NerDocument
from spanlm.ner.decode import decode_spans
from spanlm.ner.metrics import cluener_macro_f1, span_prf
from spanlm.ner.model import HEAD_FILE, LABELS_FILE, RECIPE_FILE, NerObjective, read_labels
from spanlm.ner.windows import Windows, make_windows


@dataclasses.dataclass
class Spans:
    """Predicted entities as parallel arrays (one row per entity)."""

    document: np.ndarray  # (P,) int64
    type: np.ndarray  # (P,) int64
    start: np.ndarray  # (P,) int64 characters, end exclusive
    end: np.ndarray  # (P,) int64
    score: np.ndarray  # (P,) float64

    @classmethod
    def concat(cls, parts: list[Spans]) -> Spans:
        fields = [f.name for f in dataclasses.fields(cls)]
        if not parts:
            return cls(*(np.zeros(0, np.float64 if name == "score" else np.int64) for name in fields))
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in fields))

    def take(self, rows: np.ndarray) -> Spans:
        return Spans(self.document[rows], self.type[rows], self.start[rows], self.end[rows], self.score[rows])


@torch.no_grad()
def window_spans(
    model: torch.nn.Module,
    windows: Windows,
    indices: np.ndarray,
    threshold: float,
    batch_size: int,
    device: torch.device,
    n_batches: int | None = None,
) -> Spans:
    """Decode windows ``indices`` into character spans. ``n_batches`` (≥ the batches needed) pads with
    repeats of the last batch, so every rank makes the same number of forward passes (FSDP)."""

    needed = -(-len(indices) // batch_size)
    parts = []
    for number in range(max(needed, n_batches or 0)):
        chunk = indices[number * batch_size : (number + 1) * batch_size] if number < needed else indices[-batch_size:]
        if len(chunk) == 0:  # this rank has no window but must join the others' forward passes
            chunk = np.zeros(1, np.int64)
        batch = to_device(windows.batch(chunk, targets=False), device)
        logits = model(batch)["logits"]  # (B, T, L, L)
        if number >= needed or len(indices) == 0:
            continue
        found = decode_spans(logits.float(), threshold)
        rows = np.array(
            [(r, t, s, e) for r, spans in enumerate(found) for t, s, e, _ in spans], dtype=np.int64
        ).reshape(-1, 4)
        scores = np.array([score for spans in found for *_, score in spans], dtype=np.float64)
        window = chunk[rows[:, 0]]
        parts.append(
            Spans(
                windows.document[window],
                rows[:, 1],
                windows.offsets[window, rows[:, 2], 0],
                windows.offsets[window, rows[:, 3], 1],
                scores,
            )
        )
    return Spans.concat(parts)


def by_length(windows: Windows, indices: np.ndarray) -> np.ndarray:
    """``indices`` ordered by window length: batches of similar lengths carry little padding, and the
    (B, T, L, L) logits grow with the square of the longest window (halves WNUT-17 dev's inference time)."""
    return indices[np.argsort(windows.attention_mask[indices].sum(1), kind="stable")]


def whole(spans: Spans, documents: list[NerDocument]) -> Spans:
    """Spans widened to whole grapheme clusters and trimmed of edge whitespace; those left empty dropped
    (spanlm.finetune.char_spans: token offsets can cut a character or hold only spaces)."""
    start, end = spans.start.copy(), spans.end.copy()
    order = np.argsort(spans.document, kind="stable")
    ranges = np.searchsorted(spans.document[order], np.arange(len(documents) + 1))
    for d, document in enumerate(documents):
        rows = order[ranges[d] : ranges[d + 1]]
        if len(rows):
            start[rows], end[rows] = whole_spans(document.text, start[rows], end[rows])
    kept = np.flatnonzero(start < end)
    return Spans(spans.document, spans.type, start, end, spans.score).take(kept)


def merge(spans: Spans) -> Spans:
    """One row per (document, type, start, end): the best score over the windows that found it."""
    order = np.lexsort((-spans.score, spans.end, spans.start, spans.type, spans.document))
    keys = np.stack([spans.document, spans.type, spans.start, spans.end], 1)[order]  # (P, 4) sorted, best first per key
    first = np.ones(len(order), dtype=bool)
    first[1:] = (keys[1:] != keys[:-1]).any(1)
    return spans.take(order[first])


def flat_select(spans: Spans) -> Spans:
    """Non-overlapping entities per document, highest score first (ties: earlier, then shorter)."""
    order = np.lexsort((spans.end - spans.start, spans.start, -spans.score))
    taken: dict[int, list[tuple[int, int]]] = {}
    keep = []
    # Greedy by score is sequential by nature; it runs over predicted entities only (a handful per document).
    for row in order:
        doc, s, e = int(spans.document[row]), int(spans.start[row]), int(spans.end[row])
        if all(e <= a or b <= s for a, b in taken.get(doc, ())):
            taken.setdefault(doc, []).append((s, e))
            keep.append(row)
    return spans.take(np.array(sorted(keep), dtype=np.int64))


def spans_to_documents(
    spans: Spans, documents: list[NerDocument], labels: list[str]
) -> list[tuple[NerDocument, list[float]]]:
    """Predicted documents (same ids and texts) with their entities sorted by (start, end, label), and scores."""
    order = np.lexsort((spans.type, spans.end, spans.start, spans.document))
    spans = spans.take(order)
    bounds = np.searchsorted(spans.document, np.arange(len(documents) + 1))
    out = []
    for d, document in enumerate(documents):
        rows = range(bounds[d], bounds[d + 1])
        entities = [Entity(int(spans.start[r]), int(spans.end[r]), labels[int(spans.type[r])]) for r in rows]
        out.append((NerDocument(document.id, document.text, entities), [float(spans.score[r]) for r in rows]))
    return out


def predict_documents(
    model: torch.nn.Module,
    windows: Windows,
    documents: list[NerDocument],
    labels: list[str],
    threshold: float,
    flat: bool,
    batch_size: int,
    device: torch.device,
) -> list[tuple[NerDocument, list[float]]]:
    """Entities of every document (``windows`` made from ``documents``), with their scores."""
    was_training = model.training
    model.eval()
    try:
        spans = window_spans(model, windows, by_length(windows, np.arange(len(windows))), threshold, batch_size, device)
        spans = merge(whole(spans, documents))
    finally:
        model.train(was_training)
    return spans_to_documents(flat_select(spans) if flat else spans, documents, labels)


def entity_tuples(documents: list[NerDocument]) -> list[tuple]:
    """(document index, label, start, end) of every entity: what the scores compare."""
    return [(i, e.label, e.start, e.end) for i, d in enumerate(documents) for e in d.entities]


def score_documents(gold: list[NerDocument], predicted: list[NerDocument], labels: list[str], cluener: bool) -> dict:
    """Micro / per-type P, R, F1 over (document, label, start, end); with ``cluener`` also CLUENER's
    official macro F1 over (document, label, entity text), averaged over every label of the model."""

    scores = span_prf(entity_tuples(gold), entity_tuples(predicted))
    if cluener:

        def texts(documents):
            return [(i, e.label, d.text[e.start : e.end]) for i, d in enumerate(documents) for e in d.entities]

        scores["cluener_macro_f1"] = cluener_macro_f1(texts(gold), texts(predicted), labels)
    return scores


class NerModel:
    """An exported NER model: encoder + GlobalPointer head + labels + the recipe it was trained with."""

    def __init__(self, directory: str | Path, device: str = "auto"):
        directory = Path(directory)

        def build(directory: Path, recipe: NerRecipe) -> NerObjective:
            self.labels = read_labels(directory / LABELS_FILE)
            return NerObjective(load_encoder(EncoderConfig(path=str(directory))), len(self.labels), recipe.ner)

        files = (RECIPE_FILE, HEAD_FILE, LABELS_FILE)
        loaded = load_task_model(directory, "NER", files, RECIPE_FILE, NerRecipe, build, device)
        self.recipe, self.objective, self.device = loaded.recipe, loaded.objective, loaded.device
        self.tokenizer = loaded.tokenizer
        self.featurizer = encoder_featurizer(self.objective.encoder)

    def windows(self, documents: list[NerDocument]) -> Windows:
        data = self.recipe.data
        bare = [NerDocument(d.id, d.text, []) for d in documents]  # prediction needs no gold entities
        windows = make_windows(self.tokenizer, bare, self.labels, data.max_len, data.stride, self.featurizer)[0]
        # The recipe records what training resolved data.packing to; "auto" outside the trainer (no speed
        # backend to decide) pads.
        windows.packed = resolve_packing(data.packing, self.objective, packs_by_default=False)
        return windows

    def predict(
        self,
        documents: list[NerDocument],
        batch_size: int = 32,
        flat: bool | None = None,
        threshold: float | None = None,
    ) -> list[tuple[NerDocument, list[float]]]:
        """Predicted entities (and scores) of ``documents``; ``flat`` / ``threshold`` default to the recipe's."""
        ner = self.recipe.ner
        return predict_documents(
            self.objective,
            self.windows(documents),
            documents,
            self.labels,
            ner.threshold if threshold is None else threshold,
            ner.flat if flat is None else flat,
            batch_size,
            self.device,
        )

    def predict_texts(
        self, texts: list[str], batch_size: int = 32, flat: bool | None = None
    ) -> list[tuple[NerDocument, list[float]]]:
        return self.predict([NerDocument(str(i), text, []) for i, text in enumerate(texts)], batch_size, flat)
