"""What the two training-step benchmarks (train_step.py on CPU, train_step_gpu.py) share: their per-length
options and their books as one-document inputs."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path


def per_seq(text: str, seqs: list[int], flag: str, script: str) -> list[int]:
    """``--steps 16,6`` and the like: one value for every length of ``seqs``, or one per length."""
    values = [int(v) for v in text.split(",")]
    if len(values) == 1:
        values = values * len(seqs)
    if len(values) < len(seqs):
        sys.exit(f"{script}: {flag} needs one value or one per --seqs entry")
    return values[: len(seqs)]


def book_inputs(root: Path, out_dir: Path, script: str, skip: Callable[[Path], bool] = lambda path: False) -> list[str]:
    """Every *.txt under ``root`` (LICENSE files and those ``skip`` names left out) as a one-record .jsonl in
    ``out_dir``: one book = one document. A file is rewritten only when its text changed, so that prepare
    (which fingerprints its inputs' size and time) reuses its shards."""
    files = sorted(p for p in root.rglob("*.txt") if not p.name.upper().startswith("LICENSE") and not skip(p))
    if not files:
        sys.exit(f"{script}: no .txt files under {root}")
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = []
    for path in files:
        record = json.dumps({"text": path.read_text(encoding="utf-8-sig")}, ensure_ascii=False) + "\n"
        out = out_dir / f"{path.parent.name}-{path.stem}.jsonl"
        if not out.is_file() or out.read_text(encoding="utf-8") != record:
            out.write_text(record, encoding="utf-8")
        inputs.append(str(out))
    return inputs
