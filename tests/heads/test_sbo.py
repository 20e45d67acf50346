"""SBO head: equal to the paper's formula in the authors' padded per-pair layout — values and gradients."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from spanlm.heads import SBOHead, span_targets

PAD = -100  # label of a padded slot in the reference layout


def reference_padded_sbo(head: SBOHead, hidden, pairs, pair_targets):
    """Joshi et al. 2020 §3.2 written out in the authors' layout (BertPairTargetPredictionHead):

    every pair (s-1, e+1) of every block gets ``max_targets`` slots, slot j predicting token s+j with
    position p_{j+1}; blocks are padded to the batch's largest pair count; padded slots carry label PAD
    and are left out of the summed cross-entropy. GeLU, LayerNorm and the tied projection are spelled
    out here rather than taken from the head's submodules.
    """
    bs, n_pairs, _ = pairs.shape
    _, _, dim = hidden.shape
    slots = head.max_targets

    def gelu(x):  # the authors' erf GeLU
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    def layer_norm(x, norm):
        mean = x.mean(-1, keepdim=True)
        variance = (x - mean).pow(2).mean(-1, keepdim=True)
        return norm.weight * (x - mean) / torch.sqrt(variance + norm.eps) + norm.bias

    left = torch.gather(hidden, 1, pairs[:, :, 0:1].expand(bs, n_pairs, dim))  # (bs, n_pairs, H)
    right = torch.gather(hidden, 1, pairs[:, :, 1:2].expand(bs, n_pairs, dim))  # (bs, n_pairs, H)
    left = left.reshape(bs * n_pairs, 1, dim).expand(-1, slots, -1)  # (bs·n_pairs, max_targets, H)
    right = right.reshape(bs * n_pairs, 1, dim).expand(-1, slots, -1)
    positions = head.position_embeddings.weight.unsqueeze(0).expand(
        bs * n_pairs, -1, -1
    )  # (bs·n_pairs, max_targets, 200)
    h0 = torch.cat([left, right, positions], dim=-1)
    h1 = layer_norm(gelu(h0 @ head.dense1.weight.T + head.dense1.bias), head.layer_norm1)
    y = layer_norm(gelu(h1 @ head.dense2.weight.T + head.dense2.bias), head.layer_norm2)
    scores = y @ head.decoder_weight.T + head.decoder.bias  # (bs·n_pairs, max_targets, V)
    loss = F.cross_entropy(
        scores.reshape(-1, scores.shape[-1]), pair_targets.reshape(-1), reduction="sum", ignore_index=PAD
    )
    return scores.reshape(bs, n_pairs, slots, -1), loss


def random_spans(generator, batch, length, max_span):
    """Non-overlapping spans [s, e] with both boundary tokens inside the block; block 1 gets none."""
    spans = []
    for b in range(batch):
        if b == 1:
            continue
        t = 1 + int(torch.randint(0, 3, (1,), generator=generator))
        while True:
            span_length = int(torch.randint(1, max_span + 1, (1,), generator=generator))
            if t + span_length > length - 1:
                break
            spans.append((b, t, t + span_length - 1))
            t += span_length + 1 + int(torch.randint(0, 4, (1,), generator=generator))
    return torch.tensor(spans)


def to_padded_layout(spans, labels, batch, max_targets):
    """(bs, n_pairs, 2) boundary positions and (bs, n_pairs, max_targets) labels, PAD-filled."""
    n_pairs = max(int((spans[:, 0] == b).sum()) for b in range(batch))
    pairs = torch.zeros(batch, n_pairs, 2, dtype=torch.long)
    targets = torch.full((batch, n_pairs, max_targets), PAD)
    count = [0] * batch
    for b, s, e in spans.tolist():
        k = count[b]
        count[b] += 1
        pairs[b, k] = torch.tensor([s - 1, e + 1])
        n = min(e - s + 1, max_targets)
        targets[b, k, :n] = labels[b, s : s + n]
    return pairs, targets


@pytest.fixture
def setup():
    torch.manual_seed(0)
    batch, length, dim, vocab, max_targets = 3, 48, 16, 50, 6
    embedding = nn.Embedding(vocab, dim).double()
    head = SBOHead(dim, embedding, max_targets=max_targets, position_size=200).double()
    with torch.no_grad():  # move LayerNorm / bias away from their init so every parameter matters
        for parameter in head.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    generator = torch.Generator().manual_seed(1)
    spans = random_spans(generator, batch, length, max_span=9)  # spans longer than max_targets included
    labels = torch.randint(0, vocab, (batch, length), generator=generator)
    hidden = torch.randn(batch, length, dim, dtype=torch.float64, generator=generator)
    return head, embedding, spans, labels, hidden


def test_random_spans_exercise_padding_and_truncation(setup):
    head, _, spans, _, _ = setup
    lengths = spans[:, 2] - spans[:, 1] + 1
    assert (lengths > head.max_targets).any() and (lengths < head.max_targets).any()
    assert not (spans[:, 0] == 1).any()  # one block without pairs: a fully padded row in the reference


def test_sbo_head_equals_the_padded_reference_values_and_gradients(setup):
    head, embedding, spans, labels, hidden = setup
    batch, length, _ = hidden.shape
    left, right, relative, target = span_targets(spans[:, 0], spans[:, 1], spans[:, 2], length, head.max_targets)
    pairs, pair_targets = to_padded_layout(spans, labels, batch, head.max_targets)
    real_slots = pair_targets != PAD
    assert int(real_slots.sum()) == len(target)  # one row per real target, no padded slot computed

    parameters = [hidden] + list(head.parameters()) + [embedding.weight]
    hidden.requires_grad_(True)
    logits = head(hidden, left, right, relative)
    loss = F.cross_entropy(logits, labels.reshape(-1)[target], reduction="sum")
    gradients = torch.autograd.grad(loss, parameters)

    reference_scores, reference_loss = reference_padded_sbo(head, hidden, pairs, pair_targets)
    reference_gradients = torch.autograd.grad(reference_loss, parameters)

    # Targets are ordered span by span, as the padded layout's real slots in row-major order.
    torch.testing.assert_close(logits, reference_scores[real_slots], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, reference_loss, rtol=1e-12, atol=1e-12)
    names = ["hidden"] + [name for name, _ in head.named_parameters()] + ["embedding (tied decoder)"]
    for name, gradient, expected in zip(names, gradients, reference_gradients):
        assert expected.abs().sum() > 0, name  # every gradient is exercised, not trivially zero
        torch.testing.assert_close(gradient, expected, rtol=1e-10, atol=1e-12, msg=name)


def test_relative_position_row_is_i_minus_s(setup):
    """p_{i-s+1} (1-based, paper) is row i - s (0-based): swapping two rows changes only those targets."""
    head, _, spans, labels, hidden = setup
    left, right, relative, _ = span_targets(spans[:, 0], spans[:, 1], spans[:, 2], hidden.shape[1], head.max_targets)
    with torch.no_grad():
        before = head(hidden, left, right, relative)
        head.position_embeddings.weight[[0, 1]] = head.position_embeddings.weight[[1, 0]]
        after = head(hidden, left, right, relative)
    changed = ~torch.isclose(before, after).all(dim=-1)
    assert torch.equal(changed, (relative == 0) | (relative == 1))


def test_span_targets_indices():
    # block 0: span [2, 4]; block 1: span [1, 7] (7 tokens, capped at 5); length 10
    left, right, relative, target = span_targets(
        torch.tensor([0, 1]), torch.tensor([2, 1]), torch.tensor([4, 7]), 10, max_targets=5
    )
    assert left.tolist() == [1] * 3 + [10] * 5
    assert right.tolist() == [5] * 3 + [18] * 5
    assert relative.tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert target.tolist() == [2, 3, 4, 11, 12, 13, 14, 15]
    empty = span_targets(
        torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 10
    )
    assert all(len(index) == 0 for index in empty)
    with pytest.raises(ValueError, match="both boundary tokens"):
        span_targets(torch.tensor([0]), torch.tensor([0]), torch.tensor([2]), 10)  # no left boundary
    with pytest.raises(ValueError, match="both boundary tokens"):
        span_targets(torch.tensor([0]), torch.tensor([5]), torch.tensor([9]), 10)  # no right boundary


def test_sbo_head_shapes_init_and_own_state():
    embedding = nn.Embedding(40, 24)
    head = SBOHead(32, embedding, max_targets=15)  # factorised: H = 32, E = 24
    assert head.position_embeddings.weight.shape == (15, 200)  # 200 wide whatever H is
    assert head.dense1.weight.shape == (32, 2 * 32 + 200) and head.dense2.weight.shape == (24, 32)
    assert head.decoder_weight is embedding.weight
    assert set(head.state_dict()) == {
        "position_embeddings.weight",
        "dense1.weight",
        "dense1.bias",
        "layer_norm1.weight",
        "layer_norm1.bias",
        "dense2.weight",
        "dense2.bias",
        "layer_norm2.weight",
        "layer_norm2.bias",
        "decoder.bias",
    }  # the tied weight belongs to the backbone and is saved there, once
    assert torch.equal(head.decoder.bias, torch.zeros(40)) and torch.equal(head.layer_norm1.weight, torch.ones(32))
    assert abs(head.dense1.weight.std().item() - 0.02) < 0.003
    logits = head(torch.randn(2, 10, 32), torch.tensor([0, 11]), torch.tensor([3, 14]), torch.tensor([0, 2]))
    assert logits.shape == (2, 40)
