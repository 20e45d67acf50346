"""`spanlm prepare` on Hugging Face `datasets`: save_to_disk directories and hf: names (offline, from the
datasets cache), read like .jsonl records, reused until their rows change, bad ones named in one line."""

import json
import os
import shutil
import subprocess
import sys

import datasets
import numpy as np
import pytest

from helpers import ENGLISH, cache_like_the_hub, make_recipe
from spanlm.data.corpus import CorpusReader, resolve_inputs
from spanlm.data.prepare import prepare
from spanlm.data.shards import PreparedCorpus, read_meta
from spanlm.errors import InputError

QUIET = {"log": lambda *_: None}
TEXTS = ["The first document.\nIts second line.", "A second document.", "Third one,\n\nwith a blank line inside."]


def units(recipe):
    return list(CorpusReader(resolve_inputs(recipe.data), recipe.data))


def recipe_for(tmp_path, inputs, **data):
    recipe = make_recipe(tmp_path, {}, data=data, tokenizer={"kind": "bpe"})  # byte-level BPE trains reproducibly
    recipe.data.inputs = [str(entry) for entry in inputs]
    return recipe


def save(rows: dict, path):
    datasets.Dataset.from_dict(rows).save_to_disk(str(path))
    return path


def test_a_saved_dataset_reads_like_the_same_records_in_jsonl(tmp_path):
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS), encoding="utf-8")
    saved = save({"text": TEXTS, "id": [1, 2, 3]}, tmp_path / "saved")
    from_dataset = units(recipe_for(tmp_path, [saved]))
    assert from_dataset == units(recipe_for(tmp_path, [jsonl]))
    assert [d for d, _ in from_dataset] == [0, 0, 1, 2, 2]  # one document per row

    # a glob matches save_to_disk directories too; another column is read with data.text_field
    save({"body": ["Elsewhere."]}, tmp_path / "saved_body")
    assert units(recipe_for(tmp_path, [tmp_path / "saved_b*"], text_field="body")) == [(0, "Elsewhere.")]


def test_prepare_from_a_saved_dataset_equals_prepare_from_jsonl(tmp_path):
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS * 3), encoding="utf-8")
    saved = save({"text": TEXTS * 3}, tmp_path / "saved")
    from_jsonl = PreparedCorpus(prepare(recipe_for(tmp_path / "a", [jsonl]), **QUIET))
    from_dataset = PreparedCorpus(prepare(recipe_for(tmp_path / "b", [saved]), **QUIET))
    assert np.array_equal(from_jsonl.ids, from_dataset.ids)
    assert np.array_equal(from_jsonl.document_offsets, from_dataset.document_offsets)
    assert from_dataset.meta["inputs"] == [str(saved)]


def test_a_dataset_dict_reads_the_split_named_by_data_split(tmp_path):
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["train text"]}),
            "validation": datasets.Dataset.from_dict({"text": ["validation text"]}),
        }
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    assert units(recipe_for(tmp_path, [tmp_path / "dict"])) == [(0, "train text")]
    assert units(recipe_for(tmp_path, [tmp_path / "dict"], split="validation")) == [(0, "validation text")]
    with pytest.raises(InputError) as error:
        units(recipe_for(tmp_path, [tmp_path / "dict"], split="test"))
    assert str(error.value) == f"{tmp_path / 'dict'}: no split 'test' (has: train, validation); set data.split"


def test_a_dataset_without_the_text_column_is_named_with_its_columns(tmp_path):
    saved = save({"body": ["x"], "id": [1]}, tmp_path / "saved")
    with pytest.raises(InputError) as error:
        units(recipe_for(tmp_path, [saved]))
    assert str(error.value) == f"{saved}: no column 'text' (has: body, id); set data.text_field"


def test_rows_without_text_stop_reading_or_are_skipped_and_counted(tmp_path):
    saved = save({"text": ["fine", None, "also fine"]}, tmp_path / "saved")
    with pytest.raises(InputError, match=rf"^{saved} row 2: no text in column 'text' \(set data.on_bad_line=skip"):
        units(recipe_for(tmp_path, [saved]))
    recipe = recipe_for(tmp_path, [saved], on_bad_line="skip")
    reader = CorpusReader(resolve_inputs(recipe.data), recipe.data)
    assert list(reader) == [(0, "fine"), (1, "also fine")] and reader.stats["bad_lines_skipped"] == 1


def test_a_saved_dataset_is_reused_until_its_rows_change(tmp_path):
    saved = save({"text": TEXTS}, tmp_path / "saved")
    recipe = recipe_for(tmp_path, [saved])
    messages = []
    first = read_meta(prepare(recipe, log=messages.append))
    prepare(recipe, log=messages.append)
    assert "up to date" in messages[-1]

    save({"text": TEXTS}, tmp_path / "saved")  # saved again: new files, the same bytes
    prepare(recipe, log=messages.append)
    assert "same bytes, reusing it" in messages[-1]
    shutil.move(tmp_path / "saved", tmp_path / "moved")  # moved: the same bytes too
    recipe.data.inputs = [str(tmp_path / "moved")]
    prepare(recipe, log=messages.append)
    assert "same bytes, reusing it" in messages[-1]

    save({"text": [*TEXTS, "A fourth document."]}, tmp_path / "moved")
    changed = read_meta(prepare(recipe, force=True, log=messages.append))  # a new tokenizer: replaced only when asked
    assert "reusing" not in messages[-1] and changed["n_documents"] == first["n_documents"] + 1
    assert changed["content_fingerprint"] != first["content_fingerprint"]


@pytest.fixture
def cached_wikitext(offline_datasets_cache, tmp_path):
    """A small `Salesforce/wikitext` (configuration wikitext-2-raw-v1) in the datasets cache, as an online load
    leaves it."""
    rows = {
        "train": [" = Holmes = ", " He examined the mechanism . ", "", " Watson wrote it down . "],
        "validation": [" The café owners did not care . "],
    }
    splits = {split: datasets.Dataset.from_dict({"text": texts}) for split, texts in rows.items()}
    return cache_like_the_hub(tmp_path / "hub", "Salesforce/wikitext", splits, config="wikitext-2-raw-v1"), rows


def test_a_dataset_name_loads_offline_from_the_datasets_cache(cached_wikitext, tmp_path):
    repo, rows = cached_wikitext
    train = [text.strip() for text in rows["train"] if text.strip()]
    assert [t for _, t in units(recipe_for(tmp_path, ["hf:Salesforce/wikitext:wikitext-2-raw-v1"]))] == train
    assert [t for _, t in units(recipe_for(tmp_path, ["hf:Salesforce/wikitext"]))] == train  # the cached configuration
    validation = [rows["validation"][0].strip()]
    by_setting = units(recipe_for(tmp_path, ["hf:Salesforce/wikitext:wikitext-2-raw-v1"], split="validation"))
    assert [t for _, t in by_setting] == validation
    assert [t for _, t in units(recipe_for(tmp_path, ["hf:Salesforce/wikitext::validation"]))] == validation
    assert [t for _, t in units(recipe_for(tmp_path, ["hf:Salesforce/wikitext:wikitext-2-raw-v1:train[:2]"]))] == train[
        :2
    ]
    assert [t for _, t in units(recipe_for(tmp_path, ["hf:Salesforce/wikitext@main:wikitext-2-raw-v1"]))] == train
    assert [t for _, t in units(recipe_for(tmp_path, [f"hf:{repo}:wikitext-2-raw-v1"]))] == train  # a local repository


def test_a_dataset_name_is_reused_until_its_split_changes(cached_wikitext, tmp_path):
    recipe = recipe_for(tmp_path, ["hf:Salesforce/wikitext:wikitext-2-raw-v1"])
    messages = []
    whole = read_meta(prepare(recipe, log=messages.append))
    assert whole["inputs"] == ["hf:Salesforce/wikitext:wikitext-2-raw-v1 (split train)"]
    prepare(recipe, log=messages.append)
    assert "up to date" in messages[-1]
    recipe.data.inputs = ["hf:Salesforce/wikitext:wikitext-2-raw-v1:train[:2]"]  # the same Arrow file, fewer rows
    part = read_meta(prepare(recipe, force=True, log=messages.append))  # a new tokenizer: replaced only when asked
    assert "reusing" not in messages[-1] and part["n_sentences"] == 2 < whole["n_sentences"]


OFFLINE = (
    "offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and 'someone/absent' is not in the local datasets "
    "cache ({cache}); load it once online, or give a save_to_disk directory"
)
CHOICES = "(the configuration comes from hf:NAME:CONFIG, the split from hf:NAME:CONFIG:SPLIT or data.split)"


@pytest.mark.parametrize(
    "entry, message",
    [
        ("hf:someone/absent", OFFLINE),
        (
            "hf:Salesforce/wikitext:wikitext-2-raw-v1:test",
            f"Unknown split \"test\". Should be one of ['train', 'validation']. {CHOICES}",
        ),
        (
            "hf:Salesforce/wikitext:wikitext-103-raw-v1",
            "Couldn't find cache for Salesforce/wikitext for config 'wikitext-103-raw-v1'; "
            f"Available configs in the cache: ['wikitext-2-raw-v1'] {CHOICES}",
        ),
        ("hf:", "no dataset name (hf:NAME[@REVISION][:CONFIG][:SPLIT])"),
        (
            "hf:{tmp}/no/such/dir",
            "cannot load '{tmp}/no/such/dir' with datasets.load_dataset: Couldn't find any data file at "
            "{tmp}/no/such/dir.",
        ),
        (
            "hf:{tmp}/legacy",
            "cannot load '{tmp}/legacy' with datasets.load_dataset: Dataset scripts are no longer supported, "
            "but found legacy.py (a Hub dataset with a loading script may load from its Parquet export: "
            "hf:NAME@refs/convert/parquet)",
        ),
    ],
)
def test_a_dataset_name_that_cannot_be_loaded_is_one_line(
    cached_wikitext, offline_datasets_cache, tmp_path, entry, message
):
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "legacy.py").write_text("# a dataset loading script\n")
    entry = entry.format(tmp=tmp_path)
    with pytest.raises(InputError) as error:
        resolve_inputs(recipe_for(tmp_path, [entry]).data)
    assert str(error.value) == f"{entry}: " + message.format(cache=offline_datasets_cache, tmp=tmp_path)


@pytest.mark.slow
def test_the_cli_reads_the_offline_variables(cached_wikitext, offline_datasets_cache, tmp_path):
    """`spanlm prepare` in its own process: HF_DATASETS_OFFLINE=1 loads from HF_DATASETS_CACHE; a name
    not there is one line on stderr, exit code 2, and the prepared directory is left as it was."""
    environment = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    environment.pop("HF_HUB_OFFLINE")
    (tmp_path / "recipe.yaml").write_text(
        f"data: {{prepared_dir: {tmp_path / 'prepared'}}}\n"
        "tokenizer: {kind: bpe, vocab_size: 300, min_frequency: 1}\n",
        encoding="utf-8",
    )

    def spanlm_prepare(entry):
        command = [sys.executable, "-m", "spanlm", "prepare", str(tmp_path / "recipe.yaml"), f"data.inputs=[{entry}]"]
        return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)

    done = spanlm_prepare("hf:Salesforce/wikitext:wikitext-2-raw-v1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["n_documents"] == 3
    before = read_meta(tmp_path / "prepared")
    failed = spanlm_prepare("hf:someone/absent")
    assert failed.returncode == 2 and failed.stdout == ""
    message = OFFLINE.format(cache=offline_datasets_cache)
    assert failed.stderr.strip().splitlines() == [f"spanlm prepare: error: hf:someone/absent: {message}"]
    assert read_meta(tmp_path / "prepared") == before


def test_file_inputs_keep_their_fingerprint(tmp_path):
    """data.split only chooses a dataset's split: a corpus of files prepared before it existed is reused."""
    recipe = make_recipe(tmp_path, {"a.txt": ENGLISH})
    messages = []
    prepare(recipe, log=messages.append)
    recipe.data.split = "validation"
    prepare(recipe, log=messages.append)
    assert "up to date" in messages[-1]
