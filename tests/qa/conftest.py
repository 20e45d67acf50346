"""QA fixtures: the fixture files and a tiny BERT whose WordPiece vocabulary covers their characters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qa"


def fixture_texts() -> list[str]:
    texts = []
    for name in ("cmrc2018_sample.json", "cmrc2018_offsets.json", "squad_v2_sample.json"):
        path = FIXTURES / name
        for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
            for paragraph in article["paragraphs"]:
                texts.append(paragraph["context"])
                texts.extend(question["question"] for question in paragraph["qas"])
    return texts


@pytest.fixture(scope="session")
def qa_fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def qa_encoder_dir(tmp_path_factory) -> Path:
    """A tiny BERT (hidden 64, 2 layers, 128 positions) with a WordPiece trained on the fixtures."""
    import torch
    from transformers import BertConfig, BertModel

    from spanlm.data.tokenizer import TokenizerConfig, train_tokenizer

    tokenizer = train_tokenizer(fixture_texts(), TokenizerConfig(vocab_size=600, min_frequency=1))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    out = tmp_path_factory.mktemp("qa_encoder")
    BertModel(config, add_pooling_layer=False).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def qa_tokenizer(qa_encoder_dir):
    from spanlm.models.hf_model import load_fast_tokenizer

    return load_fast_tokenizer(qa_encoder_dir)
