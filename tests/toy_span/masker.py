"""The toy span scheme: runs of ``length`` tokens masked, and each run's left boundary token asked for the run's
first token (a one-target Span Boundary Objective) — a batch array of its own that packing must remap."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from spanlm.masking.base import FLAT, KEEP, MASK, MaskedBatch, Vocabulary


@dataclasses.dataclass
class ToySpanConfig:
    """``masking.toy_span``: the share of content tokens masked and the run length."""

    rate: float = 0.15
    length: int = 3

    def __post_init__(self) -> None:
        if not 0.0 < self.rate < 1.0:
            raise ValueError(f"rate must be in (0, 1), got {self.rate}")
        if self.length < 1:
            raise ValueError(f"length must be at least 1, got {self.length}")


class ToySpanMasker:
    # What a collator returns beside the MLM labels.
    collated = ("boundary_index", "boundary_labels")

    def __init__(self, config: ToySpanConfig, vocabulary: Vocabulary):
        self.config, self.vocabulary = config, vocabulary

    @classmethod
    def from_corpus(cls, config: ToySpanConfig, corpus) -> ToySpanMasker:
        return cls(config, Vocabulary.from_corpus(corpus))

    @classmethod
    def for_collator(cls, config: ToySpanConfig, vocabulary: Vocabulary, **options) -> ToySpanMasker:
        return cls(config, vocabulary)

    def __call__(self, batch, rng: np.random.Generator) -> MaskedBatch:
        length = self.config.length
        content = ~batch.special_mask  # (B, L)
        # A run may start where its `length` tokens are all content (so its left neighbour is in the block).
        fits = content.copy()
        for k in range(1, length):
            fits[:, :-k] &= content[:, k:]
            fits[:, -k:] = False
        starts = np.flatnonzero(fits & (rng.random(fits.shape) < self.config.rate / length))  # flat, ascending
        covered = np.zeros(content.size, dtype=bool)
        for k in range(length):
            covered[starts + k] = True
        targets = np.flatnonzero(covered)
        original = batch.input_ids.reshape(-1)
        input_ids = batch.input_ids.copy()
        input_ids.reshape(-1)[targets] = self.vocabulary.mask_id
        word_starts = batch.word_starts.reshape(-1)
        words = (~word_starts[starts]).astype(np.int64) + sum(
            word_starts[starts + k].astype(np.int64) for k in range(length)
        )
        masked = MaskedBatch(
            input_ids=input_ids,
            attention_mask=batch.attention_mask.copy(),
            target_index=targets,
            target_labels=original[targets].copy(),
            target_kind=np.full(len(targets), MASK, dtype=np.int8),
            span_start=starts,
            span_end=starts + length,
            span_words=words,
            counters={"runs": len(starts)},
        )
        # Its own arrays: the boundary before each run (a flat position, remapped when packed) and the run's
        # first original token (a label, copied).
        return masked.add(FLAT, boundary_index=starts - 1).add(KEEP, boundary_labels=original[starts].copy())

    @staticmethod
    def statistics(pairs: list, counters: Counter) -> dict:
        blocks = sum(m.batch_size for _, m in pairs)
        return {"boundaries_per_block": round(counters["runs"] / max(blocks, 1), 3)}

    legend = "x| the boundary before a run"

    @staticmethod
    def mark(shown: list[str], masked: MaskedBatch, row: int, low: int, length: int, terms) -> None:
        """A boundary token shows as ``x|``."""
        index = masked.boundary_index
        for column in (index[(index >= low) & (index < low + length)] - low).tolist():
            shown[column] = f"{shown[column]}|"
