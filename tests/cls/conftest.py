"""cls fixtures: the embedded GLUE / CLUE pieces and tiny encoders of every family whose WordPiece covers them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO

DATA = REPO / "data" / "cls"


def fixture_texts() -> list[str]:
    texts = []
    for name in ("sst2/train.tsv", "cola/train.tsv", "stsb/train.tsv", "sst2/dev.tsv", "stsb/dev.tsv"):
        for line in (DATA / name).read_text(encoding="utf-8").splitlines():
            texts.extend(cell for cell in line.split("\t") if len(cell) > 12)
    for name in ("tnews/train.json", "tnews/dev.json"):
        texts.extend(json.loads(line)["sentence"] for line in (DATA / name).read_text(encoding="utf-8").splitlines())
    return texts


@pytest.fixture(scope="session")
def cls_tokenizer_dir(tmp_path_factory) -> Path:
    from spanlm.data.tokenizer import TokenizerConfig, train_tokenizer

    tokenizer = train_tokenizer(fixture_texts(), TokenizerConfig(vocab_size=2000, min_frequency=1))
    out = tmp_path_factory.mktemp("cls_tokenizer")
    tokenizer.save_pretrained(str(out))
    return out


def model_config(family: str, tokenizer):
    """A tiny config of ``family`` (hidden 32, 2 layers) for ``tokenizer``, built with transformers' own classes."""
    import transformers

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=160,
        pad_token_id=tokenizer.pad_token_id,
    )
    if family == "bert":
        return transformers.BertConfig(**common)
    if family == "roberta":
        return transformers.RobertaConfig(**common)
    if family == "electra":
        return transformers.ElectraConfig(embedding_size=32, **common)
    if family == "deberta-v2":
        return transformers.DebertaV2Config(relative_attention=True, pos_att_type=["p2c", "c2p"], **common)
    ids = dict(bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    if family == "modernbert":
        return transformers.ModernBertConfig(
            classifier_pooling="mean",
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            global_attn_every_n_layers=1,
            **ids,
            **common,
        )
    if family == "eurobert":
        return transformers.EuroBertConfig(classifier_pooling="late", **ids, **common)
    raise ValueError(family)


def make_encoder(family: str, tokenizer_dir: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(0)
    AutoModel.from_config(model_config(family, tokenizer)).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def cls_encoder_dir(cls_tokenizer_dir, tmp_path_factory) -> Path:
    """A tiny BERT with a WordPiece trained on the embedded GLUE / TNEWS pieces."""
    return make_encoder("bert", cls_tokenizer_dir, tmp_path_factory.mktemp("cls_bert"))


@pytest.fixture(scope="session")
def make_cls_encoder(cls_tokenizer_dir):
    """``make(family, out)``: a tiny encoder of ``family`` with the cls tokenizer, saved in ``out``."""
    return lambda family, out: make_encoder(family, cls_tokenizer_dir, out)
