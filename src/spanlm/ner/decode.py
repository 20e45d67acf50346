"""GlobalPointer decoding: every cell above the threshold is an entity (Su et al. 2022, arXiv 2208.03054).

Cell (α, i, j) of the logits (B, T, L, L) scores tokens i..j (inclusive) as type α. With threshold 0 —
the ZLPR loss's decision boundary — nested spans, overlapping spans and one span with several types
come out as they are. Masked cells (padding, special tokens, j < i) hold the dtype's minimum and are
never above a threshold. ``flat=True`` keeps a non-overlapping subset instead, greedily by score, for
flat-NER data whose gold spans never overlap.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

Span = tuple[int, int, int, float]  # (type_id, start_token, end_token_inclusive, score)


def decode_spans(logits: Tensor, threshold: float = 0.0, flat: bool = False) -> list[list[Span]]:
    """Per row of ``logits`` (B, T, L, L), its spans ``(type, start, end_inclusive, score)``.

    Spans are sorted by (start, end, type). ``flat``: the highest-scoring span is kept first, then the
    next one that overlaps no kept span, and so on (on a tie, the earlier span in that order wins).
    """
    batch, n_types, length, _ = logits.shape
    found = torch.nonzero(logits > threshold)  # (M, 4): b, α, i, j
    scores = logits[tuple(found.unbind(1))].float()  # (M,)
    b, kind, start, end = found.unbind(1)
    order = torch.argsort(((b * length + start) * length + end) * n_types + kind)  # by (row, start, end, type)
    cells = found[order].cpu().numpy()
    scores = scores[order].cpu().numpy()
    bounds = np.searchsorted(cells[:, 0], np.arange(batch + 1))  # row r's spans: bounds[r] .. bounds[r+1]
    rows = []
    for r in range(batch):
        row_cells, row_scores = cells[bounds[r] : bounds[r + 1]], scores[bounds[r] : bounds[r + 1]]
        if flat:
            keep = _greedy_non_overlapping(row_cells[:, 2], row_cells[:, 3], row_scores)
            row_cells, row_scores = row_cells[keep], row_scores[keep]
        rows.append(
            [
                (int(a), int(i), int(j), float(s))
                for a, i, j, s in zip(row_cells[:, 1], row_cells[:, 2], row_cells[:, 3], row_scores)
            ]
        )
    return rows


def _greedy_non_overlapping(starts: np.ndarray, ends: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Sorted indices of the spans kept by highest-score-first selection without overlaps.

    The loop runs once per *kept* span (each step rejects every remaining span it overlaps), over a
    precomputed K × K overlap matrix of the row's K candidate spans.
    """
    by_score = np.argsort(-scores, kind="stable")  # candidates are in (start, end, type) order: ties keep it
    starts, ends = starts[by_score], ends[by_score]
    overlap = (starts[:, None] <= ends[None, :]) & (starts[None, :] <= ends[:, None])  # (K, K) shares a token
    open_ = np.ones(len(by_score), dtype=bool)
    kept = []
    while open_.any():
        k = int(np.argmax(open_))  # best remaining candidate
        kept.append(by_score[k])
        open_ &= ~overlap[k]
    return np.sort(np.asarray(kept, dtype=np.int64))
