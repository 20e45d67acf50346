"""Masking configuration, MaskedBatch, the registry and the shared vectorised primitives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spanlm.config import from_dict
from spanlm.errors import ConfigError, InputError
from spanlm.masking.base import (
    KEPT,
    MASK,
    RANDOM,
    SIMILAR,
    MaskedBatch,
    MaskingConfig,
    Proportions,
    build_masker,
    make_rng,
)
from spanlm.masking.ops import TokenSampler, Words, ceil_budget, ragged_arange, round_budget
from spanlm.pretrain.recipe import Recipe, load_recipe


def test_config_defaults_are_the_papers():
    config = MaskingConfig()
    assert (
        config.mlm.rate,
        config.mlm.proportions.mask,
        config.mlm.proportions.random,
        config.mlm.proportions.keep,
    ) == (0.15, 0.8, 0.1, 0.1)
    assert (
        config.span.p,
        config.span.max_span,
        config.span.replacement,
        config.span.endpoints,
        config.span.max_targets,
    ) == (0.2, 10, "span", "external", 15)
    assert config.span.random_source == "unigram" and config.mlm.random_source == "uniform"
    assert config.ngram.ngram_probs == [0.4, 0.3, 0.2, 0.1]
    assert (config.ngram.proportions.similar, config.ngram.proportions.mask) == (0.8, 0.0)
    assert (config.noise.word_prob, config.noise.short_word, config.noise.delete_prob, config.noise.mlm.rate) == (
        0.10,
        4,
        0.5,
        0.10,
    )


def test_recipe_masking_section_and_overrides(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("masking:\n  scheme: span\n  span:\n    p: 0.3\n", encoding="utf-8")
    recipe = load_recipe(
        path, ["masking.span.max_targets=20", "masking.span.proportions.mask=0.5", "masking.span.proportions.keep=0.4"]
    )
    assert recipe.masking.scheme == "span"
    assert (recipe.masking.span.p, recipe.masking.span.max_targets, recipe.masking.span.proportions.keep) == (
        0.3,
        20,
        0.4,
    )


@pytest.mark.parametrize(
    "masking, message",
    [
        ({"scheme": "bert"}, "must be one of"),
        ({"span": {"geometric_p": 0.2}}, "unknown config key 'masking.span.geometric_p'"),
        ({"mlm": {"proportions": {"mask": 0.8, "random": 0.3, "keep": 0.1}}}, "sum to 1"),
        ({"mlm": {"rate": 1.5}}, "rate must be in"),
        (
            {"wwm": {"proportions": {"mask": 0.7, "similar": 0.1, "random": 0.1, "keep": 0.1}}},
            "similar-word replacement",
        ),
        ({"ngram": {"ngram_probs": [0.5, 0.6]}}, "ngram_probs"),
        ({"span": {"p": 0.0}}, "p must be"),
    ],
)
def test_config_errors(masking, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(Recipe, {"masking": masking})


def test_proportions_draw_matches_probabilities():
    kinds = Proportions(mask=0.5, similar=0.2, random=0.2, keep=0.1).draw(np.random.default_rng(0), 200_000)
    shares = np.bincount(kinds, minlength=4) / len(kinds)
    assert shares[[MASK, SIMILAR, RANDOM, KEPT]] == pytest.approx([0.5, 0.2, 0.2, 0.1], abs=0.005)


@pytest.mark.parametrize("source", ["uniform", "unigram"])
def test_random_tokens_are_never_special(vocab, source):
    SPECIAL = vocab.special_ids
    sampled = TokenSampler(vocab, source).sample(np.random.default_rng(0), 200_000)
    assert not np.isin(sampled, SPECIAL).any()
    assert sampled.min() >= 0 and sampled.max() < vocab.size
    counts = np.bincount(sampled, minlength=vocab.size)
    if source == "uniform":
        assert counts[5:].min() > 0.5 * counts[5:].mean()
    else:  # counts ∝ 1000 - id: low ids about ten times as frequent as high ids
        assert counts[5:100].mean() > 5 * counts[900:].mean()


def test_unigram_without_counts_is_an_error(vocab):
    from spanlm.masking.base import Vocabulary

    with pytest.raises(ValueError, match="token counts"):
        TokenSampler(Vocabulary(vocab.size, vocab.mask_id, vocab.special_ids, None), "unigram")


def test_ragged_arange_and_budgets():
    assert ragged_arange(np.array([5, 0, 10]), np.array([2, 0, 3])).tolist() == [5, 6, 10, 11, 12]
    assert ragged_arange(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []
    n = np.array([0, 1, 10, 20, 510])
    assert round_budget(0.15, n).tolist() == [0, 1, 2, 3, 77]  # round half up, at least 1 where n > 0
    assert ceil_budget(0.15, n).tolist() == [0, 1, 2, 3, 77]  # 0.15 × 20 = 3.0000000000000004 stays 3


def test_words_skip_specials_and_start_after_them(make_batch):
    batch = make_batch(np.random.default_rng(0), batch_size=2, width=6, lengths=[6, 4])
    batch.word_starts[:] = False  # no flags at all: words still start right after [CLS]
    words = Words.of(batch.word_starts, batch.special_mask)
    assert words.start.tolist() == [1, 7]
    assert words.length.tolist() == [4, 2]
    assert words.row_count.tolist() == [1, 1]
    assert words.token_word().tolist() == [-1, 0, 0, 0, 0, -1, -1, 1, 1, -1, -1, -1]


def test_make_rng_streams():
    draw = lambda rng: rng.random(4).tolist()  # noqa: E731
    assert draw(make_rng(0)) == draw(np.random.default_rng(0))
    assert draw(make_rng(7, 0, 1)) == draw(make_rng(7, 0, 1))
    assert draw(make_rng(7, 0, 1)) != draw(make_rng(7, 0, 2)) != draw(make_rng(7, 1, 1))


def test_masked_batch_to_torch_and_json(vocab, make_batch):
    from spanlm.masking.base import MlmConfig
    from spanlm.objectives.mlm.masker import MlmMasker

    masked = MlmMasker(MlmConfig(), vocab)(make_batch(np.random.default_rng(0), 4, 32), np.random.default_rng(1))
    tensors = masked.to_torch()
    assert set(tensors) == {*MaskedBatch.ARRAYS, "max_seq_len"}
    assert tensors["max_seq_len"] == 0 and type(tensors["max_seq_len"]) is int  # a padded batch: no segments
    assert masked.to_torch(("input_ids", "max_seq_len")).keys() == {"input_ids", "max_seq_len"}
    assert tensors["input_ids"].dtype == torch.int64 and tensors["input_ids"].shape == (4, 32)
    assert tensors["attention_mask"].dtype == torch.bool
    assert tensors["target_kind"].dtype == torch.int8
    assert torch.equal(tensors["target_index"], torch.from_numpy(masked.target_index))
    data = masked.to_json_dict()
    assert data["target_labels"] == masked.target_labels.tolist() and data["counters"] == {}
    assert data["cu_seq_lens"] == [] and data["max_seq_len"] == 0


def test_build_masker_registry(english):
    from spanlm.masking.wwm import WholeWordMasker
    from spanlm.objectives.macbert.masker import NgramMasker
    from spanlm.objectives.mlm.masker import MlmMasker
    from spanlm.objectives.spanbert.masker import SpanMasker

    for scheme, cls in [("mlm", MlmMasker), ("wwm", WholeWordMasker), ("span", SpanMasker), ("ngram", NgramMasker)]:
        assert isinstance(build_masker(MaskingConfig(scheme=scheme), english), cls)


def test_ngram_without_a_table_is_a_clear_error(tmp_path, english):
    import shutil

    from spanlm.data.shards import PreparedCorpus

    copy = tmp_path / "no_table"
    shutil.copytree(english.directory, copy)
    (copy / "similar_words.npz").unlink()
    with pytest.raises(InputError, match="data.similar_words=word2vec"):
        build_masker(MaskingConfig(scheme="ngram"), PreparedCorpus(copy))


def test_a_scheme_adds_its_own_arrays_with_how_each_packs(vocab, make_batch):
    from spanlm.data.packing import pack_masked
    from spanlm.masking.base import END, FLAT, KEEP, MlmConfig
    from spanlm.objectives.mlm.masker import MlmMasker

    masked = MlmMasker(MlmConfig(), vocab)(make_batch(np.random.default_rng(0), 4, 32), np.random.default_rng(1))
    own = masked.target_index[::2]
    masked.add(FLAT, own_index=own).add(KEEP, own_labels=masked.target_labels[::2]).add(END, own_end=own + 1)
    assert masked.own_index is own and masked.array_names()[-3:] == ("own_index", "own_labels", "own_end")
    assert masked.packing()["own_index"] == FLAT and masked.packing()["own_end"] == END
    assert {"own_index", "own_labels", "own_end"} <= masked.to_torch().keys() <= {*masked.array_names(), "max_seq_len"}
    assert masked.to_json_dict()["own_labels"] == masked.target_labels[::2].tolist()
    packed = pack_masked(masked, pad_id=0)
    assert packed.own_index.tolist() == packed.target_index[::2].tolist()  # remapped as the targets are
    assert packed.own_end.tolist() == (packed.own_index + 1).tolist() and packed.own_labels is masked.own_labels
    assert "own_index" not in MaskedBatch.ARRAYS and masked.extra_packing is not packed.extra_packing
    with pytest.raises(ValueError, match="'target_index' is a common field"):
        masked.add(FLAT, target_index=own)
    with pytest.raises(ValueError, match="packing must be"):
        masked.add("remap", other=own)
    with pytest.raises(AttributeError, match="no array 'sbo_left'"):
        masked.sbo_left  # noqa: B018 — an MLM batch has no SBO targets


def test_a_registered_scheme_name_is_not_a_masking_key():
    from spanlm.masking.base import MlmConfig, register_scheme
    from spanlm.objectives.mlm.masker import MlmMasker

    with pytest.raises(ValueError, match="'rate_schedule' is a key of the masking section"):
        register_scheme("rate_schedule", MlmConfig, MlmMasker)
    with pytest.raises(ValueError, match="'span' is already registered"):
        register_scheme("span", MlmConfig, MlmMasker)
