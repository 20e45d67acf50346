"""Official SQuAD and CMRC 2018 metrics against hand-computed cases; the no-answer threshold sweep."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spanlm.qa.metrics import (
    best_threshold,
    cmrc_em,
    cmrc_f1,
    cmrc_segments,
    evaluate,
    normalize_squad,
    question_scores,
    squad_em,
    squad_f1,
)


def test_squad_normalisation():
    assert normalize_squad("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_squad("An apple a day") == "apple day"
    assert normalize_squad("theatre") == "theatre"  # articles are whole words only
    assert normalize_squad("“Café”") == "“café”"  # only ASCII punctuation goes (string.punctuation)


def test_squad_em_f1_hand_computed():
    assert squad_em("An Apple.", "apple") == 1.0
    assert squad_em("apples", "apple") == 0.0
    # pred {cat, sat}, gold {cat, sat, down}: P = 1, R = 2/3 → F1 = 0.8
    assert squad_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
    # bag of tokens: "cat cat" vs "cat": 1 common, P = 1/2, R = 1 → 2/3
    assert squad_f1("cat cat", "cat") == pytest.approx(2 / 3)
    assert squad_f1("dog", "cat") == 0.0
    assert squad_f1("the", "a") == 1.0  # both normalise to nothing: a match (evaluate-v2.0.py)


def test_max_over_gold_answers_and_no_answer_questions():
    assert question_scores("cat sat", ["dog", "the cat sat down", "cat sat"], "squad") == (1.0, 1.0)
    em, f1 = question_scores("cat", ["dog", "cat sat"], "squad")
    assert em == 0.0 and f1 == pytest.approx(2 / 3)
    assert question_scores("", [], "squad") == (1.0, 1.0)
    assert question_scores("something", [], "cmrc2018") == (0.0, 0.0)


def test_squad_scores_degenerate_answers_as_evaluate_v2():
    # A prediction that normalises to nothing is a correct no-answer (the script compares normalised text).
    assert question_scores("The", [], "squad") == (1.0, 1.0)
    assert question_scores(".", [], "squad") == (1.0, 1.0)
    # Gold answers that normalise to nothing are dropped: "a" no longer matches "The" for free.
    assert question_scores("a", ["The", "cat"], "squad") == (0.0, 0.0)
    assert question_scores("the cat", ["The", "cat"], "squad") == (1.0, 1.0)
    # Only such answers: the question is scored against "".
    assert question_scores("", ["The"], "squad") == (1.0, 1.0)
    assert question_scores("dog", ["The"], "squad") == (0.0, 0.0)


def test_cmrc_mixed_segmentation():
    # CJK characters one by one, other runs as words, lower-cased, the script's punctuation removed.
    assert cmrc_segments("2008年北京Olympic Games 3.5%") == ["2008", "年", "北", "京", "olympic", "games", "3.5", "%"]
    # As in the script, removed punctuation does not end a run: "Games，3.5" becomes one word.
    assert cmrc_segments("Games，3.5") == ["games3.5"]
    assert cmrc_segments("光荣和ω-force") == ["光", "荣", "和", "ωforce"]  # '-' is removed before segmenting
    assert cmrc_segments("《红楼梦》", remove_punctuation=False) == ["《", "红", "楼", "梦", "》"]


def test_cmrc_em_f1_hand_computed():
    assert cmrc_em("《红楼梦》", "红楼梦") == 1.0 and cmrc_em("红楼梦。", "红楼") == 0.0
    assert cmrc_em("ABC", "abc") == 1.0
    # [北,京,大,学] vs [北,京]: common run 2, P = 2/4, R = 2/2 → F1 = 2/3
    assert cmrc_f1("北京大学", "北京") == pytest.approx(2 / 3)
    # The longest common *contiguous* run: 北大京 vs 北京 share runs of 1 only → P = 1/3, R = 1/2, F1 = 0.4
    # (a bag of characters would give 0.8).
    assert cmrc_f1("北大京", "北京") == pytest.approx(0.4)
    # Mixed: [1984,年,洛,杉,矶] vs [1984,年]: P = 2/5, R = 1 → 4/7
    assert cmrc_f1("1984年洛杉矶", "1984年") == pytest.approx(4 / 7)
    assert cmrc_f1("", "北京") == 0.0 and cmrc_f1("上海", "北京") == 0.0


def test_evaluate_percentages():
    result = evaluate({"a": "北京大学", "b": "上海"}, {"a": ["北京"], "b": ["上海", "沪"]}, "cmrc2018")
    assert result == {"em": 50.0, "f1": pytest.approx(100 * (2 / 3 + 1) / 2), "questions": 2}
    missing = evaluate({}, {"a": ["x"]}, "squad")  # an unanswered question counts as wrong
    assert missing["em"] == 0.0 and missing["f1"] == 0.0


def test_no_answer_threshold_hand_computed():
    gold = {"q0": ["cat"], "q1": [], "q2": ["dog"], "q3": []}
    spans = {"q0": "cat", "q1": "bird", "q2": "dog", "q3": "fish"}
    margins = {"q0": -2.0, "q1": -1.0, "q2": 0.5, "q3": 3.0}  # null score − best span score
    # Threshold 0: q0, q1 answered with spans (right, wrong), q2, q3 answered "" (wrong, right) → 50%.
    at_zero = evaluate(spans, gold, "squad", margins, 0.0)
    assert at_zero["em"] == 50.0 and at_zero["has_answer_em"] == 50.0 and at_zero["no_answer_em"] == 50.0
    # Sweep: all "" → 2/4; answer q0 → 3/4; + q1 → 2/4; + q2 → 3/4; + q3 → 2/4. Best 75% at -2.
    assert at_zero["best_em"] == 75.0 and at_zero["best_em_threshold"] == -2.0
    assert evaluate(spans, gold, "squad", margins, -2.0)["em"] == 75.0
    # Answering nothing is best when every span is wrong: the threshold lies below every margin.
    score, threshold = best_threshold(np.array([1.0, 2.0]), np.array([0.0, 0.0]), np.array([True, False]))
    assert score == 50.0 and threshold < 1.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-5, 5), st.sampled_from([0.0, 0.5, 1.0]), st.booleans()), min_size=1, max_size=12)
)
def test_best_threshold_matches_brute_force(rows):
    margin = np.array([r[0] for r in rows], dtype=float)
    span = np.array([r[1] for r in rows])
    has = np.array([r[2] for r in rows])

    def score_at(
        threshold,
    ):  # answered (its span's score) when margin <= threshold, else "" (right exactly without an answer)
        return 100 * np.mean(np.where(margin <= threshold, span, (~has).astype(float)))

    best, threshold = best_threshold(margin, span, has)
    candidates = [margin.min() - 1] + sorted(set(margin.tolist()))
    assert best == pytest.approx(max(score_at(t) for t in candidates))
    assert score_at(threshold) == pytest.approx(best)
