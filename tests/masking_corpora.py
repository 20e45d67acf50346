"""Fixtures of the masking tests and the objective folders' masker tests (one pytest plugin, so each session
corpus is prepared once for both): small corpora prepared with spanlm itself, and hand-built batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import EMBEDDED_CORPUS
from spanlm.config import from_dict
from spanlm.data.blocks import BlockBatch, BlockDataset, collate_blocks
from spanlm.masking.base import Vocabulary
from spanlm.pretrain.recipe import Recipe

SPECIAL = (0, 1, 2, 3, 4)  # pad, unk, cls, sep, mask of the hand-built vocabulary
PAD, CLS, SEP, MASK_ID = 0, 2, 3, 4

# Synonyms for the Chinese corpus (Hongloumeng ch. 1-5): same-length pairs, one different-length one.
CHINESE_SYNONYMS = "宝玉\t黛玉\t凤姐\n太太\t老爷\n说道\t笑道\t问道\n姑娘\t丫头\t小姐们\n"

ENGLISH_DATA = {"similar_words": "word2vec", "similar_words_k": 5, "similar_words_min_count": 3}


def english_recipe_dict(prepared_dir: Path) -> dict:
    return {
        "data": {
            "inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")],
            "prepared_dir": str(prepared_dir),
            **ENGLISH_DATA,
        },
        "tokenizer": {"vocab_size": 1500},
    }


@pytest.fixture(scope="session")
def english(tmp_path_factory):
    """Alice in Wonderland, WordPiece 1500 (many multi-piece words), with a word2vec similar-word table."""
    from spanlm.data.prepare import prepare
    from spanlm.data.shards import PreparedCorpus

    recipe = from_dict(Recipe, english_recipe_dict(tmp_path_factory.mktemp("english") / "prepared"))
    return PreparedCorpus(prepare(recipe, log=lambda *_: None))


@pytest.fixture(scope="session")
def english_recipe(english) -> dict:
    """The recipe (as a dict) that prepared ``english``: ``prepare`` reuses its directory."""
    return english_recipe_dict(english.directory)


@pytest.fixture(scope="session")
def chinese(tmp_path_factory):
    """Hongloumeng ch. 1-5, per-character WordPiece, jieba words, a synonym-file similar-word table."""
    from spanlm.data.prepare import prepare
    from spanlm.data.shards import PreparedCorpus

    root = tmp_path_factory.mktemp("chinese")
    synonyms = root / "synonyms.tsv"
    synonyms.write_text(CHINESE_SYNONYMS, encoding="utf-8")
    recipe = from_dict(
        Recipe,
        {
            "data": {
                "inputs": [str(EMBEDDED_CORPUS / "hongloumeng_ch1-5.txt")],
                "prepared_dir": str(root / "prepared"),
                "words": "jieba",
                "similar_words": "synonyms",
                "similar_words_file": str(synonyms),
                "similar_words_min_count": 1,
            },
            "tokenizer": {"vocab_size": 3000, "min_frequency": 1},
        },
    )
    return PreparedCorpus(prepare(recipe, log=lambda *_: None))


def corpus_batches(
    corpus, max_len: int = 128, batch_size: int = 32, n_batches: int = 1, seed: int = 0
) -> list[BlockBatch]:
    """Batches of the corpus's blocks in a seeded order."""
    dataset = BlockDataset(corpus, max_len)
    order = np.random.default_rng(seed).permutation(len(dataset))
    pad = corpus.special_ids["pad"]
    return [
        collate_blocks([dataset[int(i)] for i in order[b * batch_size : (b + 1) * batch_size]], pad)
        for b in range(n_batches)
    ]


def single_piece_batch(
    rng: np.random.Generator, batch_size: int = 32, width: int = 512, vocab_size: int = 1000, lengths=None
) -> BlockBatch:
    """[CLS] w w … w [SEP] pad…: every token a word of its own; row lengths ``lengths`` (default full)."""
    lengths = np.full(batch_size, width) if lengths is None else np.asarray(lengths)
    attention = np.arange(width)[None, :] < lengths[:, None]
    ids = np.where(attention, rng.integers(len(SPECIAL), vocab_size, size=(batch_size, width)), PAD)
    ids[:, 0] = CLS
    ids[np.arange(batch_size), lengths - 1] = SEP
    special = ~attention
    special[:, 0] = True
    special[np.arange(batch_size), lengths - 1] = True
    return BlockBatch(input_ids=ids, word_starts=attention.copy(), attention_mask=attention, special_mask=special)


@pytest.fixture
def vocab() -> Vocabulary:
    """A 1000-id vocabulary whose ids 0-4 are special; unigram counts favour low ids."""
    counts = np.zeros(1000, dtype=np.int64)
    counts[:] = np.arange(1000, 0, -1)
    return Vocabulary(size=1000, mask_id=MASK_ID, special_ids=SPECIAL, token_counts=counts)


@pytest.fixture(scope="session")
def make_batch():
    """``make_batch(rng, batch_size, width, vocab_size, lengths)``: a hand-built single-piece-word batch."""
    return single_piece_batch


@pytest.fixture(scope="session")
def blocks():
    """``blocks(corpus, max_len, batch_size, n_batches, seed)``: collated batches of a prepared corpus."""
    return corpus_batches
