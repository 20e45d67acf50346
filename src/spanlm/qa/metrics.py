"""Extractive QA metrics: the official SQuAD v1.1/v2.0 EM and F1, and CMRC 2018's.

* ``squad`` — the official evaluation scripts (evaluate-v2.0.py, whose answerable-question scores are
  v1.1's): answers lower-cased, ASCII punctuation (``string.punctuation``) removed, the articles
  a/an/the removed, whitespace collapsed; F1 over the bag of whitespace tokens; the maximum over the
  gold answers that do not normalise to nothing. A question without an answer scores 1 exactly when
  the prediction normalises to nothing. (On v1.1 data this is evaluate-v1.1.py's score except in its
  degenerate cases: v1.1 keeps a gold answer such as "The" and scores F1 0 between two empty answers.)
* ``cmrc2018`` — cmrc2018_evaluate.py (v5, "SQuAD-style"): EM compares the answers after lower-casing,
  stripping and removing the script's punctuation list; F1 is computed over a *mixed segmentation*
  (every CJK character is a segment, runs of other characters are split into words) with that
  punctuation removed, precision/recall from the longest common *contiguous* run of segments.
  The script splits non-CJK runs with ``nltk.word_tokenize``; we split them into runs of word
  characters (digits may contain '.' or ',') and single other symbols, which is what word_tokenize
  does on the short numbers, names and Latin words of CMRC answers without depending on NLTK's
  downloadable punkt data. (Contractions such as "don't" stay one word here.)

Scores are per question in [0, 1]; :func:`evaluate` reports percentages as the scripts do.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping
from difflib import SequenceMatcher

import numpy as np

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_squad(text: str) -> str:
    """The official SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_em(prediction: str, gold: str) -> float:
    return float(normalize_squad(prediction) == normalize_squad(gold))


def squad_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_squad(prediction).split(), normalize_squad(gold).split()
    if not predicted or not expected:  # evaluate-v2.0.py: empty vs empty is a match, else 0
        return float(predicted == expected)
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


# cmrc2018_evaluate.py's sp_char list. Its entry '……' is two characters; the script compares single
# characters against the list, so it never matches and is left out here as well.
_CMRC_PUNCTUATION = set("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』")
_CJK = re.compile(r"[\u4e00-\u9fa5]")  # the script's range of Chinese characters
_WORDS = re.compile(r"\w+(?:[.,]\w+)*|[^\w\s]")


def cmrc_segments(text: str, remove_punctuation: bool = True) -> list[str]:
    """cmrc2018_evaluate.py's mixed_segmentation: CJK characters one by one, other runs as words."""
    segments, run = [], []
    for char in text.lower().strip():
        if remove_punctuation and char in _CMRC_PUNCTUATION:
            continue
        if _CJK.match(char) or char in _CMRC_PUNCTUATION:
            segments.extend(_WORDS.findall("".join(run)))
            run = []
            segments.append(char)
        else:
            run.append(char)
    segments.extend(_WORDS.findall("".join(run)))
    return segments


def cmrc_normalize(text: str) -> str:
    """cmrc2018_evaluate.py's remove_punctuation (used for EM)."""
    return "".join(ch for ch in text.lower().strip() if ch not in _CMRC_PUNCTUATION)


def cmrc_em(prediction: str, gold: str) -> float:
    return float(cmrc_normalize(prediction) == cmrc_normalize(gold))


def cmrc_f1(prediction: str, gold: str) -> float:
    predicted, expected = cmrc_segments(prediction), cmrc_segments(gold)
    if not predicted or not expected:
        return 0.0
    # The script's find_lcs is the longest common substring (contiguous), which SequenceMatcher finds
    # exactly when no element is treated as junk.
    common = (
        SequenceMatcher(None, expected, predicted, autojunk=False)
        .find_longest_match(0, len(expected), 0, len(predicted))
        .size
    )
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


METRICS = {"squad": (squad_em, squad_f1), "cmrc2018": (cmrc_em, cmrc_f1)}


def question_scores(prediction: str, gold: list[str], metric: str) -> tuple[float, float]:
    """(EM, F1) of one prediction: the best over the gold answers; a no-answer question wants "".

    SQuAD as evaluate-v2.0.py's get_raw_scores: gold answers that normalise to nothing ("The", ".")
    are dropped, and a question left without any is scored against "" — so a prediction that
    normalises to nothing is a correct no-answer.
    """
    if metric == "squad":
        gold = [answer for answer in gold if normalize_squad(answer)] or [""]
    elif not gold:
        return float(prediction == ""), float(prediction == "")
    em, f1 = METRICS[metric]
    return max(em(prediction, answer) for answer in gold), max(f1(prediction, answer) for answer in gold)


def best_threshold(null_margin: np.ndarray, span_scores: np.ndarray, has_answer: np.ndarray) -> tuple[float, float]:
    """The no-answer threshold that maximises the score (evaluate-v2.0.py's find_best_thresh).

    ``null_margin[q]`` is how much the null answer beats the best span (predict "" when it exceeds the
    threshold); ``span_scores[q]`` the EM or F1 the best span would get. Returns (score in %, threshold).
    Sweeping the threshold upwards through the sorted margins turns one more question from "" into its
    span: + its span score if it has an answer, its span score − 1 if it has none (it was right as "";
    a span that normalises to nothing is right too).
    Unlike the official script, a threshold answers *all* questions with a tied margin, so the score
    returned is the one the threshold really gets.
    """
    order = np.argsort(null_margin, kind="stable")
    margins = null_margin[order]
    gain = span_scores[order] - ~has_answer[order]  # − 1 where "" was the right answer
    all_null = float(has_answer.size - has_answer.sum())
    running = all_null + np.cumsum(gain)  # score after answering the first k+1 questions
    last_of_tie = np.append(margins[1:] != margins[:-1], True)  # a threshold stops only after a tie group
    running = np.where(last_of_tie, running, -np.inf)
    best = int(np.argmax(running))
    if running[best] <= all_null:  # answering nothing is best: a threshold below every margin
        return 100.0 * all_null / has_answer.size, float(np.nextafter(null_margin.min(), -np.inf))
    return 100.0 * float(running[best]) / has_answer.size, float(margins[best])


def evaluate(
    predictions: Mapping[str, str],
    gold: Mapping[str, list[str]],
    metric: str,
    null_margin: Mapping[str, float] | None = None,
    threshold: float | None = None,
) -> dict[str, float]:
    """EM / F1 (%) of ``predictions`` (the best non-null span per question id) against ``gold``.

    With ``null_margin`` (SQuAD v2.0), a question is answered "" when its margin exceeds ``threshold``
    (0 when None), and the best thresholds for EM and F1 are reported as well.
    """
    ids = list(gold)
    scores = np.array([question_scores(predictions.get(q, ""), gold[q], metric) for q in ids]).reshape(-1, 2)  # (Q, 2)
    if null_margin is None:
        return {
            "em": 100.0 * float(scores[:, 0].mean()),
            "f1": 100.0 * float(scores[:, 1].mean()),
            "questions": len(ids),
        }
    threshold = 0.0 if threshold is None else threshold
    margin = np.array([null_margin[q] for q in ids], dtype=np.float64)
    has_answer = np.array([bool(gold[q]) for q in ids])
    answered = margin <= threshold
    final = np.where(answered[:, None], scores, (~has_answer).astype(np.float64)[:, None])  # "" scores 1 iff no answer
    result = {
        "em": 100.0 * float(final[:, 0].mean()),
        "f1": 100.0 * float(final[:, 1].mean()),
        "questions": len(ids),
        "threshold": threshold,
    }
    for name, subset in (("has_answer", has_answer), ("no_answer", ~has_answer)):
        if subset.any():
            result[f"{name}_em"] = 100.0 * float(final[subset, 0].mean())
            result[f"{name}_f1"] = 100.0 * float(final[subset, 1].mean())
    result["best_em"], result["best_em_threshold"] = best_threshold(margin, scores[:, 0], has_answer)
    result["best_f1"], result["best_f1_threshold"] = best_threshold(margin, scores[:, 1], has_answer)
    return result
