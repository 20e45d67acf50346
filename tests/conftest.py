"""Shared fixtures: small corpora prepared with spanlm itself."""

from __future__ import annotations

from pathlib import Path

import pytest

import helpers
from spanlm.config import from_dict
from spanlm.pretrain.recipe import Recipe


@pytest.fixture(scope="session")
def embedded_prepared(tmp_path_factory) -> Path:
    """The embedded English corpus prepared once per test session (WordPiece, vocab 2000)."""
    from spanlm.data.prepare import prepare

    out = tmp_path_factory.mktemp("embedded")
    recipe = from_dict(
        Recipe,
        {
            "data": {
                "inputs": helpers.EMBEDDED_INPUTS,
                "prepared_dir": str(out / "prepared"),
            },
            "tokenizer": {"vocab_size": 2000},
        },
    )
    return prepare(recipe, log=lambda *_: None)


@pytest.fixture(scope="session")
def tiny_encoder_dir(embedded_prepared, tmp_path_factory) -> Path:
    """A tiny BERT (hidden 32, 2 layers) with the embedded corpus's tokenizer, saved as a Hugging Face directory."""
    import torch

    from spanlm.data.shards import PreparedCorpus
    from spanlm.models import BackboneConfig, build_backbone

    corpus = PreparedCorpus(embedded_prepared)
    torch.manual_seed(0)
    model = build_backbone(
        BackboneConfig(
            family="bert", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=128
        ),
        corpus,
    )
    out = tmp_path_factory.mktemp("tiny_encoder")
    model.save_pretrained(str(out))
    corpus.tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture
def one_torch_thread():
    """:func:`helpers.one_torch_thread` around a test (``pytestmark = pytest.mark.usefixtures(...)``)."""
    with helpers.one_torch_thread():
        yield


@pytest.fixture
def offline_datasets_cache(tmp_path, monkeypatch) -> Path:
    """An empty `datasets` cache of this test's own, with the Hub offline: what HF_DATASETS_CACHE=… and
    HF_HUB_OFFLINE=1 set when datasets is imported (also exported, for subprocesses)."""
    import datasets
    import huggingface_hub.constants

    cache = tmp_path / "datasets_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache
