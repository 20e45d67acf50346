"""NER readers: every format into NerDocument, and every malformed-record kind in skip and error mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spanlm.errors import InputError
from spanlm.ner.data import (
    Entity,
    NerDocument,
    ReadOptions,
    guess_format,
    label_set,
    read_documents,
    read_texts,
    tags_to_spans,
    write_jsonl,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ner"


def surfaces(document: NerDocument) -> list[tuple[str, str]]:
    return [(e.label, document.text[e.start : e.end]) for e in document.entities]


def test_cluener_inclusive_ends_become_exclusive():
    documents, report = read_documents(FIXTURES / "cluener_mini.json", ReadOptions(format="cluener"))
    assert report.summary() == {"file": str(FIXTURES / "cluener_mini.json"), "records": 6, "skipped_records": 0}
    first = documents[0]
    assert first.text.startswith("李明在北京大学")
    assert surfaces(first) == [("name", "李明"), ("organization", "北京大学"), ("book", "三体")]
    assert ("company", "ＡＢＣ公司") in surfaces(documents[2])
    assert documents[5].entities == []  # a line without "label" (like CLUENER's test file)
    assert label_set(documents) == ["address", "book", "company", "game", "name", "organization", "position"]


def test_conll_bio_rebuilds_text_with_single_spaces():
    documents, _ = read_documents(FIXTURES / "wnut_train_mini.conll", ReadOptions(format="conll"))
    assert len(documents) == 80  # lone-tab separator lines split sentences like blank ones
    first = documents[0]
    assert first.text.startswith("@paulwalk It 's the view from")
    assert "  " not in first.text
    assert surfaces(first) == [("location", "Empire State Building"), ("location", "ESB")]


def test_conll_bioes_documents_and_sentences():
    sentences, _ = read_documents(FIXTURES / "bioes_mini.conll", ReadOptions(format="conll", tag_scheme="bioes"))
    assert [d.text for d in sentences] == [
        "John Smith visited New York City .",
        "The United Nations Council met .",
        "Paris again .",
    ]
    assert surfaces(sentences[0]) == [("PER", "John"), ("LOC", "New York")]
    assert surfaces(sentences[1]) == [("ORG", "United Nations Council")]
    documents, report = read_documents(
        FIXTURES / "bioes_mini.conll", ReadOptions(format="conll", tag_scheme="bioes", conll_unit="document")
    )
    assert len(documents) == 2 and report.records == 2
    assert documents[0].text == "John Smith visited New York City . The United Nations Council met ."
    assert surfaces(documents[0])[-1] == ("ORG", "United Nations Council")


def test_conll_two_tag_columns_are_nested_levels():
    documents, _ = read_documents(FIXTURES / "germeval_mini.iob2", ReadOptions(format="conll", tag_columns=[1, 2]))
    nested = [
        d
        for d in documents
        if any(a != b and a.start <= b.start and b.end <= a.end for a in d.entities for b in d.entities)
    ]
    assert len(nested) == 3  # the three sentences with inner entities
    outer_only, _ = read_documents(FIXTURES / "germeval_mini.iob2", ReadOptions(format="conll", tag_columns=[1]))
    assert sum(len(d.entities) for d in outer_only) < sum(len(d.entities) for d in documents)


def test_nested_jsonlines_genia():
    documents, _ = read_documents(FIXTURES / "genia_mini.jsonlines", ReadOptions(format="nested_jsonl"))
    assert documents[0].id == "MEDLINE:93061407-0"
    assert surfaces(documents[0]) == [("DNA", "c-fos"), ("DNA", "c-jun"), ("DNA", "jun B")]
    second = documents[1]
    spans = {(e.label, second.text[e.start : e.end]) for e in second.entities}
    assert ("cell_line", "phytohemagglutinin ( PHA ) activated peripheral blood lymphocytes") in spans
    assert ("protein", "PHA") in spans  # nested inside the cell_line mention


def test_jsonl_round_trip(tmp_path):
    documents, _ = read_documents(FIXTURES / "cluener_mini.json", ReadOptions(format="cluener"))
    write_jsonl(tmp_path / "out.jsonl", documents)
    again, _ = read_documents(tmp_path / "out.jsonl", ReadOptions(format="jsonl"))
    assert again == documents


def test_guess_format():
    assert guess_format("a/dev.json") == "cluener"
    assert guess_format("a/dev.jsonlines") == "nested_jsonl"
    assert guess_format("x.conll") == "conll" and guess_format("x.jsonl") == "jsonl"
    with pytest.raises(InputError, match="suffix"):
        guess_format("x.xml")


@pytest.mark.parametrize(
    "tags, scheme, spans",
    [
        (["B-A", "I-A", "O", "B-B"], "bio", [(0, 2, "A"), (3, 4, "B")]),
        (["B-A", "B-A", "I-A"], "bio", [(0, 1, "A"), (1, 3, "A")]),
        (["S-A", "B-B", "I-B", "E-B", "O"], "bioes", [(0, 1, "A"), (1, 4, "B")]),
        (["B-creative-work", "I-creative-work"], "bio", [(0, 2, "creative-work")]),
    ],
)
def test_tags_to_spans(tags, scheme, spans):
    assert tags_to_spans(tags, scheme) == spans


GOOD_CLUENER = '{"text": "华为发布了新手机", "label": {"company": {"华为": [[0, 1]]}}}'
GOOD_JSONL = '{"text": "Paris is big", "entities": [{"start": 0, "end": 5, "label": "LOC"}]}'
GOOD_NESTED = (
    '{"tokens": ["IL-2", "gene"], '
    '"entity_mentions": [{"start": 0, "end": 2, "entity_type": "DNA", "text": "IL-2 gene"}]}'
)

# (format, options, malformed record, words the problem names)
MALFORMED = {
    "broken json": ("jsonl", {}, '{"text": "Paris", "entities": [', "not valid JSON"),
    "not an object": ("jsonl", {}, '["Paris"]', "expected a JSON object"),
    "missing text": ("cluener", {}, '{"label": {}}', "missing field 'text'"),
    "cluener out of range": (
        "cluener",
        {},
        '{"text": "华为", "label": {"company": {"华为": [[0, 5]]}}}',
        "out of range",
    ),
    "cluener text mismatch": (
        "cluener",
        {},
        '{"text": "华为发布", "label": {"company": {"华为": [[1, 2]]}}}',
        "not '华为'",
    ),
    "jsonl out of range": (
        "jsonl",
        {},
        '{"text": "Paris", "entities": [{"start": 3, "end": 9, "label": "LOC"}]}',
        "out of range",
    ),
    "jsonl empty span": (
        "jsonl",
        {},
        '{"text": "Paris", "entities": [{"start": 3, "end": 3, "label": "LOC"}]}',
        "out of range",
    ),
    "jsonl text mismatch": (
        "jsonl",
        {},
        '{"text": "Paris", "entities": [{"start": 0, "end": 2, "label": "LOC", "text": "Pa!"}]}',
        "not 'Pa!'",
    ),
    "jsonl wrong type": (
        "jsonl",
        {},
        '{"text": "Paris", "entities": [{"start": "0", "end": 2, "label": "LOC"}]}',
        "must be int",
    ),
    "unknown label": (
        "jsonl",
        {"labels": ["LOC"]},
        '{"text": "Paris", "entities": [{"start": 0, "end": 5, "label": "PER"}]}',
        "unknown label 'PER'",
    ),
    "nested out of range": (
        "nested_jsonl",
        {},
        '{"tokens": ["a"], "entity_mentions": [{"start": 0, "end": 2, "entity_type": "DNA"}]}',
        "out of range",
    ),
    "nested text mismatch": (
        "nested_jsonl",
        {},
        '{"tokens": ["a", "b"], "entity_mentions": [{"start": 0, "end": 1, "entity_type": "DNA", "text": "b"}]}',
        "not 'b'",
    ),
}
GOOD = {"jsonl": GOOD_JSONL, "cluener": GOOD_CLUENER, "nested_jsonl": GOOD_NESTED}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_json_records(tmp_path, kind):
    fmt, options, bad, problem = MALFORMED[kind]
    path = tmp_path / "data.txt"
    path.write_text(GOOD[fmt] + "\n\n" + bad + "\n" + GOOD[fmt] + "\n", encoding="utf-8")
    if options.get("labels") is not None:  # the good record must fit the label set
        path.write_text(GOOD_JSONL + "\n\n" + bad + "\n" + GOOD_JSONL + "\n", encoding="utf-8")
    with pytest.raises(InputError) as error:
        read_documents(path, ReadOptions(format=fmt, **options))
    assert f"{path}:3: " in str(error.value) and problem in str(error.value)
    documents, report = read_documents(path, ReadOptions(format=fmt, on_bad_record="skip", **options))
    assert len(documents) == 2 and report.records == 3
    assert len(report.skipped) == 1 and report.skipped[0][0] == f"{path}:3" and problem in report.skipped[0][1]
    assert f"{path}:3: " in report.lines()[0]


CONLL_MALFORMED = {  # (scheme, sentence, problem, the line at fault: the sentence starts on line 4)
    "I without B": ("bio", "a O\nb I-X\n", "does not continue", 5),
    "I after another type": ("bio", "a B-Y\nb I-X\n", "does not continue", 5),
    "BIOES unclosed": ("bioes", "a B-X\nb O\n", "unclosed X", 5),
    "BIOES unclosed at the end": ("bioes", "a B-X\nb I-X\n", "unclosed X", 5),
    "E in BIO": ("bio", "a E-X\n", "not a BIO tag", 4),
    "bad tag": ("bio", "a PER\n", "not a BIO tag", 4),
    "too few columns": ("bio", "a O\nb\n", "column(s)", 5),
    "invalid UTF-8": ("bio", "a O\nb O\nc\udcff O\n", "invalid UTF-8", 6),
}


@pytest.mark.parametrize("kind", sorted(CONLL_MALFORMED))
def test_malformed_conll_sentences(tmp_path, kind):
    scheme, bad, problem, line = CONLL_MALFORMED[kind]
    good = "Paris S-LOC\nis O\n" if scheme == "bioes" else "Paris B-LOC\nis O\n"
    path = tmp_path / "data.conll"
    path.write_bytes((good + "\n" + bad + "\n" + good).encode("utf-8", "surrogateescape"))
    with pytest.raises(InputError) as error:
        read_documents(path, ReadOptions(format="conll", tag_scheme=scheme))
    assert f"{path}:{line}: " in str(error.value) and problem in str(error.value)
    documents, report = read_documents(path, ReadOptions(format="conll", tag_scheme=scheme, on_bad_record="skip"))
    assert [surfaces(d) for d in documents] == [[("LOC", "Paris")]] * 2
    assert report.skipped[0][0] == f"{path}:{line}" and problem in report.skipped[0][1]


def test_invalid_utf8_is_a_bad_record(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(GOOD_JSONL.encode() + b"\n" + b'{"text": "\xff"}\n')
    with pytest.raises(InputError, match=r"data.jsonl:2: invalid UTF-8"):
        read_documents(path, ReadOptions(format="jsonl"))
    documents, report = read_documents(path, ReadOptions(format="jsonl", on_bad_record="skip"))
    assert len(documents) == 1 and len(report.skipped) == 1


def test_missing_file():
    with pytest.raises(InputError, match="no such file"):
        read_documents("does/not/exist.json", ReadOptions(format="cluener"))


def test_entities_sorted_and_typed():
    documents, _ = read_documents(FIXTURES / "cluener_mini.json", ReadOptions(format="cluener"))
    for document in documents:
        assert document.entities == sorted(document.entities)
        assert all(isinstance(e, Entity) and 0 <= e.start < e.end <= len(document.text) for e in document.entities)
    assert json.loads((FIXTURES / "cluener_mini.json").read_text(encoding="utf-8").splitlines()[0])["label"][
        "name"
    ] == {"李明": [[0, 1]]}


def test_predict_texts_one_per_newline_line_and_jsonl_text_only(tmp_path):
    txt = tmp_path / "texts.txt"
    txt.write_bytes("Holmes met Watson\u2028in London .\r\n\nParis is nice\x0cindeed .\nthird\n".encode())
    documents = read_texts(txt)
    # Lines end at "\n" only: U+2028 and form feeds are text; blank lines are skipped, ids are line numbers.
    assert [(d.id, d.text) for d in documents] == [
        ("1", "Holmes met Watson\u2028in London ."),
        ("3", "Paris is nice\x0cindeed ."),
        ("4", "third"),
    ]
    txt.write_bytes(b"fine\nbad \xff\n")
    with pytest.raises(InputError, match=r"texts.txt:2: invalid UTF-8"):
        read_texts(txt)
    jsonl = tmp_path / "in.jsonl"
    # Gold entities in a predict input are not needed, so a broken one does not stop prediction.
    jsonl.write_text(
        '{"id": "a", "text": "Holmes met Watson", "entities": [{"start": 0, "end": 99, "label": "PER"}]}\n'
        '{"text": "Paris"}\n',
        encoding="utf-8",
    )
    assert [(d.id, d.text, d.entities) for d in read_texts(jsonl)] == [
        ("a", "Holmes met Watson", []),
        ("1", "Paris", []),
    ]
    jsonl.write_text('{"text": "Paris"}\n{"text": "  "}\n{"text": "Rome"}\n', encoding="utf-8")
    assert [d.text for d in read_texts(jsonl)] == ["Paris", "  ", "Rome"]  # one output line per record
    txt.write_bytes(b"\xef\xbb\xbfok \xff\n")  # a BOM: the byte is counted where it is in the file
    with pytest.raises(InputError, match=r"texts.txt:1: invalid UTF-8 at byte 6 of the line"):
        read_texts(txt)
    jsonl.write_text('{"text": "ok"}\n{"text": 3}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"in.jsonl:2: field 'text' must be str"):
        read_texts(jsonl)
    with pytest.raises(InputError, match=r"no such file"):
        read_texts(tmp_path / "missing.txt")
