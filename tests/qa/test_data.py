"""SQuAD-format reading: offsets checked, wrong starts repaired or the question skipped, all reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spanlm.errors import InputError
from spanlm.qa.data import locate_answer, read_questions_jsonl, read_squad

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qa"
CMRC_OFFSETS, SQUAD_V2_SAMPLE, QUESTIONS = (
    FIXTURES / "cmrc2018_offsets.json",
    FIXTURES / "squad_v2_sample.json",
    FIXTURES / "questions.jsonl",
)
CONTEXT = "Paris is the capital of France. Paris has the Louvre."


def write(tmp_path, qas, context=CONTEXT, name="data.json"):
    path = tmp_path / name
    path.write_text(
        json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}),
        encoding="utf-8",
    )
    return path


def qa(qid, question="What?", answers=(), **extra):
    return {"id": qid, "question": question, "answers": [{"text": t, "answer_start": s} for t, s in answers], **extra}


def test_valid_offsets_kept_and_v2_no_answer(tmp_path):
    path = write(tmp_path, [qa("a", answers=[("France", 24)]), qa("b", is_impossible=True), qa("c", answers=[])])
    examples, report = read_squad(path)
    assert [e.id for e in examples] == ["a", "b", "c"]
    assert examples[0].answers[0].start == 24 and examples[0].gold == ["France"]
    assert examples[1].is_impossible and examples[2].is_impossible  # is_impossible, or no answers at all
    assert report.summary() == {
        "file": str(path),
        "questions": 3,
        "repaired_answers": 0,
        "unlocated_answers": 0,
        "skipped_questions": 0,
    }
    # SQuAD v1.1 training: questions without an answer are skipped and reported.
    examples, report = read_squad(path, allow_impossible=False)
    assert [e.id for e in examples] == ["a"]
    assert [where for where, _ in report.skipped] == [
        "data[0].paragraphs[0].qas[1] (id b)",
        "data[0].paragraphs[0].qas[2] (id c)",
    ]


def test_wrong_start_repaired_to_nearest_occurrence_within_window(tmp_path):
    # "Paris" occurs at 0 and 32: a start of 30 is repaired to 32 (nearest), 3 to 0.
    path = write(
        tmp_path,
        [
            qa("near", answers=[("Paris", 30)]),
            qa("near0", answers=[("Paris", 3)]),
            qa("minus", answers=[("Louvre", -1)]),
        ],
    )
    examples, report = read_squad(path, repair_window=5)
    assert [e.answers[0].start for e in examples] == [32, 0, 46]  # -1: the first occurrence anywhere
    assert all(CONTEXT[a.start : a.start + len(a.text)] == a.text for e in examples for a in e.answers)
    assert report.repaired == [("near", 30, 32), ("near0", 3, 0), ("minus", -1, 46)]
    assert "repaired 3 answer_start value(s): near (30→32)" in report.lines()[0] and str(path) in report.lines()[0]


def test_unrepairable_answers_dropped_or_question_skipped(tmp_path):
    path = write(
        tmp_path,
        [
            qa("far", answers=[("Louvre", 5)]),  # 41 characters away: beyond the window
            qa("absent", answers=[("Berlin", 0)]),
            qa("mixed", answers=[("France", 24), ("Germany", -1)]),
        ],
    )
    examples, report = read_squad(path, repair_window=20)
    assert [e.id for e in examples] == ["mixed"]
    assert examples[0].gold == ["France", "Germany"]  # still scored against, as the official scripts do
    assert [a.text for a in examples[0].answers] == ["France"]  # but only located answers are trained on
    # What is off is said: the text occurs, but too far from answer_start; or it does not occur at all.
    assert [(qid, why.split(":")[0]) for qid, why in report.unlocated] == [
        ("far", "answer_start 5 is off"),
        ("absent", "answer 'Berlin' does not occur in the context"),
        ("mixed", "answer 'Germany' does not occur in the context"),
    ]
    assert "'Louvre' occurs at 46" in report.unlocated[0][1] and "repair_window=20" in report.unlocated[0][1]
    assert [where for where, _ in report.skipped] == [
        "data[0].paragraphs[0].qas[0] (id far)",
        "data[0].paragraphs[0].qas[1] (id absent)",
    ]
    assert all(why.startswith("no answer has a span to train on") for _, why in report.skipped)
    assert "id far: answer_start 5 is off" in report.lines()[0]
    # Read for scoring, every question is kept (scored on its texts, as the official scripts do): the
    # metric's denominator is the whole file.
    scored, report = read_squad(path, repair_window=20, for_training=False)
    assert [(e.id, e.gold, e.answers) for e in scored][:2] == [("far", ["Louvre"], []), ("absent", ["Berlin"], [])]
    assert not report.skipped and len(report.unlocated) == 3
    assert locate_answer("abcabc", "abc", 2, 0) is None and locate_answer("abcabc", "abc", 2, 1) == 3


def test_malformed_records_reported_with_location(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {
                "data": [
                    {"title": "no paragraphs"},
                    {
                        "paragraphs": [
                            {"qas": [qa("x", answers=[("a", 0)]), qa("y")]},  # no context: both questions lost
                            {
                                "context": CONTEXT,
                                "qas": [
                                    {"id": "q1", "answers": []},
                                    qa("q2", answers=[("France", "24")]),
                                    {"id": "q3", "question": "Where?", "answers": [{"answer_start": 0}]},
                                    qa("q4", answers=[("France", 24)], is_impossible="no"),
                                    qa("ok", answers=[("France", 24)]),
                                    qa("ok", answers=[("Paris", 0)]),
                                ],
                            },
                        ]
                    },
                ]
            }
        ),
        encoding="utf-8",
    )
    examples, report = read_squad(path)
    assert [e.id for e in examples] == ["ok"] and examples[0].gold == ["France"]
    assert report.questions == 8
    assert report.skipped == [
        ("data[0]", "missing 'paragraphs'"),
        ("data[1].paragraphs[0]", "missing 'context'"),
        ("data[1].paragraphs[0]", "missing 'context'"),
        ("data[1].paragraphs[1].qas[0] (id q1)", "missing 'question'"),
        ("data[1].paragraphs[1].qas[1] (id q2).answers[0]", "'answer_start' must be int, got str"),
        ("data[1].paragraphs[1].qas[2] (id q3).answers[0]", "missing 'text'"),
        ("data[1].paragraphs[1].qas[3] (id q4)", "'is_impossible' must be bool, got str"),
        ("data[1].paragraphs[1].qas[5] (id ok)", "duplicate question id"),
    ]
    assert "skipped 8 question(s): data[0]: missing 'paragraphs'" in report.lines()[0]


def test_bad_json_and_bad_layout_name_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"data": [\n  {"paragraphs": [}\n]}', encoding="utf-8")
    with pytest.raises(InputError, match=r"broken.json:2:19: not valid JSON"):
        read_squad(path)
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(InputError, match=r"broken.json: not a SQuAD-format file"):
        read_squad(path)
    with pytest.raises(InputError, match="missing.json: no such file"):
        read_squad(tmp_path / "missing.json")


def test_real_cmrc_off_by_one_starts_repaired():
    examples, report = read_squad(CMRC_OFFSETS)
    assert len(examples) == 5 and len(report.repaired) == 5 and not report.skipped
    assert all(new == old - 1 for _, old, new in report.repaired)
    assert all(e.context[a.start : a.start + len(a.text)] == a.text for e in examples for a in e.answers)


def test_squad_v2_fixture():
    examples, report = read_squad(SQUAD_V2_SAMPLE)
    assert len(examples) == 6 and sum(e.is_impossible for e in examples) == 2 and not report.skipped


def test_prediction_input(tmp_path):
    examples = read_questions_jsonl(QUESTIONS)
    assert [e.id for e in examples] == ["a", "2"] and examples[1].question.startswith("乍都节")
    bad = tmp_path / "in.jsonl"
    bad.write_text('{"question": "q", "context": "c"}\n\n{"question": "q"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"in.jsonl:3: missing 'context'"):
        read_questions_jsonl(bad)
    bad.write_text('{"question": "q", "context": "c"}\n{oops\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"in.jsonl:2: not valid JSON"):
        read_questions_jsonl(bad)


def test_predict_input_errors_name_file_and_line(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_bytes(b'{"question": "a?", "context": "b"}\n{"question": "\xff?", "context": "b"}\n')
    with pytest.raises(InputError, match=r"questions.jsonl:2: invalid UTF-8 at byte 14 of the line"):
        read_questions_jsonl(path)
    path.write_text('{"question": "a?", "context": "b"}\n\n["a?", "b"]\n', encoding="utf-8")
    with pytest.raises(
        InputError, match=r"questions.jsonl:3: expected a JSON object with question and context, got list"
    ):
        read_questions_jsonl(path)
    path.write_text(
        '\ufeff{"question": "a?", "context": "b\u2028c"}\n', encoding="utf-8"
    )  # BOM dropped; U+2028 is text
    (example,) = read_questions_jsonl(path)
    assert example.question == "a?" and example.context == "b\u2028c" and example.id == "1"


def test_a_squad_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'\xef\xbb\xbf{"data": [\n  {"title": "x"},\n  {"title": "\xff"}\n]}')
    with pytest.raises(InputError, match=r"bad.json:3: not UTF-8 text \(invalid start byte at byte 45\)"):
        read_squad(path)


def test_a_question_without_an_id_or_with_a_null_one_is_numbered_by_its_line(tmp_path):
    from spanlm.qa.data import read_questions_jsonl

    path = tmp_path / "q.jsonl"
    path.write_text(
        '{"question": "Who?", "context": "Holmes."}\n{"id": null, "question": "Who?", "context": "x"}\n'
        '{"id": 7, "question": "Who?", "context": "x"}\n',
        encoding="utf-8",
    )
    assert [example.id for example in read_questions_jsonl(path)] == ["1", "2", "7"]
