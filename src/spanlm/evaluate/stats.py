"""The verdict's arithmetic: mean and spread over seeds, and paired differences with a confidence interval.

Two encoders fine-tuned with the same seed see the same data order and the same head initialisation, so their
scores are paired: the difference per seed removes what the seed alone decides (which examples came first,
where the head started), and the t-interval over those differences (Student's t with n − 1 degrees of
freedom) is the interval of a paired t-test. With a single seed there is no spread over seeds to estimate;
the interval then comes from a paired bootstrap over the dev examples (:func:`paired_bootstrap`), which
measures how much the verdict depends on the dev set drawn, not on the seed.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np


@dataclasses.dataclass(frozen=True)
class Spread:
    """Mean ± sample standard deviation (0 for one value) over seeds."""

    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            raise ValueError("no values")
        return cls(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values))


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """``encoder − baseline`` over the seeds both have: the mean difference, its spread and its 95% interval.

    ``low`` / ``high`` are None with a single pair; ``excludes_zero`` is then False.
    """

    mean: float
    std: float
    n: int
    low: float | None
    high: float | None
    positive: int  # seeds where the encoder scored higher

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and (self.low > 0 or self.high < 0)


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The two-sided ``confidence`` interval of the mean of ``values`` (Student's t), or None for one value."""
    from scipy.stats import t

    n = len(values)
    if n < 2:
        return None
    mean, std = statistics.fmean(values), statistics.stdev(values)
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return mean - half, mean + half


def paired_difference(scores: dict[int, float], baseline: dict[int, float], confidence: float = 0.95):
    """``scores − baseline`` per seed over the seeds both have (a seed's scores are keyed by the seed), or None
    when they share no seed."""
    seeds = sorted(set(scores) & set(baseline))
    if not seeds:
        return None
    differences = [scores[seed] - baseline[seed] for seed in seeds]
    spread = Spread.of(differences)
    interval = t_interval(differences, confidence)
    return PairedDifference(
        spread.mean,
        spread.std,
        spread.n,
        None if interval is None else interval[0],
        None if interval is None else interval[1],
        sum(difference > 0 for difference in differences),
    )


def paired_bootstrap(
    score,
    columns: dict[str, np.ndarray],
    baseline_columns: dict[str, np.ndarray],
    resamples: int = 1000,
    confidence: float = 0.95,
    generator: np.random.Generator | None = None,
) -> tuple[float, float]:
    """The percentile interval of ``score(encoder) − score(baseline)`` over dev sets resampled with replacement,
    the same resample for both (the paired bootstrap of Koehn 2004 and Berg-Kirkpatrick et al. 2012).

    ``columns``: per dev example, the counts or scores the metric is computed from (NER: tp, n_pred, n_gold
    per document; QA: em, f1 per question); ``score(sums, n)`` turns their sums over a resample of ``n``
    examples (arrays of shape (resamples,)) into the metric.
    """
    generator = generator if generator is not None else np.random.default_rng(0)
    n = len(next(iter(columns.values())))
    if any(len(values) != n for values in (*columns.values(), *baseline_columns.values())):
        raise ValueError("the encoder and the baseline were scored on different dev sets")
    rows = generator.integers(0, n, size=(resamples, n))  # (resamples, n): one resampled dev set per row

    def resampled(table: dict[str, np.ndarray]) -> np.ndarray:
        return score({name: np.asarray(values)[rows].sum(axis=1) for name, values in table.items()}, n)

    differences = resampled(columns) - resampled(baseline_columns)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(differences, [tail, 100 - tail])
    return float(low), float(high)
