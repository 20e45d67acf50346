"""Span P/R/F1 (micro, per type, in percent), CLUENER's macro string-match F1, edge cases, the printed table."""

import pytest

from spanlm.ner.metrics import cluener_macro_f1, format_table, span_prf

GOLD = [("d1", "PER", 0, 3), ("d1", "LOC", 5, 7), ("d2", "PER", 1, 2), ("d2", "ORG", 4, 9)]
PRED = [("d1", "PER", 0, 3), ("d1", "LOC", 5, 8), ("d2", "PER", 1, 2), ("d2", "PER", 4, 9), ("d2", "PER", 1, 2)]


def test_micro_and_per_type():
    scores = span_prf(GOLD, PRED)
    micro = scores["micro"]
    assert (micro["tp"], micro["n_pred"], micro["n_gold"]) == (2, 4, 4)  # the duplicate prediction once
    assert micro["precision"] == micro["recall"] == micro["f1"] == 50.0
    per = scores["per_type"]
    assert list(per) == ["LOC", "ORG", "PER"]
    assert per["PER"] == {
        "precision": pytest.approx(200 / 3),
        "recall": 100.0,
        "f1": pytest.approx(80.0),
        "tp": 2,
        "n_pred": 3,
        "n_gold": 2,
    }
    assert per["LOC"]["f1"] == 0.0 and per["LOC"]["n_pred"] == 1  # off-by-one end is a miss
    assert per["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "tp": 0, "n_pred": 0, "n_gold": 1}


def test_no_predictions_no_gold_both_empty():
    nothing = span_prf(GOLD, [])
    assert nothing["micro"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "tp": 0, "n_pred": 0, "n_gold": 4}
    spurious = span_prf([], PRED)
    assert spurious["micro"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "tp": 0, "n_pred": 4, "n_gold": 0}
    assert spurious["per_type"]["PER"]["n_pred"] == 3
    empty = span_prf([], [])
    assert empty == {
        "micro": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "tp": 0, "n_pred": 0, "n_gold": 0},
        "per_type": {},
    }
    assert cluener_macro_f1([], []) == {"f1": 0.0, "per_type": {}}


def test_cluener_macro_hand_computed():
    gold = [(0, "name", "张三"), (0, "name", "李四"), (0, "address", "北京"), (1, "name", "张三"), (1, "game", "魔兽")]
    pred = [
        (0, "name", "张三"),
        (0, "name", "张三"),  # the same string twice in a document counts once
        (0, "address", "北京市"),  # wrong string
        (1, "name", "张三"),
        (1, "name", "王五"),
        (1, "game", "魔兽"),
    ]
    # name: tp 2 (doc 0 张三, doc 1 张三), pred 3, gold 3 → P = R = F1 = 66.7%
    # address: tp 0 → F1 0;  game: tp 1, pred 1, gold 1 → F1 100
    result = cluener_macro_f1(gold, pred)
    assert result["per_type"]["name"]["f1"] == pytest.approx(200 / 3)
    assert result["per_type"]["address"]["f1"] == 0.0
    assert result["per_type"]["game"]["f1"] == 100.0
    assert result["f1"] == pytest.approx((200 / 3 + 0 + 100) / 3)
    # a fixed label list (the official script's) averages labels absent from both as 0
    assert cluener_macro_f1(gold, pred, labels=["name", "address", "game", "book"])["f1"] == pytest.approx(
        (200 / 3 + 100) / 4
    )


def test_cluener_matches_strings_not_offsets():
    """The same text at other offsets is a hit for CLUENER's score, a miss for the span score."""
    text = "上海人在上海"
    gold_spans, pred_spans = [(0, "address", 0, 2)], [(0, "address", 4, 6)]
    assert span_prf(gold_spans, pred_spans)["micro"]["f1"] == 0.0
    strings = lambda spans: [(d, label, text[s:e]) for d, label, s, e in spans]  # noqa: E731
    assert cluener_macro_f1(strings(gold_spans), strings(pred_spans))["f1"] == 100.0


def test_format_table():
    scores = span_prf(GOLD, PRED)
    scores["cluener_macro_f1"] = {"f1": 43.21, "per_type": {}}
    table = format_table(scores)
    lines = table.splitlines()
    assert lines[0].split() == ["type", "P", "R", "F1", "tp", "pred", "gold"]
    per = {line.split()[0]: line.split()[1:] for line in lines if line.split()[0] in ("LOC", "ORG", "PER", "micro")}
    assert per["PER"] == ["66.67", "100.00", "80.00", "2", "3", "2"]
    assert per["micro"] == ["50.00", "50.00", "50.00", "2", "4", "4"]
    assert lines[-1] == "CLUENER macro F1 (string match): 43.21"
    assert "CLUENER" not in format_table(span_prf(GOLD, PRED))
