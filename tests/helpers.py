"""Test helpers (importable as `helpers`: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from spanlm.config import Recipe, from_dict

REPO = Path(__file__).resolve().parents[1]
EMBEDDED_CORPUS = REPO / "data" / "corpus"
NER_FIXTURES = REPO / "tests" / "fixtures" / "ner"

ENGLISH = (
    "The unbelievable backhanded compliment surprised everyone at the Bohemian embassy.\n"
    "Holmes examined the extraordinarily intricate mechanism without saying a word.\n"
    "\n"
    "Watson wrote everything down, although the handwriting was nearly unreadable.\n"
    "Dr. Frankenstein's laboratory smelled of ozone and impossibility.\n"
    "It's 3.14159 o'clock — naïve café owners don't care!\n"
)


def write_wnut_recipe(encoder_dir: Path, out: Path, steps: int) -> Path:
    """A `ner train` recipe of ``steps`` steps on the WNUT-17 fixtures into ``out``; written beside it."""
    recipe = out.parent / "recipe.yaml"
    recipe.write_text(f"""
model: {{path: {encoder_dir}}}
data: {{train: {NER_FIXTURES / 'wnut_train_mini.conll'}, dev: {NER_FIXTURES / 'wnut_dev_mini.conll'}, format: conll, max_len: 32, stride: 8}}
ner: {{head: {{head_size: 16}}}}
train: {{output_dir: {out}, max_steps: {steps}, batch_size: 8, lr: 0.001, warmup_steps: 0, eval_every: 3, save_every: {steps}, log_every: 3, num_workers: 0, device: cpu}}
logging: {{report_to: [], progress: false}}
""", encoding="utf-8")
    return recipe


@contextlib.contextmanager
def one_torch_thread():
    """Run the block on one intra-op thread, then restore the count.

    Tiny test models run fastest on one thread: on the shared, busy CI cores more threads oversubscribe
    them (a learning test took 10× longer with torch's default of one thread per core), and one thread
    also gives the same sums, so the same run, on every machine.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def make_recipe(tmp_path: Path, files: dict[str, str | bytes], **sections) -> Recipe:
    """Write ``files`` into ``tmp_path/in`` and return a recipe preparing them into ``tmp_path/prepared``."""
    inputs = []
    for name, content in files.items():
        path = tmp_path / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        inputs.append(str(path))
    data = {"inputs": inputs, "prepared_dir": str(tmp_path / "prepared"), **sections.pop("data", {})}
    tokenizer = {"vocab_size": 300, "min_frequency": 1, **sections.pop("tokenizer", {})}
    return from_dict(Recipe, {"data": data, "tokenizer": tokenizer, **sections})


def readme_section(title: str, language: str = "python") -> list[str]:
    """The ``language`` code blocks under the README heading ``title`` (up to the next heading of its level or above)."""
    import re

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    heading = re.search(rf"^(#+) {re.escape(title)}\n", readme, flags=re.M)
    if heading is None:
        raise AssertionError(f"README.md has no heading '{title}'")
    level = len(heading.group(1))
    rest = readme[heading.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, flags=re.M)
    body = rest[:end.start()] if end else rest
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)
