"""MLM head: BERT's formula at gathered rows, and a decoder that stays the input embedding through training."""

import copy
import math

import pytest
import torch
from torch import nn

from spanlm.data.shards import PreparedCorpus
from spanlm.heads import MLMHead, VocabTarget, masked_lm_loss, vocab_cross_entropies
from spanlm.models import BackboneConfig, build_backbone, hidden_size, input_embeddings


class TinyObjective(nn.Module):
    """Backbone + MLM head wired the way objectives do: gather the targets, then the head."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.head = MLMHead(hidden_size(backbone), input_embeddings(backbone), backbone.config.layer_norm_eps)

    def forward(self, ids, targets, labels):
        hidden = self.backbone(input_ids=ids).last_hidden_state  # (B, L, H)
        flat = hidden.reshape(-1, hidden.shape[-1])  # (B·L, H)
        return masked_lm_loss(
            vocab_cross_entropies([VocabTarget(self.head.features(flat[targets]), self.head.decoder, labels)])[0]
        )


@pytest.fixture(scope="module")
def corpus(embedded_prepared) -> PreparedCorpus:
    return PreparedCorpus(embedded_prepared)


def tiny_objective(corpus, family="bert"):
    torch.manual_seed(0)
    config = BackboneConfig(
        family=family,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return TinyObjective(build_backbone(config, corpus))


def batch_for(corpus, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, corpus.vocab_size, (2, 16), generator=generator)
    targets = torch.tensor([1, 4, 5, 9, 17, 20, 30])  # flat positions b·L + t
    return ids, targets, ids.reshape(-1)[targets]


def test_mlm_head_is_berts_formula():
    torch.manual_seed(0)
    embedding = nn.Embedding(30, 16)
    head = MLMHead(16, embedding, layer_norm_eps=1e-12)
    with torch.no_grad():
        head.decoder.bias.normal_()
        head.layer_norm.weight.normal_()
    x = torch.randn(5, 16)
    h = x @ head.dense.weight.T + head.dense.bias
    h = h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))  # erf GeLU
    h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-12)
    h = h * head.layer_norm.weight + head.layer_norm.bias
    expected = h @ embedding.weight.T + head.decoder.bias
    torch.testing.assert_close(head(x), expected, rtol=1e-5, atol=1e-5)
    assert head(x).shape == (5, 30)


def test_mlm_head_init_and_own_state():
    embedding = nn.Embedding(30, 16)
    head = MLMHead(48, embedding)  # H = 48 → E = 16, as an ELECTRA-style factorised embedding
    assert head.dense.weight.shape == (16, 48)
    assert torch.equal(head.decoder.bias, torch.zeros(30)) and torch.equal(head.dense.bias, torch.zeros(16))
    assert torch.equal(head.layer_norm.weight, torch.ones(16)) and torch.equal(head.layer_norm.bias, torch.zeros(16))
    assert abs(head.dense.weight.std().item() - 0.02) < 0.004
    assert set(head.state_dict()) == {
        "dense.weight",
        "dense.bias",
        "layer_norm.weight",
        "layer_norm.bias",
        "decoder.bias",
    }
    assert all(p is not embedding.weight for p in head.parameters())


def test_tying_holds_after_an_optimizer_step(corpus):
    objective = tiny_objective(corpus)
    embedding = input_embeddings(objective.backbone)
    assert objective.head.decoder_weight is embedding.weight
    parameters = list(objective.parameters())
    assert sum(p is embedding.weight for p in parameters) == 1  # the optimiser sees the tied weight once
    before = embedding.weight.detach().clone()
    optimizer = torch.optim.AdamW(parameters, lr=1e-2)
    ids, targets, labels = batch_for(corpus)
    objective(ids, targets, labels)["loss"].backward()
    # the decoder's gradient reaches the embedding: rows never fed as input still get one
    unused = torch.ones(corpus.vocab_size, dtype=torch.bool)
    unused[ids.unique()] = False
    assert embedding.weight.grad[unused].abs().sum() > 0
    optimizer.step()
    assert objective.head.decoder_weight is embedding.weight
    assert torch.equal(objective.head.decoder_weight, embedding.weight)
    assert not torch.equal(embedding.weight, before)  # it did move, and the decoder moved with it


def test_tying_survives_deepcopy_and_loading_a_state_dict(corpus):
    objective = tiny_objective(corpus)
    clone = copy.deepcopy(objective)
    assert clone.head.decoder_weight is input_embeddings(clone.backbone).weight
    assert clone.head.decoder_weight is not objective.head.decoder_weight
    with torch.no_grad():
        input_embeddings(objective.backbone).weight.mul_(2.0)
    clone.load_state_dict(objective.state_dict())
    assert torch.equal(clone.head.decoder_weight, objective.head.decoder_weight)


@pytest.mark.slow
def test_a_few_steps_lower_the_loss(corpus):
    objective = tiny_objective(corpus)
    optimizer = torch.optim.AdamW(objective.parameters(), lr=1e-2)
    ids, targets, labels = batch_for(corpus)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        loss = objective(ids, targets, labels)["loss"]
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0]
