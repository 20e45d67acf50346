"""NER scores: exact-match span P/R/F1 (micro and per type) and CLUENER's official macro F1.

``span_prf`` compares *sets* of (doc_id, label, start_char, end_char): a predicted span counts only
if its document, type and both boundaries match a gold span exactly, the usual
entity-level score (CoNLL's conlleval for flat data, and for nested data the same definition applied to
every span). ``cluener_macro_f1`` is the CLUENER 2020 benchmark's own scoring
(CLUEbenchmark/CLUENER2020, ``get_f1_score``): per label, the *entity strings* of each document are
compared (a prediction with the right text but another occurrence's offsets counts, and a string
repeated in one document counts once), and the reported number is the unweighted mean of the
per-label F1. Precision, recall and F1 are in percent (0..100), the unit NER papers and the ``ner`` tables
use. Ratios with a zero denominator are 0, not NaN (no predictions → precision 0; no gold → recall 0).
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Iterable

KEYS = ("precision", "recall", "f1", "tp", "n_pred", "n_gold")


def span_prf(gold: Iterable[tuple], pred: Iterable[tuple]) -> dict:
    """Micro and per-type exact-match scores over tuples ``(doc_id, label, start_char, end_char)``.

    Returns ``{"micro": {precision, recall, f1, tp, n_pred, n_gold}, "per_type": {label: {...}}}`` with a
    per-type entry for every label seen in gold or predictions; precision, recall and F1 in percent.
    Duplicate tuples count once.
    """
    return _scores(set(gold), set(pred))


def per_document_counts(gold: Iterable[tuple], pred: Iterable[tuple], documents: int) -> dict[str, list[int]]:
    """Per document ``0 … documents − 1`` (the tuples' first field): exact matches, predicted and gold spans.

    The micro scores are ratios of these counts' sums, so a bootstrap over documents resamples them
    (F1 = 2·tp / (n_pred + n_gold)).
    """
    gold, pred = set(gold), set(pred)

    def per_document(group: set) -> list[int]:
        counts = Counter(t[0] for t in group)
        return [counts[index] for index in range(documents)]

    return {"tp": per_document(gold & pred), "n_pred": per_document(pred), "n_gold": per_document(gold)}


def cluener_macro_f1(gold: Iterable[tuple], pred: Iterable[tuple], labels: Iterable[str] | None = None) -> dict:
    """CLUENER's official score over tuples ``(doc_id, label, entity_text)``.

    Returns ``{"f1": macro F1, "per_type": {label: {...}}}``: the per-label scores of string matches and
    their unweighted mean, in percent. ``labels`` fixes the labels averaged over (the official script's ten CLUENER
    labels); by default, every label seen in gold or predictions.
    """
    scores = _scores(set(gold), set(pred), labels)
    per_type = scores["per_type"]
    macro = sum(s["f1"] for s in per_type.values()) / len(per_type) if per_type else 0.0
    return {"f1": macro, "per_type": per_type}


def format_table(scores: dict) -> str:
    """A printable table of :func:`span_prf`'s result: one row per type, then the micro average
    (P/R/F1 in percent, as the scores are); CLUENER's macro F1 below it when ``scores["cluener_macro_f1"]``
    is present."""
    rows = [(label, s) for label, s in scores["per_type"].items()] + [("micro", scores["micro"])]
    width = max([len(str(label)) for label, _ in rows] + [5])
    header = f"{'type':<{width}}  {'P':>6}  {'R':>6}  {'F1':>6}  {'tp':>6}  {'pred':>6}  {'gold':>6}"
    lines = [header, "-" * len(header)]
    for index, (label, s) in enumerate(rows):
        if index == len(rows) - 1:
            lines.append("-" * len(header))
        lines.append(
            f"{str(label):<{width}}  {s['precision']:6.2f}  {s['recall']:6.2f}  "
            f"{s['f1']:6.2f}  {s['tp']:6d}  {s['n_pred']:6d}  {s['n_gold']:6d}"
        )
    if "cluener_macro_f1" in scores:
        macro = scores["cluener_macro_f1"]
        lines.append(f"CLUENER macro F1 (string match): {macro['f1'] if isinstance(macro, dict) else macro:.2f}")
    return "\n".join(lines)


def _scores(gold: set, pred: set, labels: Iterable[Hashable] | None = None) -> dict:
    """P/R/F1 of the tuple sets ``gold`` and ``pred`` overall and per label (the tuples' second field)."""
    hits = gold & pred
    tp, n_pred, n_gold = (Counter(t[1] for t in group) for group in (hits, pred, gold))
    if labels is None:
        labels = set(n_pred) | set(n_gold)
    per_type = {label: _prf(tp[label], n_pred[label], n_gold[label]) for label in sorted(labels, key=str)}
    return {"micro": _prf(len(hits), len(pred), len(gold)), "per_type": per_type}


def _prf(tp: int, n_pred: int, n_gold: int) -> dict:
    precision = 100 * tp / n_pred if n_pred else 0.0
    recall = 100 * tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return dict(zip(KEYS, (precision, recall, f1, tp, n_pred, n_gold)))
