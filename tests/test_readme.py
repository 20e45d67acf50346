"""The README's Python examples run as written (after the commands they depend on, in small form)."""

import re

import pytest

from helpers import REPO, copy_of


@pytest.mark.slow
def test_readme_python_examples_run(readme_runs, tmp_path, monkeypatch, capsys):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    readme = readme.split("## With Hugging Face\n")[0] + "## Development" + readme.split("\n## Development")[1]
    examples = re.findall(r"```python\n(.*?)```", readme, flags=re.S)  # the HF section's run in their own tests
    assert len(examples) >= 3
    # where the commands the examples rely on ran, as the README gives them (made tiny): conftest's readme_runs
    work = copy_of(readme_runs, tmp_path / "work")
    monkeypatch.chdir(work)
    # made tiny, the corpus is keyed by its smaller vocabulary; the examples name the recipe's own
    (work / "runs/prepared/english-wordpiece-8000").symlink_to(work / "runs/prepared/english-wordpiece-2000")
    namespace = {}
    for code in examples:
        exec(compile(code, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "(8, " in printed  # the blocks example
    assert namespace["hidden"].shape[-1] == 32  # the transformers example
    assert "'f1': " in printed and (work / "runs/ner/wnut17-api/model/labels.json").is_file()  # the NER example
