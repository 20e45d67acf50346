"""The readers: every GLUE TSV and CLUE JSON-lines layout, generic JSONL / CSV, 🤗 datasets, and their errors."""

from __future__ import annotations

import json

import pytest

from helpers import REPO
from spanlm.cls.config import ClsDataConfig
from spanlm.cls.data import check_labels, label_set, read_examples, read_texts
from spanlm.errors import InputError

DATA = REPO / "data" / "cls"

BOM = "\ufeff"
GLUE = {
    # task: (file text, expected (text, pair, label) of the first example)
    "sst2": ('sentence\tlabel\nit \'s a "charming" journey \t1\n', ('it \'s a "charming" journey', None, "1")),
    "cola": (
        "gj04\t1\t\tOur friends won't buy this.\ngj04\t0\t*\tThey drank the pub.",
        ("Our friends won't buy this.", None, "1"),
    ),
    "mrpc": (
        BOM + "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t702876\t702977\tHe called "the witness".\tReferring to him.\n',
        ('He called "the witness".', "Referring to him.", "1"),
    ),
    "rte": (
        "index\tsentence1\tsentence2\tlabel\n0\tNo WMD.\tWMD found.\tnot_entailment\n",
        ("No WMD.", "WMD found.", "not_entailment"),
    ),
    "stsb": (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane.\tAn air plane.\t5.000\n",
        ("A plane.", "An air plane.", 5.0),
    ),
    "qnli": ("index\tquestion\tsentence\tlabel\n0\tWhy?\tBecause.\tentailment\n", ("Why?", "Because.", "entailment")),
    "qqp": (
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n7\t1\t2\tHow old?\tWhat age?\t1\n",
        ("How old?", "What age?", "1"),
    ),
    "mnli": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
        "0\t1\t1n\tgov\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tA cat sat.\tA cat stood.\tneutral\tneutral\n",
        ("A cat sat.", "A cat stood.", "neutral"),
    ),
}


@pytest.mark.parametrize("task", sorted(GLUE))
def test_glue_layouts(task, tmp_path):
    text, first = GLUE[task]
    path = tmp_path / f"{task}.tsv"
    path.write_text(text, encoding="utf-8")
    examples = read_examples(str(path), ClsDataConfig(task=task), task == "stsb", "train", "data.train_split")
    assert (examples[0].text, examples[0].text_pair, examples[0].label) == first
    assert examples[0].where == f"{path}:{1 if task == 'cola' else 2}"


def test_embedded_glue_pieces_read_whole():
    sst2 = read_examples(str(DATA / "sst2/train.tsv"), ClsDataConfig(task="sst2"), False, "train", "s")
    cola = read_examples(str(DATA / "cola/dev.tsv"), ClsDataConfig(task="cola"), False, "train", "s")
    stsb = read_examples(str(DATA / "stsb/dev.tsv"), ClsDataConfig(task="stsb"), True, "train", "s")
    assert (len(sst2), len(cola), len(stsb)) == (500, 150, 100)
    assert label_set(sst2) == ["0", "1"] and all(0 <= e.label <= 5 for e in stsb)
    tnews = read_examples(str(DATA / "tnews/train.json"), ClsDataConfig(task="tnews"), False, "train", "s")
    assert len(tnews) == 500 and label_set(tnews)[0] == "100" and tnews[0].text_pair is None


def test_clue_pairs_leave_out_unagreed(tmp_path):
    path = tmp_path / "ocnli.json"
    rows = [
        {"sentence1": "一月份跟二月份肯定有一个月份有", "sentence2": "肯定有一个月份有", "label": "entailment"},
        {"sentence1": "甲", "sentence2": "乙", "label": "-"},
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    examples = read_examples(str(path), ClsDataConfig(task="ocnli"), False, "train", "s")
    assert [(e.text_pair, e.label) for e in examples] == [("肯定有一个月份有", "entailment")]


def test_generic_jsonl_csv_and_numeric_labels_sort_numerically(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('{"text": "a", "text_pair": "b", "label": 10}\n{"text": "c", "text_pair": "d", "label": 9}\n')
    data = ClsDataConfig(text_pair_field="text_pair")
    examples = read_examples(str(jsonl), data, False, "train", "s")
    assert [(e.text, e.text_pair, e.label) for e in examples] == [("a", "b", "10"), ("c", "d", "9")]
    assert label_set(examples) == ["9", "10"]
    csv_file = tmp_path / "a.csv"
    csv_file.write_text('text,label\n"hello, world",pos\nbye,neg\n')
    assert [(e.text, e.label) for e in read_examples(str(csv_file), ClsDataConfig(), False, "train", "s")] == [
        ("hello, world", "pos"),
        ("bye", "neg"),
    ]


def test_a_saved_dataset_reads_its_class_names(tmp_path):
    import datasets

    features = datasets.Features(
        {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
    )
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"sentence": ["good", "bad"], "label": [1, 0]}, features=features)}
    )
    splits.save_to_disk(str(tmp_path / "sst"))
    examples = read_examples(
        str(tmp_path / "sst"), ClsDataConfig(text_field="sentence"), False, "train", "data.train_split"
    )
    assert [(e.text, e.label) for e in examples] == [("good", "pos"), ("bad", "neg")]


@pytest.mark.parametrize(
    "task, text, regression, expected",
    [
        ("rte", "index\tsentence1\tlabel\n0\tA.\tentailment\n", False, ["rte.tsv:1", "no column 'sentence2'"]),
        ("rte", "index\tsentence1\tsentence2\tlabel\n0\tA.\n", False, ["rte.tsv:2", "no text pair", "column"]),
        ("stsb", GLUE["stsb"][0].replace("5.000", "high"), True, ["stsb.tsv:2", "'score'", "number", '"high"']),
        ("sst2", "sentence\tlabel\nfine\n", False, ["sst2.tsv:2", "no label", "'label'"]),
    ],
)
def test_bad_records_name_file_line_and_field(task, text, regression, expected, tmp_path):
    path = tmp_path / f"{task}.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as error:
        read_examples(str(path), ClsDataConfig(task=task), regression, "train", "s")
    for part in expected:
        assert part in str(error.value)


def test_a_pair_field_missing_from_a_record(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"text": "a", "text_pair": "b", "label": "1"}\n{"text": "c", "label": "0"}\n')
    with pytest.raises(InputError, match=r"pairs.jsonl:2: no text pair \(field 'text_pair'\)"):
        read_examples(str(path), ClsDataConfig(text_pair_field="text_pair"), False, "train", "s")


def test_an_unknown_label_is_named_with_its_line(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_text('{"text": "a", "label": "pos"}\n{"text": "b", "label": "meh"}\n')
    examples = read_examples(str(path), ClsDataConfig(), False, "train", "s")
    with pytest.raises(InputError, match=r"dev.jsonl:2: label 'meh' is not one of the run's labels \(neg, pos: "):
        check_labels(examples, ["neg", "pos"])


def test_prediction_inputs(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a", "text_pair": "b"}\n{"text": "c"}\n')
    assert [(e.text, e.text_pair, e.label) for e in read_texts(str(path))] == [("a", "b", None), ("c", None, None)]
    plain = tmp_path / "in.txt"
    plain.write_text("one\n\ntwo\n")
    assert [e.text for e in read_texts(str(plain))] == ["one", "two"]
