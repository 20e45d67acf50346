"""Hugging Face NER datasets (tokens + integer ner_tags with ClassLabel names, the Hub's wnut_17 / conll2003
layout) as NER input: the same documents as the CoNLL file they were built from, the format inferred,
bad ones named in one line, and `ner train` / `ner eval` on them."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from helpers import NER_FIXTURES, REPO, WNUT_TAGS, cache_like_the_hub, conll_dataset, write_wnut_recipe
from spanlm.cli import main
from spanlm.errors import InputError
from spanlm.ner.data import ReadOptions, guess_format, read_documents

WNUT = REPO / "data" / "ner" / "wnut17"


@pytest.fixture(scope="module")
def wnut_saved(tmp_path_factory) -> Path:
    """The embedded WNUT-17 train and dev files as one DatasetDict (train / validation), saved with save_to_disk."""
    path = tmp_path_factory.mktemp("wnut") / "wnut_17"
    datasets.DatasetDict(
        {
            "train": conll_dataset(WNUT / "train.conll", WNUT_TAGS),
            "validation": conll_dataset(WNUT / "dev.conll", WNUT_TAGS),
        }
    ).save_to_disk(str(path))
    return path


STRINGS = datasets.List(datasets.Value("string"))
X_TAGS = datasets.List(datasets.ClassLabel(names=["O", "B-x", "I-x"]))


def save(rows: dict, path: Path, **features) -> Path:
    """``rows`` as the train split of a saved DatasetDict; ``features`` by column (else inferred)."""
    dataset = datasets.Dataset.from_dict(rows, features=datasets.Features(features) if features else None)
    datasets.DatasetDict({"train": dataset}).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("split, conll", [("train", "train.conll"), ("validation", "dev.conll")])
def test_an_hf_dataset_reads_like_its_conll_file(wnut_saved, split, conll):
    from_conll, _ = read_documents(WNUT / conll, ReadOptions(format="conll"))
    from_dataset, report = read_documents(wnut_saved, ReadOptions(), split=split)  # the format inferred: hf
    assert from_dataset == from_conll and sum(len(d.entities) for d in from_dataset) > 800
    assert report.summary() == {
        "file": f"{wnut_saved} (split {split})",
        "records": len(from_conll),
        "skipped_records": 0,
    }


def test_bioes_names_are_read_as_bioes(tmp_path):
    path = NER_FIXTURES / "bioes_mini.conll"
    names = ["O", *sorted({line.split()[-1] for line in path.read_text().splitlines() if line.strip()} - {"O"})]
    assert any(name.startswith("E-") for name in names)
    conll_dataset(path, names).save_to_disk(str(tmp_path / "bioes"))
    from_conll, _ = read_documents(path, ReadOptions(format="conll", tag_scheme="bioes"))
    from_dataset, _ = read_documents(tmp_path / "bioes", ReadOptions())  # a Dataset, not a dict: no split to choose
    assert from_dataset == from_conll and any(len(d.entities) > 1 for d in from_dataset)


def test_the_format_is_inferred_and_an_explicit_one_still_holds(wnut_saved):
    assert guess_format(wnut_saved) == guess_format("hf:wnut_17") == guess_format("hf:a/b@main:c:test") == "hf"
    assert guess_format(WNUT / "dev.conll") == "conll"
    explicit, _ = read_documents(wnut_saved, ReadOptions(format="hf"), split="validation")
    files_format, _ = read_documents(
        wnut_saved, ReadOptions(format="conll"), split="validation"
    )  # a recipe's, for its files
    assert explicit == files_format == read_documents(WNUT / "dev.conll", ReadOptions())[0]
    with pytest.raises(InputError, match="dev.conll: not a readable save_to_disk dataset"):
        read_documents(WNUT / "dev.conll", ReadOptions(format="hf"))


def test_a_dataset_without_the_tokens_column_is_named_with_its_columns(tmp_path):
    words = save(
        {"words": [["Holmes", "smiled"]], "ner_tags": [[1, 0]]}, tmp_path / "words", words=STRINGS, ner_tags=X_TAGS
    )
    with pytest.raises(InputError) as error:
        read_documents(words, ReadOptions())
    assert str(error.value) == (
        f"{words} (split train): no column 'tokens' (has: words, ner_tags); set data.tokens_field / data.tags_field"
    )
    (document,), _ = read_documents(words, ReadOptions(tokens_field="words"))
    assert document.text == "Holmes smiled" and [(e.start, e.end, e.label) for e in document.entities] == [(0, 6, "x")]


def test_columns_of_the_wrong_kind_and_unknown_splits(tmp_path):
    def error_of(path, **options) -> str:
        with pytest.raises(InputError) as error:
            read_documents(path, ReadOptions(**options))
        return str(error.value)

    unnamed = save({"tokens": [["a"]], "ner_tags": [[1]]}, tmp_path / "unnamed")
    assert error_of(unnamed) == (
        f"{unnamed} (split train): column 'ner_tags' holds List(Value('int64')), not lists of "
        "ClassLabel tags (integers with names); set data.tags_field"
    )
    pos = save(
        {"tokens": [["a"]], "pos_tags": [[0]]},
        tmp_path / "pos",
        tokens=STRINGS,
        pos_tags=datasets.List(datasets.ClassLabel(names=["NN", "VB"])),
    )
    assert (
        error_of(pos, tags_field="pos_tags")
        == f"{pos} (split train): column 'pos_tags' has ClassLabel names that are not BIO / BIOES tags: 'NN', 'VB'"
    )
    text = save(
        {"tokens": ["a b"], "ner_tags": [[1, 0]]}, tmp_path / "text", tokens=datasets.Value("string"), ner_tags=X_TAGS
    )
    assert (
        error_of(text)
        == f"{text} (split train): column 'tokens' holds Value('string'), not lists of strings; set data.tokens_field"
    )
    good = save({"tokens": [["a"]], "ner_tags": [[1]]}, tmp_path / "good", tokens=STRINGS, ner_tags=X_TAGS)
    with pytest.raises(InputError) as error:
        read_documents(good, ReadOptions(), split="validation", split_setting="data.dev_split")
    assert str(error.value) == f"{good}: no split 'validation' (has: train); set data.dev_split"


def test_malformed_rows_stop_reading_or_are_skipped(tmp_path):
    rows = {
        "tokens": [["Holmes", "met", "Watson"], ["in", "London"], ["a", "b"], ["unlabelled"]],
        "ner_tags": [[1, 0, 1], [0, 2], [1], [-1]],
    }  # ClassLabel's -1 is "no label"
    path = save(rows, tmp_path / "broken", tokens=STRINGS, ner_tags=X_TAGS)
    with pytest.raises(InputError) as error:
        read_documents(path, ReadOptions())
    assert str(error.value) == (
        f"{path} (split train) row 2: token 2: I-x does not continue an open x entity (BIO is broken) "
        "(on_bad_record: skip skips such records and counts them)"
    )
    documents, report = read_documents(path, ReadOptions(on_bad_record="skip"))
    assert [d.text for d in documents] == ["Holmes met Watson"]
    assert [(e.start, e.end) for e in documents[0].entities] == [(0, 6), (11, 17)]
    assert [why for _, why in report.skipped] == [
        "token 2: I-x does not continue an open x entity (BIO is broken)",
        "2 tokens but 1 tags",
        "tag ids [-1] are not all in [0, 3)",
    ]
    assert [where for where, _ in report.skipped] == [f"{path} (split train) row {row}" for row in (2, 3, 4)]


@pytest.mark.slow
def test_ner_train_and_eval_on_hf_datasets(tiny_encoder_dir, offline_datasets_cache, tmp_path, capsys):
    """Train on a name from the datasets cache (offline), score on a save_to_disk directory, with a recipe
    made for CoNLL files (data.format: conll): a dataset is read as one whatever the files' format."""
    mini = {
        "train": conll_dataset(NER_FIXTURES / "wnut_train_mini.conll", WNUT_TAGS),
        "validation": conll_dataset(NER_FIXTURES / "wnut_dev_mini.conll", WNUT_TAGS),
    }
    cache_like_the_hub(tmp_path / "hub", "wnut_17", mini)
    saved = tmp_path / "wnut_saved"
    datasets.DatasetDict(mini).save_to_disk(str(saved))
    run = tmp_path / "run"
    recipe = write_wnut_recipe(tiny_encoder_dir, run, steps=4)
    assert main(["ner", "train", str(recipe), "data.train=hf:wnut_17", f"data.dev={saved}"]) == 0
    capsys.readouterr()
    assert json.loads((run / "model" / "labels.json").read_text()) == [
        "corporation",
        "creative-work",
        "group",
        "location",
        "person",
        "product",
    ]
    trained = json.loads((run / "eval.json").read_text())
    assert trained["data"] == str(saved) and trained["micro"]["n_gold"] == 39  # the CoNLL file's 39 entities

    assert main(["ner", "eval", str(run / "model"), "--data", "hf:wnut_17", "--split", "validation"]) == 0
    scores = json.loads((run / "model" / "eval-wnut_17-validation.json").read_text())
    assert (
        scores["micro"] == trained["micro"]
        and scores["file"] == "hf:wnut_17 (split validation)"
        and scores["records"] == 40
    )

    assert main(["ner", "eval", str(run / "model"), "--data", str(saved)]) == 2  # the default split, test, is not there
    error = capsys.readouterr().err  # after the model's loading progress
    assert error.endswith(f"\nspanlm ner: error: {saved}: no split 'test' (has: train, validation); set --split\n")
    assert "Traceback" not in error
