"""docs/huggingface.md's "`datasets` inputs" snippets run as written, offline: the Hub datasets they name are small
stand-ins put into the datasets cache as an online load leaves it, and the NER run is made tiny."""

import json
import shlex

import datasets

from helpers import (
    ENGLISH,
    NER_FIXTURES,
    REPO,
    TINY_NER_TRAIN,
    WNUT_TAGS,
    cache_like_the_hub,
    conll_dataset,
    doc_section,
)
from spanlm.cli import main
from spanlm.data.shards import read_meta

PAGE = "docs/huggingface.md"

TINY = {  # appended to the guide's commands
    ("prepare",): ["tokenizer.vocab_size=500"],
    ("ner", "train"): TINY_NER_TRAIN,
    ("ner", "eval"): [],
}


def commands(block: str):
    """(environment assignments, arguments after `spanlm`) of every command in a bash block."""
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        environment = {}
        while words[0] != "spanlm":
            name, _, value = words.pop(0).partition("=")
            environment[name] = value
        yield environment, words[1:]


def test_the_datasets_inputs_snippets_run(tiny_encoder_dir, offline_datasets_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "runs" / "export").mkdir(parents=True)
    (tmp_path / "runs" / "export" / "spanbert").symlink_to(tiny_encoder_dir)
    lines = [line for line in ENGLISH.splitlines() if line]
    cache_like_the_hub(
        tmp_path / "hub",
        "Salesforce/wikitext",
        {
            "train": datasets.Dataset.from_dict({"text": ["", *lines]}),
            "validation": datasets.Dataset.from_dict({"text": lines[:1]}),
        },
        config="wikitext-2-raw-v1",
    )
    train, dev = (conll_dataset(NER_FIXTURES / f"wnut_{name}_mini.conll", WNUT_TAGS) for name in ("train", "dev"))
    cache_like_the_hub(
        tmp_path / "hub", "leondz/wnut_17", {"train": train, "validation": dev, "test": dev}, config="wnut_17"
    )

    python_blocks = doc_section(PAGE, "`datasets` inputs")
    bash_blocks = doc_section(PAGE, "`datasets` inputs", language="bash")
    assert len(python_blocks) == 1 and len(bash_blocks) == 2
    exec(compile(python_blocks[0], PAGE, "exec"), {})
    for block in bash_blocks:
        for environment, argv in commands(block):
            assert environment in ({}, {"HF_HUB_OFFLINE": "1"})  # the fixture has the Hub offline already
            extra = TINY[tuple(argv[:2]) if argv[0] == "ner" else tuple(argv[:1])]
            assert main([*argv, *extra]) == 0, capsys.readouterr().err

    assert read_meta(tmp_path / "runs/prepared/my_texts")["n_documents"] == 2
    wikitext = read_meta(tmp_path / "runs/prepared/wikitext-2")
    assert wikitext["n_documents"] == len(lines) and wikitext["inputs"] == [
        "hf:Salesforce/wikitext:wikitext-2-raw-v1 (split train)"
    ]
    trained = json.loads((tmp_path / "runs/ner/wnut17/eval.json").read_text())
    assert trained["data"] == "hf:leondz/wnut_17@refs/convert/parquet" and trained["micro"]["n_gold"] == 39
    tested = json.loads((tmp_path / "runs/ner/wnut17/model/eval-wnut_17-test.json").read_text())
    assert (
        tested["micro"] == trained["micro"] and tested["file"] == "hf:leondz/wnut_17@refs/convert/parquet (split test)"
    )
