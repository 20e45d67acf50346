"""Loss normalisation: L = MLM_sum / n_mlm + w_sbo · SBO_sum / (n_sbo + 1), checked by hand."""

import math

import pytest
import torch
from torch.nn import functional as F

from spanlm.heads import (
    IGNORE_INDEX,
    TiedDecoder,
    VocabTarget,
    masked_lm_loss,
    span_bert_loss,
    token_cross_entropy,
    vocab_cross_entropies,
)

LN2 = math.log(2.0)
# Two logit rows over a 3-token vocabulary with simple softmaxes:
P = [0.0, LN2, 0.0]  # probabilities (1/4, 1/2, 1/4), arg-max 1
Q = [LN2, 0.0, 0.0]  # probabilities (1/2, 1/4, 1/4), arg-max 0


def hand_batch():
    # MLM: P→1 (−log ½ = ln2, right), P→0 (ln4, wrong), Q→0 (ln2, right): sum 4·ln2 over 3 targets
    mlm_logits = torch.tensor([P, P, Q], requires_grad=True)
    mlm_labels = torch.tensor([1, 0, 0])
    # SBO: Q→2 (ln4, wrong), P→1 (ln2, right): sum 3·ln2 over 2 targets, divided by 2 + 1
    sbo_logits = torch.tensor([Q, P], requires_grad=True)
    sbo_labels = torch.tensor([2, 1])
    return mlm_logits, mlm_labels, sbo_logits, sbo_labels


def loss_of(mlm_logits, mlm_labels, sbo_logits, sbo_labels, w_sbo=1.0):
    return span_bert_loss(
        token_cross_entropy(mlm_logits, mlm_labels), token_cross_entropy(sbo_logits, sbo_labels), w_sbo
    )


def test_span_bert_loss_on_a_hand_built_batch():
    out = loss_of(*hand_batch())
    assert out["mlm_loss"].item() == pytest.approx(4 * LN2 / 3)
    assert out["sbo_loss"].item() == pytest.approx(3 * LN2 / 3)  # the "+1": not the mean 1.5·ln2
    assert out["loss"].item() == pytest.approx(7 * LN2 / 3)
    assert out["n_mlm"].item() == 3 and out["n_sbo"].item() == 2
    assert out["mlm_accuracy"].item() == pytest.approx(2 / 3)
    assert out["sbo_accuracy"].item() == pytest.approx(1 / 2)
    weighted = loss_of(*hand_batch(), w_sbo=0.5)
    assert weighted["loss"].item() == pytest.approx(4 * LN2 / 3 + 0.5 * LN2)
    assert weighted["sbo_loss"].item() == pytest.approx(LN2)  # logged before the weight


def test_gradient_is_that_of_the_normalised_sums():
    mlm_logits, mlm_labels, sbo_logits, sbo_labels = hand_batch()
    loss_of(mlm_logits, mlm_labels, sbo_logits, sbo_labels)["loss"].backward()
    # d CE / d logits = softmax − onehot, scaled by 1/3 for MLM rows and 1/(2+1) for SBO rows
    expected_mlm = (torch.softmax(mlm_logits.detach(), -1) - F.one_hot(mlm_labels, 3)) / 3
    expected_sbo = (torch.softmax(sbo_logits.detach(), -1) - F.one_hot(sbo_labels, 3)) / 3
    torch.testing.assert_close(mlm_logits.grad, expected_mlm)
    torch.testing.assert_close(sbo_logits.grad, expected_sbo)


def test_zero_targets_give_a_finite_zero_loss_and_gradient():
    vocab = 7
    mlm_logits = torch.zeros(0, vocab, requires_grad=True)
    sbo_logits = torch.zeros(0, vocab, requires_grad=True)
    empty = torch.zeros(0, dtype=torch.long)
    out = loss_of(mlm_logits, empty, sbo_logits, empty)
    assert out["loss"].item() == 0.0 and out["mlm_loss"].item() == 0.0 and out["sbo_loss"].item() == 0.0
    assert out["mlm_accuracy"].item() == 0.0
    out["loss"].backward()
    assert mlm_logits.grad.shape == (0, vocab)
    # zero MLM targets next to real SBO targets: only the SBO part counts
    _, _, sbo_logits, sbo_labels = hand_batch()
    out = loss_of(torch.zeros(0, 3), empty, sbo_logits, sbo_labels)
    assert out["loss"].item() == pytest.approx(LN2)
    assert masked_lm_loss(token_cross_entropy(torch.zeros(0, 3), empty))["loss"].item() == 0.0


def test_ignored_rows_do_not_count():
    mlm_logits, mlm_labels, _, _ = hand_batch()
    labels = torch.cat([mlm_labels, torch.tensor([IGNORE_INDEX])])
    logits = torch.cat([mlm_logits, torch.tensor([[9.0, 0.0, 0.0]])])
    out = masked_lm_loss(token_cross_entropy(logits, labels))
    assert out["loss"].item() == pytest.approx(4 * LN2 / 3)
    assert out["n_mlm"].item() == 3 and out["mlm_accuracy"].item() == pytest.approx(2 / 3)


def test_cross_entropy_is_float32_under_bf16_autocast():
    torch.manual_seed(0)
    hidden = torch.randn(64, 32)
    weight = torch.randn(1000, 32, requires_grad=True)
    labels = torch.randint(0, 1000, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = hidden @ weight.T
        assert logits.dtype == torch.bfloat16
        out = loss_of(logits, labels, logits[:10], labels[:10])
    assert out["loss"].dtype == torch.float32
    reference = (
        F.cross_entropy(logits.float(), labels, reduction="sum") / 64
        + F.cross_entropy(logits[:10].float(), labels[:10], reduction="sum") / 11
    )
    assert out["loss"].item() == pytest.approx(reference.item(), rel=1e-6)
    out["loss"].backward()
    assert torch.isfinite(weight.grad).all()


def decoder_case(n_rows: int, ignored: int = 0, seed: int = 0):
    """A decoder tied to a 50 × 8 embedding, ``n_rows`` feature rows and labels (the first ``ignored`` ignored)."""
    generator = torch.Generator().manual_seed(seed)
    embedding = torch.nn.Embedding(50, 8)
    torch.nn.init.normal_(embedding.weight, generator=generator)
    decoder = TiedDecoder(embedding)
    torch.nn.init.normal_(decoder.bias, generator=generator)
    features = torch.randn(n_rows, 8, generator=generator, requires_grad=True)
    labels = torch.randint(0, 50, (n_rows,), generator=generator)
    labels[:ignored] = IGNORE_INDEX
    return embedding, decoder, features, labels


def test_vocab_cross_entropies_are_the_decoders_logits_then_cross_entropy():
    embedding, decoder, features, labels = decoder_case(12, ignored=3)
    (loss,) = vocab_cross_entropies([VocabTarget(features, decoder, labels)])
    reference = F.cross_entropy(
        features @ embedding.weight.T + decoder.bias, labels, reduction="sum", ignore_index=IGNORE_INDEX
    )
    assert loss.total.item() == pytest.approx(reference.item(), rel=1e-6)
    assert loss.count.item() == 9 and loss.samples is None


def test_vocab_cross_entropies_sample_from_the_log_probabilities():
    from spanlm.objectives.electra.rtd import gumbel_max_sample

    embedding, decoder, features, labels = decoder_case(64)
    draw = lambda rows: gumbel_max_sample(rows, 0.7, torch.tensor(3))  # noqa: E731
    (loss,) = vocab_cross_entropies([VocabTarget(features, decoder, labels, draw)])
    assert torch.equal(loss.samples, draw(torch.log_softmax(decoder(features).detach(), dim=-1)))


def test_a_decoder_with_cross_entropies_computes_the_targets_itself():
    embedding, decoder, features, labels = decoder_case(4)
    seen = []
    decoder.cross_entropies = lambda targets: seen.append(targets) or ["computed"]
    assert vocab_cross_entropies([VocabTarget(features, decoder, labels)]) == ["computed"] and len(seen) == 1
