"""The README's Python examples run as written (after the commands they depend on)."""

import re

from helpers import REPO
from spanlm.cli import main


def test_readme_python_examples_run(tmp_path, monkeypatch, capsys):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    examples = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert examples
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(REPO / "data")
    assert main(["prepare", str(REPO / "configs/prepare/english.yaml"), "tokenizer.vocab_size=2000"]) == 0
    for code in examples:
        exec(compile(code, "README.md", "exec"), {})
    assert "(8, " in capsys.readouterr().out
