"""Embedding sharing (none / es / gdes): what D sees at init, where each loss's gradient goes, export."""

from __future__ import annotations

import pytest
import torch

from spanlm.data.shards import PreparedCorpus
from spanlm.models import BackboneConfig, build_backbone
from spanlm.models.sharing import SharedEmbedding, materialised_state_dict, share_embeddings, shared_tables

TINY = {
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}


@pytest.fixture(scope="module")
def corpus(embedded_prepared) -> PreparedCorpus:
    return PreparedCorpus(embedded_prepared)


def pair(corpus, mode: str, family: str = "electra", generator_hidden: int = 16):
    """A generator narrower than its discriminator (hidden 16 vs 32), both with 32-wide embeddings (the modern
    families have no embedding projection: both 32 wide, the generator shallower)."""
    torch.manual_seed(0)
    if family in ("modernbert", "eurobert"):
        generator = build_backbone(BackboneConfig(family=family, hidden_size=32, **TINY), corpus)
        discriminator = build_backbone(
            BackboneConfig(family=family, hidden_size=32, **{**TINY, "num_layers": 2}), corpus
        )
        share_embeddings(generator, discriminator, mode)
        return generator, discriminator
    generator = build_backbone(
        BackboneConfig(family=family, hidden_size=generator_hidden, embedding_size=32, **TINY), corpus
    )
    discriminator = build_backbone(BackboneConfig(family=family, hidden_size=32, embedding_size=32, **TINY), corpus)
    share_embeddings(generator, discriminator, mode)
    return generator, discriminator


def ids() -> torch.Tensor:
    return torch.tensor([[2, 50, 51, 52, 3], [2, 60, 61, 62, 3]])


def rtd_only(discriminator) -> torch.Tensor:
    """A loss of the discriminator alone (what the RTD loss is, as far as gradients go)."""
    return discriminator(input_ids=ids()).last_hidden_state.square().mean()


def mlm_only(generator) -> torch.Tensor:
    return generator(input_ids=ids()).last_hidden_state.square().mean()


@pytest.mark.parametrize(
    "family, tables",
    [
        ("electra", {"embeddings.word_embeddings", "embeddings.position_embeddings"}),
        ("deberta-v2", {"embeddings.word_embeddings"}),
        ("modernbert", {"embeddings.tok_embeddings"}),
        ("eurobert", {"embed_tokens"}),
    ],
)  # DeBERTa-V3: relative positions only
def test_gdes_starts_as_exactly_the_generator_embedding(corpus, family, tables):
    generator, discriminator = pair(corpus, "gdes", family)
    shared = shared_tables(discriminator)
    assert set(shared) == tables and all(isinstance(m, SharedEmbedding) for m in shared.values())
    for name, module in shared.items():
        assert torch.equal(module.weight, generator.get_submodule(name).weight)
        assert not module.delta.any()
    # Same lookups, so the embedding output (before D's own LayerNorm) matches G's exactly.
    assert torch.equal(discriminator.get_input_embeddings()(ids()), generator.get_input_embeddings()(ids()))


@pytest.mark.parametrize("family", ["electra", "deberta-v2", "modernbert", "eurobert"])
def test_gdes_rtd_loss_trains_only_the_delta(corpus, family):
    generator, discriminator = pair(corpus, "gdes", family)
    rtd_only(discriminator).backward()
    for name, module in shared_tables(discriminator).items():
        source = generator.get_submodule(name).weight
        assert source.grad is None or not source.grad.any(), f"RTD loss reached E_G ({name})"
        assert module.delta.grad is not None and module.delta.grad.abs().sum() > 0, f"E_Δ ({name}) got no gradient"


def test_gdes_mlm_loss_leaves_the_delta_alone(corpus):
    generator, discriminator = pair(corpus, "gdes")
    mlm_only(generator).backward()
    assert generator.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    for module in shared_tables(discriminator).values():
        assert module.delta.grad is None


def test_es_rtd_loss_reaches_the_generator_embedding(corpus):
    """The control: without the stop-gradient, the discriminator's loss pulls on E_G (the tug-of-war)."""
    generator, discriminator = pair(corpus, "es")
    rtd_only(discriminator).backward()
    for name in shared_tables(discriminator):
        assert generator.get_submodule(name).weight.grad.abs().sum() > 0


@pytest.mark.parametrize("mode", ["es", "gdes"])
def test_the_generator_embedding_is_not_a_discriminator_parameter(corpus, mode):
    generator, discriminator = pair(corpus, mode)
    own = {id(p) for p in discriminator.parameters()}
    for name in shared_tables(discriminator):
        assert id(generator.get_submodule(name).weight) not in own
    deltas = {id(m.delta) for m in shared_tables(discriminator).values() if mode == "gdes"}
    assert deltas <= own
    # The rest of the embedding stays D's own: its LayerNorm and the projection to D's width.
    assert discriminator.embeddings.LayerNorm.weight is not generator.embeddings.LayerNorm.weight
    assert not any(name.endswith("word_embeddings.weight") for name, _ in discriminator.named_parameters())


def test_deberta_relative_embeddings_and_layer_norm_are_not_shared(corpus):
    generator, discriminator = pair(corpus, "gdes", "deberta-v2")
    assert discriminator.encoder.rel_embeddings.weight is not generator.encoder.rel_embeddings.weight
    assert not torch.equal(discriminator.encoder.rel_embeddings.weight, generator.encoder.rel_embeddings.weight)


def test_none_keeps_separate_tables(corpus):
    generator, discriminator = pair(corpus, "none")
    assert isinstance(discriminator.embeddings.word_embeddings, torch.nn.Embedding)
    assert not torch.equal(discriminator.embeddings.word_embeddings.weight, generator.embeddings.word_embeddings.weight)


def test_the_shared_weight_follows_the_generator_live(corpus):
    """Computed on each call: updating or swapping G's Parameter is seen by D (no stale copy)."""
    generator, discriminator = pair(corpus, "gdes")
    with torch.no_grad():
        generator.embeddings.word_embeddings.weight.add_(1.0)
        discriminator.embeddings.word_embeddings.delta.fill_(0.5)
    expected = generator.embeddings.word_embeddings.weight + 0.5
    assert torch.equal(discriminator.embeddings.word_embeddings.weight, expected)
    generator.embeddings.word_embeddings.weight = torch.nn.Parameter(torch.zeros_like(expected))
    assert torch.equal(discriminator.embeddings.word_embeddings.weight, torch.full_like(expected, 0.5))


def test_materialised_state_dict_loads_into_a_plain_model(corpus):
    from transformers import AutoModel

    generator, discriminator = pair(corpus, "gdes")
    with torch.no_grad():
        for module in shared_tables(discriminator).values():
            module.delta.normal_(0, 0.1)
    state = materialised_state_dict(discriminator)
    assert not any(k.endswith(".delta") for k in state)
    word = discriminator.embeddings.word_embeddings
    assert torch.equal(
        state["embeddings.word_embeddings.weight"], generator.embeddings.word_embeddings.weight + word.delta
    )
    plain = AutoModel.from_config(discriminator.config)
    plain.load_state_dict(state)  # strict: exactly a plain model's keys
    with torch.no_grad():
        assert torch.equal(
            plain.eval()(input_ids=ids()).last_hidden_state, discriminator.eval()(input_ids=ids()).last_hidden_state
        )


def test_continuing_keeps_the_discriminators_own_embedding(corpus):
    torch.manual_seed(0)
    generator = build_backbone(BackboneConfig(family="electra", hidden_size=16, embedding_size=32, **TINY), corpus)
    discriminator = build_backbone(BackboneConfig(family="electra", hidden_size=32, **TINY), corpus)
    before = discriminator.embeddings.word_embeddings.weight.detach().clone()
    share_embeddings(generator, discriminator, "gdes", keep_discriminator=True)
    assert torch.allclose(discriminator.embeddings.word_embeddings.weight, before, atol=1e-6)


def test_tables_of_different_widths_cannot_be_shared(corpus):
    generator = build_backbone(BackboneConfig(family="electra", hidden_size=16, **TINY), corpus)  # 16-wide embedding
    discriminator = build_backbone(BackboneConfig(family="electra", hidden_size=32, **TINY), corpus)
    with pytest.raises(ValueError, match="cannot share embeddings.word_embeddings"):
        share_embeddings(generator, discriminator, "gdes")
