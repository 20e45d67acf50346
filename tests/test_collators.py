"""spanlm's maskers as collators over tokenizer features, and the SBO head on a stock transformers model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import EMBEDDED_CORPUS
from spanlm.collators import IGNORE_INDEX, MaskingCollator, count_tokens, tokenize_words
from spanlm.data.tokenizer import TokenizerConfig, train_tokenizer
from spanlm.data.words import encode_sentences
from spanlm.errors import ConfigError
from spanlm.masking.base import MaskingConfig, SpanConfig

LINES = [
    line
    for line in (EMBEDDED_CORPUS / "alice_in_wonderland.txt").read_text(encoding="utf-8").splitlines()
    if len(line.split()) > 4
][:300]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(LINES, TokenizerConfig(vocab_size=500))


@pytest.fixture(scope="module")
def features(tokenizer):
    import datasets

    return datasets.Dataset.from_dict({"text": LINES}).map(
        tokenize_words(tokenizer, max_length=48), batched=True, remove_columns=["text"]
    )


def test_word_ids_give_the_word_starts_spanlm_prepare_stores(tokenizer, features):
    collator = MaskingCollator(tokenizer, "wwm", seed=0)
    batch = collator.block_batch([features[i] for i in range(16)])
    ids, starts, lengths = encode_sentences(tokenizer, LINES[:16], "none")
    for row, (sentence_ids, sentence_starts) in enumerate(
        zip(np.split(ids, np.cumsum(lengths)[:-1]), np.split(starts, np.cumsum(lengths)[:-1]))
    ):
        n = min(len(sentence_ids), 46)  # 48 with [CLS] and [SEP]
        assert batch.input_ids[row, 1 : n + 1].tolist() == sentence_ids[:n].tolist()
        assert batch.word_starts[row, 1 : n + 1].tolist() == sentence_starts[:n].tolist()
        assert (
            batch.special_mask[row, 0]
            and batch.special_mask[row, n + 1]
            and not batch.special_mask[row, 1 : n + 1].any()
        )


def test_jieba_word_ids_match_prepare(tmp_path):
    text = (EMBEDDED_CORPUS / "hongloumeng_ch1-5.txt").read_text(encoding="utf-8").splitlines()
    lines = [line.strip() for line in text if len(line.strip()) > 20][:40]
    tokenizer = train_tokenizer(lines, TokenizerConfig(vocab_size=800))
    encode = tokenize_words(tokenizer, words="jieba")
    word_ids = encode({"text": lines[:8]})["word_ids"]
    ids, starts, lengths = encode_sentences(tokenizer, lines[:8], "jieba")
    collator = MaskingCollator(tokenizer, "wwm", seed=0)
    batch = collator.block_batch(
        [{"input_ids": i, "word_ids": w} for i, w in zip(encode({"text": lines[:8]})["input_ids"], word_ids)]
    )
    for row, sentence_starts in enumerate(np.split(starts, np.cumsum(lengths)[:-1])):
        assert batch.word_starts[row, 1 : len(sentence_starts) + 1].tolist() == sentence_starts.tolist()
    assert batch.word_starts.sum() < (~batch.special_mask).sum()  # multi-character words exist


@pytest.mark.parametrize("scheme", ["mlm", "wwm", "span"])
def test_labels_hold_the_original_ids_at_the_targets_only(tokenizer, features, scheme):
    counts = count_tokens(features, len(tokenizer))
    collator = MaskingCollator(tokenizer, scheme, seed=1, token_counts=counts)
    rows = [features[i] for i in range(32)]
    batch = collator(rows)
    original = torch.from_numpy(collator.block_batch(rows).input_ids)
    targets = batch["labels"] != IGNORE_INDEX
    assert torch.equal(batch["labels"][targets], original[targets])
    assert not targets[batch["attention_mask"] == 0].any()
    assert not targets[:, 0].any()  # [CLS]
    share = targets.sum() / (batch["attention_mask"].sum() - 2 * len(rows))
    assert 0.12 < float(share) < 0.2  # the 15% budget
    assert torch.equal(batch["input_ids"][~targets], original[~targets])  # only targets are corrupted
    if scheme == "span":
        flat = original.flatten()
        # SBO: boundaries of the span in the same row, labels the original ids of the span's tokens.
        assert len(batch["sbo_labels"]) > 0 and (batch["sbo_relative"] < SpanConfig().max_targets).all()
        assert (batch["sbo_left"] // original.shape[1] == batch["sbo_right"] // original.shape[1]).all()
        target = batch["sbo_left"] + 1 + batch["sbo_relative"]
        assert torch.equal(flat[target], batch["sbo_labels"])


def test_whole_words_are_masked_whole(tokenizer, features):
    collator = MaskingCollator(tokenizer, "wwm", seed=2)
    rows = [features[i] for i in range(32)]
    batch, blocks = collator(rows), collator.block_batch(rows)
    targets = (batch["labels"] != IGNORE_INDEX).numpy()
    word = np.cumsum(blocks.word_starts, axis=1)  # word number within the row (specials share a neighbour's)
    for row in range(len(rows)):
        content = ~blocks.special_mask[row]
        for w in np.unique(word[row][content]):
            pieces = targets[row][content & (word[row] == w)]
            assert pieces.all() or not pieces.any()


def test_masks_are_seeded_and_differ_across_workers(tokenizer, features):
    from torch.utils.data import DataLoader

    def masks(seed, workers):
        collator = MaskingCollator(tokenizer, "mlm", seed=seed)
        same_rows = [features[i] for i in range(8)] * 2  # batches 0 and 1 hold the same rows
        loader = DataLoader(same_rows, batch_size=8, collate_fn=collator, num_workers=workers)
        return [batch["labels"] for batch in loader]

    assert all(torch.equal(a, b) for a, b in zip(masks(0, 0), masks(0, 0)))
    assert not torch.equal(masks(0, 0)[0], masks(1, 0)[0])
    two = masks(0, 2)  # workers 0 and 1 each collate one batch of the same rows: their masks must differ
    assert len(two) == 2 and not torch.equal(two[0], two[1])
    assert all(torch.equal(a, b) for a, b in zip(two, masks(0, 2)))  # and reproduce


def test_clear_errors_for_what_a_scheme_needs(tokenizer, features):
    with pytest.raises(ConfigError, match="random_source is 'unigram'.*count_tokens"):
        MaskingCollator(tokenizer, "span")
    with pytest.raises(ConfigError, match="similar_words="):
        MaskingCollator(tokenizer, "ngram")
    collator = MaskingCollator(tokenizer, "wwm")
    with pytest.raises(ConfigError, match="needs word_ids"):
        collator([{"input_ids": features[0]["input_ids"]}])
    # Plain MLM needs no words; uniform replacements need no counts.
    uniform = MaskingConfig(span=SpanConfig(random_source="uniform"))
    MaskingCollator(tokenizer, "span", masking=uniform)
    assert MaskingCollator(tokenizer, "mlm")([{"input_ids": features[0]["input_ids"]}])["labels"].shape[0] == 1


@pytest.mark.slow
def test_macbert_collator_uses_a_prepared_similar_word_table(embedded_prepared, tmp_path):
    """scheme ngram with similar words from a `spanlm prepare` directory made with data.similar_words."""
    from spanlm.config import from_dict
    from spanlm.data.prepare import prepare
    from spanlm.data.shards import PreparedCorpus
    from spanlm.pretrain.recipe import Recipe

    recipe = from_dict(
        Recipe,
        {
            "data": {
                "inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")],
                "prepared_dir": str(tmp_path / "p"),
                "similar_words": "word2vec",
                "similar_words_min_count": 2,
            },
            "tokenizer": {"vocab_size": 600},
        },
    )
    corpus = PreparedCorpus(prepare(recipe, log=lambda *_: None))
    features = tokenize_words(corpus.tokenizer, max_length=64)({"text": LINES[:64]})
    rows = [{"input_ids": i, "word_ids": w} for i, w in zip(features["input_ids"], features["word_ids"])]
    batch = MaskingCollator(corpus.tokenizer, "ngram", seed=0, similar_words=corpus.directory)(rows)
    targets = batch["labels"] != IGNORE_INDEX
    replaced = targets & (batch["input_ids"] != batch["labels"])
    assert replaced.sum() > 0.5 * targets.sum()  # 80% similar words + 10% random: most targets read another token
    assert not (batch["input_ids"][targets] == corpus.tokenizer.mask_token_id).any()  # MacBERT never shows [MASK]
