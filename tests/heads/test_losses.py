"""Loss normalisation: L = MLM_sum / n_mlm + w_sbo · SBO_sum / (n_sbo + 1), checked by hand."""

import math

import pytest
import torch
from torch.nn import functional as F

from spanlm import native
from spanlm.heads import (
    IGNORE_INDEX,
    DecodedTarget,
    TiedDecoder,
    count_targets,
    decoded_cross_entropies,
    decoded_cross_entropy,
    masked_lm_loss,
    masked_lm_weight,
    span_bert_loss,
    span_bert_weights,
    token_cross_entropy,
)
from spanlm.heads.losses import _decode

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
    return span_bert_loss(token_cross_entropy(mlm_logits, mlm_labels), token_cross_entropy(sbo_logits, sbo_labels), w_sbo)


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
    reference = F.cross_entropy(logits.float(), labels, reduction="sum") / 64 \
        + F.cross_entropy(logits[:10].float(), labels[:10], reduction="sum") / 11
    assert out["loss"].item() == pytest.approx(reference.item(), rel=1e-6)
    out["loss"].backward()
    assert torch.isfinite(weight.grad).all()


@pytest.fixture(params=["native", "pytorch"])
def cross_entropy_path(request, monkeypatch):
    """Both ways the decoded cross-entropy runs: spanlm.native's compiled kernel, and the PyTorch passes."""
    if request.param == "pytorch":
        monkeypatch.setattr(native, "kernels", lambda: None)
    elif native.kernels() is None:
        pytest.skip("spanlm's native kernels cannot be built on this machine")
    return request.param


def _decoder_case(n_rows: int, ignored: int = 0, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    embedding = torch.nn.Embedding(50, 8)
    torch.nn.init.normal_(embedding.weight, generator=generator)
    decoder = TiedDecoder(embedding)
    torch.nn.init.normal_(decoder.bias, generator=generator)
    features = torch.randn(n_rows, 8, generator=generator, requires_grad=True)
    labels = torch.randint(0, 50, (n_rows,), generator=generator)
    labels[:ignored] = IGNORE_INDEX
    return embedding, decoder, features, labels


@pytest.mark.parametrize("n_rows, ignored", [(12, 0), (12, 3), (0, 0)])
def test_decoded_cross_entropy_equals_logits_then_cross_entropy(n_rows, ignored, cross_entropy_path):
    results = []
    for fused in (False, True):
        embedding, decoder, features, labels = _decoder_case(n_rows, ignored)
        loss = decoded_cross_entropy(features, decoder, labels) if fused else token_cross_entropy(decoder(features), labels)
        (loss.total * 0.37).backward()  # a non-unit upstream gradient
        results.append((loss, features.grad, embedding.weight.grad, decoder.bias.grad))
    (reference, *reference_grads), (fused, *fused_grads) = results
    torch.testing.assert_close(fused.total, reference.total, atol=1e-5, rtol=1e-6)
    assert fused.count.item() == reference.count.item() == n_rows - ignored
    assert fused.correct.item() == reference.correct.item()
    for got, expected in zip(fused_grads, reference_grads):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_decoded_cross_entropy_under_bf16_autocast():
    embedding, decoder, features, labels = _decoder_case(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = decoded_cross_entropy(features, decoder, labels)
        reference = token_cross_entropy(decoder(features), labels)
    assert fused.total.dtype == torch.float32
    assert fused.total.item() == pytest.approx(reference.total.item(), rel=1e-5)
    fused.total.backward()
    assert features.grad.dtype == torch.float32 and embedding.weight.grad.dtype == torch.float32
    assert torch.isfinite(features.grad).all() and torch.isfinite(embedding.weight.grad).all()


def test_decoded_cross_entropy_samples_from_the_same_rows():
    from spanlm.heads.rtd import gumbel_max_sample

    embedding, decoder, features, labels = _decoder_case(64)
    draw = lambda rows: gumbel_max_sample(rows, 0.7, torch.tensor(3))  # noqa: E731
    fused = decoded_cross_entropy(features, decoder, labels, sampler=draw)
    assert torch.equal(fused.samples, draw(decoder(features).detach()))  # the row shift leaves the arg-max alone
    assert fused.total.item() == pytest.approx(decoded_cross_entropy(features, decoder, labels).total.item(), rel=1e-6)
    assert decoded_cross_entropy(features, decoder, labels).samples is None


def _reference_gradients(n_rows=12):
    embedding, decoder, features, labels = _decoder_case(n_rows)
    token_cross_entropy(decoder(features), labels).total.backward()
    return features.grad, embedding.weight.grad, decoder.bias.grad


def test_decoded_cross_entropy_reuses_its_workspace_across_steps(cross_entropy_path):
    embedding, decoder, features, labels = _decoder_case(12)
    pointers = []
    for _ in range(3):
        features.grad = embedding.weight.grad = decoder.bias.grad = None
        loss = decoded_cross_entropy(features, decoder, labels)
        pointers.append(decoder.workspace.buffer.data_ptr())
        loss.total.backward()
        for got, expected in zip((features.grad, embedding.weight.grad, decoder.bias.grad), _reference_gradients()):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        decoded_cross_entropy(features, decoder, labels)
    assert len(set(pointers + [decoder.workspace.buffer.data_ptr()])) == 1


def test_decoded_cross_entropy_two_forwards_before_backward_are_both_right():
    embedding, decoder, features, labels = _decoder_case(12)
    first = decoded_cross_entropy(features, decoder, labels)
    second = decoded_cross_entropy(features * 1.0, decoder, labels)  # reuses the buffer the first forward used
    (first.total + second.total).backward()
    for got, expected in zip((features.grad, embedding.weight.grad, decoder.bias.grad), _reference_gradients()):
        torch.testing.assert_close(got, 2 * expected, atol=1e-6, rtol=1e-5)


def test_a_retained_graph_gives_the_same_gradients_twice(cross_entropy_path):
    embedding, decoder, features, labels = _decoder_case(12)
    loss = decoded_cross_entropy(features, decoder, labels)
    loss.total.backward(retain_graph=True)  # hands over the gradients formed in the forward pass
    first = [t.grad.clone() for t in (features, embedding.weight, decoder.bias)]
    for t in (features, embedding.weight, decoder.bias):
        t.grad = None
    loss.total.backward()  # forms them again from the saved inputs
    for tensor, expected in zip((features, embedding.weight, decoder.bias), first):
        torch.testing.assert_close(tensor.grad, expected, atol=1e-6, rtol=1e-5)


def _two_heads_case(ignored: int = 0):
    """Two decoders tied to one embedding, each with its own bias, as SpanBERT's MLM and SBO heads."""
    embedding, first, features, labels = _decoder_case(12, ignored, seed=1)
    second = TiedDecoder(embedding)
    torch.nn.init.normal_(second.bias, generator=torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(3)
    other_features = torch.randn(7, 8, generator=generator, requires_grad=True)
    other_labels = torch.randint(0, 50, (7,), generator=generator)
    return embedding, (first, second), (features, other_features), (labels, other_labels)


@pytest.mark.parametrize("announced, upstream", [
    ((0.25, 0.5), (0.25, 0.5)),    # as announced: the gradients formed in the forward pass
    ((0.25, 0.5), (0.125, 0.25)),  # a common factor (gradient accumulation): rescaled
    ((0.25, 0.5), (0.5, 0.1)),     # out of proportion: formed again
    ((0.0, 0.5), (0.0, 0.5)),      # a part weighted 0
])
@pytest.mark.parametrize("ignored", [0, 3])
@pytest.mark.parametrize("block_rows", [32, 5])  # one block per part; several, the last one short
def test_tied_decoders_decoded_together_equal_each_decoded_alone(announced, upstream, ignored, block_rows, monkeypatch, cross_entropy_path):
    from spanlm.heads import losses

    monkeypatch.setattr(losses, "ROWS_PER_BLOCK", block_rows)
    results = []
    for together in (False, True):
        embedding, decoders, features, labels = _two_heads_case(ignored)
        if together:
            parts = decoded_cross_entropies([DecodedTarget(f, d, y, w) for f, d, y, w in zip(features, decoders, labels, announced)])
        else:
            parts = [token_cross_entropy(d(f), y) for f, d, y in zip(features, decoders, labels)]
        sum(g * part.total for g, part in zip(upstream, parts)).backward()
        grads = [embedding.weight.grad, *(d.bias.grad for d in decoders), *(f.grad for f in features)]
        results.append((parts, grads))
    (reference, reference_grads), (fused, fused_grads) = results
    for got, expected in zip(fused, reference):
        torch.testing.assert_close(got.total, expected.total, atol=1e-5, rtol=1e-6)
        assert got.count.item() == expected.count.item() and got.correct.item() == expected.correct.item()
    for got, expected in zip(fused_grads, reference_grads):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_tied_decoders_share_one_projection():
    embedding, decoders, features, labels = _two_heads_case()
    calls = []
    original = torch.mm

    def counting_mm(*args, **kwargs):
        calls.append(args[1].shape if len(args) > 1 else None)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "mm", counting_mm)
        decoded_cross_entropies([DecodedTarget(f, d, y) for f, d, y in zip(features, decoders, labels)])
    assert len(calls) == 1  # one (12 + 7, E) × (E, V) projection for both heads


@pytest.mark.parametrize("w_sbo", [1.0, 0.7])
def test_the_loss_weights_announce_what_span_bert_loss_backpropagates(w_sbo):
    """With the weights of span_bert_weights / masked_lm_weight, backward only hands over the gradients
    formed in the forward pass: the (N, V) pass runs once."""
    from spanlm.heads import losses

    embedding, decoders, features, labels = _two_heads_case(ignored=3)
    counts = [count_targets(y) for y in labels]
    with pytest.MonkeyPatch.context() as patch:
        calls = []
        patch.setattr(losses, "_decode", lambda *a, **k: calls.append(1) or _decode(*a, **k))
        weights = span_bert_weights(*counts, w_sbo)
        mlm, sbo = decoded_cross_entropies([DecodedTarget(f, d, y, w) for f, d, y, w in zip(features, decoders, labels, weights)])
        span_bert_loss(mlm, sbo, w_sbo)["loss"].backward()
        assert len(calls) == 1
        (alone,) = decoded_cross_entropies([DecodedTarget(features[0], decoders[0], labels[0], masked_lm_weight(counts[0]))])
        masked_lm_loss(alone)["loss"].backward()
        assert len(calls) == 2
