"""The README's Python examples run as written (after the commands they depend on, in small form)."""

import re

import pytest

from helpers import REPO, TINY_RUN
from spanlm.cli import main


@pytest.mark.slow
def test_readme_python_examples_run(tmp_path, monkeypatch, capsys):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    readme = readme.split("## With Hugging Face\n")[0] + "## Development" + readme.split("\n## Development")[1]
    examples = re.findall(r"```python\n(.*?)```", readme, flags=re.S)  # the HF section's run in their own tests
    assert len(examples) >= 3
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(REPO / "data")
    (tmp_path / "configs").symlink_to(REPO / "configs")
    # the commands the examples rely on, as the README gives them (made tiny)
    assert main(["prepare", str(REPO / "configs/prepare/english.yaml"), "tokenizer.vocab_size=2000"]) == 0
    assert main(["pretrain", str(REPO / "configs/pretrain/spanbert.yaml"), *TINY_RUN]) == 0
    assert main(["export", "runs/pretrain/spanbert", "--out", "runs/export/spanbert"]) == 0
    # made tiny, the corpus is keyed by its smaller vocabulary; the examples name the recipe's own
    (tmp_path / "runs/prepared/english-wordpiece-8000").symlink_to(tmp_path / "runs/prepared/english-wordpiece-2000")
    namespace = {}
    for code in examples:
        exec(compile(code, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "(8, " in printed  # the blocks example
    assert namespace["hidden"].shape[-1] == 32  # the transformers example
    assert "'f1': " in printed and (tmp_path / "runs/ner/wnut17-api/model/labels.json").is_file()  # the NER example
