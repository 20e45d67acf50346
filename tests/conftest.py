"""Shared fixtures: small corpora prepared with spanlm itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import EMBEDDED_CORPUS
from spanlm.config import Recipe, from_dict


@pytest.fixture(scope="session")
def embedded_prepared(tmp_path_factory) -> Path:
    """The embedded English corpus prepared once per test session (WordPiece, vocab 2000)."""
    from spanlm.data.prepare import prepare

    out = tmp_path_factory.mktemp("embedded")
    recipe = from_dict(Recipe, {
        "data": {"inputs": [str(p) for p in sorted(EMBEDDED_CORPUS.glob("*.txt")) if "hongloumeng" not in p.name],
                 "prepared_dir": str(out / "prepared")},
        "tokenizer": {"vocab_size": 2000},
    })
    return prepare(recipe, log=lambda *_: None)
