"""Fixtures of the training-engine tests."""

from pathlib import Path

import pytest

from helpers import EMBEDDED_CORPUS
from spanlm.config import from_dict
from spanlm.data.prepare import prepare
from spanlm.pretrain.recipe import Recipe


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    """Alice in Wonderland prepared once per session (vocab 500); tests read it, and one that changes it copies
    it first."""
    out = tmp_path_factory.mktemp("toy") / "prepared"
    recipe = from_dict(
        Recipe,
        {
            "data": {"inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")], "prepared_dir": str(out)},
            "tokenizer": {"vocab_size": 500},
        },
    )
    return prepare(recipe, log=lambda *_: None)
