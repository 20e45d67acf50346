"""The GLUE / CLUE scores against scipy and scikit-learn (where installed) and a direct count, on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from spanlm.cls.metrics import (
    accuracy,
    average_ranks,
    classification_scores,
    confusion,
    f1_scores,
    matthews,
    pearson,
    regression_scores,
    spearman,
)


def counted_f1(gold, predicted, label) -> float:
    tp = sum(1 for g, p in zip(gold, predicted) if g == p == label)
    fp = sum(1 for g, p in zip(gold, predicted) if p == label != g)
    fn = sum(1 for g, p in zip(gold, predicted) if g == label != p)
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def counted_matthews(gold, predicted) -> float:
    """The binary MCC from its four counts (Matthews 1975)."""
    tp = sum(1 for g, p in zip(gold, predicted) if g == p == 1)
    tn = sum(1 for g, p in zip(gold, predicted) if g == p == 0)
    fp = sum(1 for g, p in zip(gold, predicted) if p == 1 != g)
    fn = sum(1 for g, p in zip(gold, predicted) if g == 1 != p)
    denominator = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


@pytest.mark.parametrize("seed", range(5))
def test_classification_scores_match_direct_counts(seed):
    rng = np.random.default_rng(seed)
    classes = int(rng.integers(2, 5))
    gold = rng.integers(0, classes, 200)
    predicted = np.where(rng.random(200) < 0.6, gold, rng.integers(0, classes, 200))
    assert accuracy(gold, predicted) == pytest.approx(100 * np.mean(gold == predicted))
    per_class = f1_scores(confusion(gold, predicted, classes))
    assert per_class == pytest.approx([counted_f1(gold, predicted, c) for c in range(classes)])
    labels = [str(c) for c in range(classes)]
    scores = classification_scores(gold, predicted, labels, ["f1", "macro_f1", "accuracy"], "1")
    assert scores["f1"] == pytest.approx(100 * counted_f1(gold, predicted, 1))
    assert scores["macro_f1"] == pytest.approx(100 * np.mean(per_class))
    binary_gold, binary_predicted = gold % 2, predicted % 2
    assert matthews(confusion(binary_gold, binary_predicted, 2)) == pytest.approx(
        100 * counted_matthews(binary_gold, binary_predicted)
    )


@pytest.mark.parametrize("seed", range(5))
def test_against_scikit_learn(seed):
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    classes = int(rng.integers(2, 5))
    gold = rng.integers(0, classes, 300)
    predicted = np.where(rng.random(300) < 0.5, gold, rng.integers(0, classes, 300))
    matrix = confusion(gold, predicted, classes)
    assert matthews(matrix) == pytest.approx(100 * metrics.matthews_corrcoef(gold, predicted))
    assert 100 * f1_scores(matrix).mean() == pytest.approx(
        100 * metrics.f1_score(gold, predicted, average="macro", labels=range(classes), zero_division=0)
    )
    assert accuracy(gold, predicted) == pytest.approx(100 * metrics.accuracy_score(gold, predicted))


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    gold = np.round(rng.uniform(0, 5, 150), 1)  # STS-B-like scores, with ties
    predicted = gold + rng.normal(0, 1.5, 150)
    predicted[:20] = np.round(predicted[:20])  # ties on the predicted side too
    assert pearson(gold, predicted) == pytest.approx(100 * stats.pearsonr(gold, predicted)[0])
    assert spearman(gold, predicted) == pytest.approx(100 * stats.spearmanr(gold, predicted)[0])
    assert average_ranks(predicted) == pytest.approx(stats.rankdata(predicted))
    assert regression_scores(gold, predicted, ["spearman"]) == {"spearman": spearman(gold, predicted)}


def test_undefined_scores_are_zero():
    constant = np.zeros(10)
    assert pearson(constant, np.arange(10)) == 0.0
    assert matthews(confusion(np.zeros(10, int), np.zeros(10, int), 2)) == 0.0


def test_a_regression_metric_is_refused_for_classes():
    with pytest.raises(ValueError, match="regression"):
        classification_scores(np.zeros(3, int), np.zeros(3, int), ["0", "1"], ["pearson"], "1")
