"""The scores GLUE and CLUE report, as their evaluation scripts define them (×100):

* accuracy; F1 of the positive class (MRPC, QQP report F1 and accuracy); macro-F1 (the unweighted mean of every
  class's F1, a class without gold or predicted examples counting 0);
* Matthews correlation (CoLA; Matthews 1975, in its multi-class form, Gorodkin 2004), 0 where it is undefined;
* Pearson and Spearman correlations (STS-B), Spearman's ties taking their average rank; 0 for a constant input.
"""

from __future__ import annotations

import numpy as np


def confusion(gold: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """(classes, classes) counts: rows gold, columns predicted."""
    return np.bincount(gold * classes + predicted, minlength=classes * classes).reshape(classes, classes)


def accuracy(gold: np.ndarray, predicted: np.ndarray) -> float:
    return 100.0 * float(np.mean(gold == predicted)) if len(gold) else 0.0


def f1_scores(matrix: np.ndarray) -> np.ndarray:
    """Each class's F1 from a confusion matrix (0 where it has neither gold nor predicted examples)."""
    tp = np.diag(matrix).astype(np.float64)
    denominator = matrix.sum(0) + matrix.sum(1)
    return np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)


def matthews(matrix: np.ndarray) -> float:
    """Gorodkin's multi-class Matthews correlation (the binary MCC for two classes)."""
    matrix = matrix.astype(np.float64)
    total, correct = matrix.sum(), np.trace(matrix)
    predicted, gold = matrix.sum(0), matrix.sum(1)
    numerator = correct * total - gold @ predicted
    denominator = np.sqrt(total**2 - predicted @ predicted) * np.sqrt(total**2 - gold @ gold)
    return 100.0 * float(numerator / denominator) if denominator > 0 else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, np.float64) - np.mean(x), np.asarray(y, np.float64) - np.mean(y)
    denominator = np.sqrt((x @ x) * (y @ y))
    return 100.0 * float((x @ y) / denominator) if denominator > 0 else 0.0


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, tied values sharing their mean rank."""
    order = np.argsort(values, kind="stable")
    ordered = np.asarray(values)[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(ordered)]
    mean_rank = (starts + ends + 1) / 2.0  # positions start..end-1 hold ranks start+1..end
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(average_ranks(np.asarray(x)), average_ranks(np.asarray(y)))


def classification_scores(
    gold: np.ndarray, predicted: np.ndarray, labels: list[str], metrics: list[str], positive_label: str
) -> dict[str, float]:
    """``metrics`` of class ids ``predicted`` against ``gold`` (ids into ``labels``)."""
    matrix = confusion(gold, predicted, len(labels))
    scores = {}
    for name in metrics:
        if name == "accuracy":
            scores[name] = accuracy(gold, predicted)
        elif name == "f1":
            if positive_label not in labels:
                raise ValueError(f"cls.positive_label {positive_label!r} is not a label ({', '.join(labels)})")
            scores[name] = 100.0 * float(f1_scores(matrix)[labels.index(positive_label)])
        elif name == "macro_f1":
            scores[name] = 100.0 * float(f1_scores(matrix).mean())
        elif name == "matthews":
            scores[name] = matthews(matrix)
        else:
            raise ValueError(f"{name} scores a regression task, not a classification")
    return scores


def regression_scores(gold: np.ndarray, predicted: np.ndarray, metrics: list[str]) -> dict[str, float]:
    functions = {"pearson": pearson, "spearman": spearman}
    for name in metrics:
        if name not in functions:
            raise ValueError(f"{name} scores a classification task, not a regression")
    return {name: functions[name](gold, predicted) for name in metrics}
