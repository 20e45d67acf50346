"""The README's first run works as written (each command made tiny), and the guides' Python examples run after
it, on what it made: docs/pretrain.md's blocks and packed batches, docs/huggingface.md's loading of an export and
docs/ner.md's Python API."""

import json
import shlex

import pytest

from helpers import REPO, TINY_NER_TRAIN, TINY_RUN, doc_section
from spanlm.cli import main

TINY = {  # appended to the README's commands
    ("prepare",): ["tokenizer.vocab_size=2000"],
    ("pretrain",): TINY_RUN,
    ("report",): [],
    ("export",): [],
    ("ner", "train"): TINY_NER_TRAIN,
    ("ner", "predict"): [],
}
# The sections whose Python blocks run after the README's commands, in this order.
EXAMPLES = [
    ("docs/pretrain.md", "Pretraining blocks"),  # with its "Packed batches" subsection
    ("docs/huggingface.md", "Loading an export in transformers"),
    ("docs/ner.md", "From Python"),
]


@pytest.mark.slow
def test_readme_first_run_then_the_guides_python_examples(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(REPO / "data")
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (block,) = doc_section("README.md", "A first run", language="bash")
    ran = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "spanlm", line
        argv = words[1:]
        command = tuple(argv[:2]) if argv[0] == "ner" else tuple(argv[:1])
        assert main([*argv, *TINY[command]]) == 0, f"{line}\n{capsys.readouterr().err[-3000:]}"
        ran.append(command)
    assert ran == list(TINY)
    predicted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"id"')]
    assert [record["text"] for record in predicted] == ["Holmes took the train to London."]
    assert (tmp_path / "runs/pretrain/spanbert/report.html").is_file()
    assert (tmp_path / "runs/ner/wnut17/model/labels.json").is_file()

    # made tiny, the corpus is keyed by its smaller vocabulary; the examples name the recipe's own
    (tmp_path / "runs/prepared/english-wordpiece-8000").symlink_to(tmp_path / "runs/prepared/english-wordpiece-2000")
    namespace = {}
    for page, title in EXAMPLES:
        for code in doc_section(page, title):
            exec(compile(code, page, "exec"), namespace)
    printed = capsys.readouterr().out
    assert "(8, " in printed  # the blocks example
    assert "padded (16, " in printed and "packed (1, " in printed  # the packed batches example
    assert namespace["hidden"].shape[-1] == 32  # the transformers example
    assert "'f1': " in printed and (tmp_path / "runs/ner/wnut17-api/model/labels.json").is_file()  # the NER example
