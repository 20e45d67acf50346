"""Backbone builder: every family builds and runs, checkpoints load their own weights, mismatches are clear."""

import re

import pytest
import torch

from helpers import ENGLISH, make_recipe
from spanlm.config import from_dict
from spanlm.data.prepare import prepare
from spanlm.data.shards import PreparedCorpus
from spanlm.data.tokenizer import TokenizerConfig, train_tokenizer
from spanlm.errors import ConfigError, InputError
from spanlm.models import (
    ATTENTION,
    BackboneConfig,
    build_backbone,
    check_vocabulary,
    hidden_size,
    input_embeddings,
    max_sequence_length,
)

FAMILIES = ["bert", "roberta", "electra", "deberta-v2"]
TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}


def tiny(family: str, **fields) -> BackboneConfig:
    return BackboneConfig(family=family, **{**TINY, **fields})


@pytest.fixture(scope="module")
def corpus(embedded_prepared) -> PreparedCorpus:
    return PreparedCorpus(embedded_prepared)


@pytest.fixture(scope="module")
def bpe_corpus(tmp_path_factory) -> PreparedCorpus:
    """A byte-level BPE corpus: pad id 1, as RoBERTa's <pad>."""
    tmp = tmp_path_factory.mktemp("bpe")
    return PreparedCorpus(prepare(make_recipe(tmp, {"a.txt": ENGLISH}, tokenizer={"kind": "bpe"}), log=lambda *_: None))


def random_batch(corpus: PreparedCorpus, batch: int = 2, length: int = 12, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    special = corpus.special_ids
    ids = torch.randint(len(special), corpus.vocab_size, (batch, length), generator=generator)
    ids[:, 0], ids[:, -1] = special["cls"], special["sep"]
    ids[1, -3:] = special["pad"]  # a padded row, so the attention mask matters
    return ids, (ids != special["pad"]).long()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_builds_from_a_tiny_config_and_runs_forward(corpus, family):
    model = build_backbone(tiny(family), corpus)
    assert model.config.model_type == family
    assert model.config.vocab_size == corpus.vocab_size == input_embeddings(model).num_embeddings
    assert model.config.pad_token_id == corpus.special_ids["pad"]
    assert (
        model.config._attn_implementation == ATTENTION[family]
    )  # the stock model: spanlm.accel is applied by the trainer
    assert any(type(m) is torch.nn.Dropout for m in model.modules())
    assert getattr(model, "pooler", None) is None  # a pooler no loss reaches would be unused under DDP
    assert hidden_size(model) == 32 and input_embeddings(model).embedding_dim == 32
    ids, mask = random_batch(corpus)
    model.eval()
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert hidden.shape == (2, 12, 32)
    assert torch.isfinite(hidden).all()


def test_attention_table_matches_what_transformers_supports():
    """If transformers adds SDPA to DeBERTa-V2 (or drops it elsewhere) this table must follow."""
    from transformers import MODEL_MAPPING, AutoConfig

    for family, attention in ATTENTION.items():
        supports_sdpa = MODEL_MAPPING[type(AutoConfig.for_model(family))]._supports_sdpa
        assert attention == ("sdpa" if supports_sdpa else "eager"), family


def test_deberta_v2_family_defaults_to_deberta_v3_relative_attention(corpus):
    model = build_backbone(tiny("deberta-v2"), corpus)
    config = model.config
    assert config.relative_attention is True and config.position_buckets == 256
    assert config.pos_att_type == ["p2c", "c2p"] and config.share_att_key is True
    assert config.norm_rel_ebd == "layer_norm" and config.layer_norm_eps == 1e-7
    assert config.position_biased_input is False
    assert model.embeddings.position_embeddings is None  # V3: no absolute positions added to the input
    assert model.encoder.rel_embeddings.num_embeddings == 2 * 256  # the bucketed relative table


def test_extra_overrides_the_family_defaults_and_rejects_unknown_keys(corpus):
    model = build_backbone(
        tiny("deberta-v2", extra={"relative_attention": False, "position_biased_input": True}), corpus
    )
    assert model.config.relative_attention is False
    assert model.embeddings.position_embeddings.num_embeddings == 64
    with pytest.raises(ConfigError, match=r"model\.extra\.relative_atention"):
        build_backbone(tiny("deberta-v2", extra={"relative_atention": False}), corpus)
    with pytest.raises(ConfigError, match="extra may not set vocab_size"):
        from_dict(BackboneConfig, {"extra": {"vocab_size": 10}})


def test_config_is_validated_by_the_strict_loader():
    config = from_dict(
        BackboneConfig, {"family": "electra", "hidden_size": 64, "embedding_size": 16, "extra": {"hidden_act": "gelu"}}
    )
    assert config.embedding_size == 16 and config.path is None
    with pytest.raises(ConfigError, match="not a multiple of num_heads"):
        from_dict(BackboneConfig, {"hidden_size": 30, "num_heads": 4})
    with pytest.raises(ConfigError, match="must be one of"):
        from_dict(BackboneConfig, {"family": "gpt2"})
    with pytest.raises(ConfigError, match="embedding_size is only supported"):
        from_dict(BackboneConfig, {"family": "bert", "embedding_size": 16})
    with pytest.raises(ConfigError, match="hidden_dropout must be in"):
        from_dict(BackboneConfig, {"hidden_dropout": 1.0})


def test_electra_embedding_width_defaults_to_hidden_and_can_be_factorised(corpus):
    assert input_embeddings(build_backbone(tiny("electra"), corpus)).embedding_dim == 32  # not ElectraConfig's 128
    model = build_backbone(tiny("electra", embedding_size=16), corpus)
    assert input_embeddings(model).embedding_dim == 16 and hidden_size(model) == 32
    ids, mask = random_batch(corpus)
    assert model(input_ids=ids, attention_mask=mask).last_hidden_state.shape == (2, 12, 32)


def test_roberta_position_table_makes_room_for_the_padding_offset(bpe_corpus):
    """RoBERTa numbers positions from pad_id + 1, so 16 usable positions need 16 + pad + 1 rows."""
    assert bpe_corpus.special_ids["pad"] == 1
    model = build_backbone(tiny("roberta", max_position_embeddings=16), bpe_corpus)
    assert model.config.max_position_embeddings == 18
    assert max_sequence_length(model) == 16
    ids, mask = random_batch(bpe_corpus, length=16)
    model.eval()
    with torch.no_grad():  # the longest allowed input indexes the last row without an IndexError
        assert model(input_ids=ids, attention_mask=mask).last_hidden_state.shape == (2, 16, 32)


def save_checkpoint(model, directory, tokenizer=None):
    model.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("family", FAMILIES)
def test_continued_pretraining_loads_the_saved_weights(corpus, tmp_path, family):
    saved = build_backbone(tiny(family), corpus)
    path = save_checkpoint(saved, tmp_path / "checkpoint", corpus.tokenizer)
    loaded = build_backbone(BackboneConfig(family=family, path=str(path)), corpus)
    assert loaded.config._attn_implementation == ATTENTION[family]
    expected, actual = saved.state_dict(), loaded.state_dict()
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        assert torch.equal(tensor, actual[name]), name
    # ... and it computes what the saved model computes
    ids, mask = random_batch(corpus)
    saved.eval(), loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids, attention_mask=mask).last_hidden_state,
            saved(input_ids=ids, attention_mask=mask).last_hidden_state,
            rtol=0,
            atol=0,
        )


def test_a_checkpoint_with_fewer_embedding_rows_than_the_tokenizer_is_rejected(corpus, tmp_path):
    from transformers import AutoConfig, AutoModel

    small = AutoModel.from_config(
        AutoConfig.for_model(
            "bert",
            vocab_size=corpus.vocab_size - 10,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            pad_token_id=corpus.special_ids["pad"],
        )
    )
    path = save_checkpoint(small, tmp_path / "small")  # no tokenizer files: only the size can be checked
    message = (
        f"checkpoint {path} has {corpus.vocab_size - 10} embedding rows but corpus {corpus.directory} "
        f"was prepared with a tokenizer of {corpus.vocab_size} tokens"
    )
    with pytest.raises(InputError, match=re.escape(message)):
        build_backbone(BackboneConfig(family="bert", path=str(path)), corpus)


def test_a_checkpoint_with_a_different_tokenizer_is_rejected(corpus, tmp_path):
    model = build_backbone(tiny("bert"), corpus)  # same vocabulary size: only the tokenizer tells
    other = train_tokenizer(ENGLISH.splitlines(), TokenizerConfig(vocab_size=300, min_frequency=1))
    path = save_checkpoint(model, tmp_path / "other", other)
    with pytest.raises(InputError) as error:
        build_backbone(BackboneConfig(family="bert", path=str(path)), corpus)
    message = str(error.value)
    assert f"the tokenizer of checkpoint {path} ({len(other)} tokens" in message
    assert f"{corpus.directory / 'tokenizer'}: {corpus.vocab_size} tokens" in message
    assert f"tokenizer.path: {path}" in message  # says how to fix it


def test_check_vocabulary_accepts_a_padded_embedding_and_rejects_another_pad_id(corpus, tmp_path):
    model = build_backbone(tiny("bert"), corpus)
    model.resize_token_embeddings(corpus.vocab_size + 6)  # checkpoints pad their vocabulary: fine
    check_vocabulary(model, corpus, tmp_path)
    model.config.pad_token_id = corpus.special_ids["pad"] + 1
    with pytest.raises(InputError, match=f"pad_token_id {corpus.special_ids['pad'] + 1} but the tokenizer"):
        check_vocabulary(model, corpus, tmp_path)


def test_wrong_family_and_missing_checkpoint_give_clear_errors(corpus, tmp_path):
    path = save_checkpoint(build_backbone(tiny("electra"), corpus), tmp_path / "electra")
    with pytest.raises(
        InputError, match="holds a 'electra' model but model.family is 'bert'; set model.family: electra"
    ):
        build_backbone(BackboneConfig(family="bert", path=str(path)), corpus)
    with pytest.raises(InputError, match="not a Hugging Face checkpoint directory"):
        build_backbone(BackboneConfig(path=str(tmp_path / "nowhere")), corpus)
