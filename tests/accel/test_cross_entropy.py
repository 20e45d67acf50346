"""spanlm.accel's fused vocabulary cross-entropy equals the plain one in values and gradients."""

import pytest
import torch

from spanlm import accel
from spanlm.accel import native
from spanlm.accel.cross_entropy import FusedCrossEntropies
from spanlm.heads import IGNORE_INDEX, TiedDecoder, VocabTarget, token_cross_entropy, vocab_cross_entropies
from tests.heads.test_losses import decoder_case

pytestmark = pytest.mark.skipif(native.kernels() is None, reason="spanlm's native kernels cannot be built here")


def fused(*decoders: TiedDecoder) -> None:
    """The CPU backend on these decoders, as spanlm.accel.apply puts it on an objective's heads."""
    accel.apply(torch.nn.ModuleList(decoders), torch.device("cpu"))
    assert all(isinstance(d.cross_entropies, FusedCrossEntropies) for d in decoders)


def test_apply_puts_the_fused_path_on_every_tied_decoder_and_off_puts_nothing():
    embedding, decoder, _, _ = decoder_case(4)
    assert accel.apply(torch.nn.ModuleList([decoder]), torch.device("cpu"), "off") == "off"
    assert not hasattr(decoder, "cross_entropies") and type(embedding) is torch.nn.Embedding
    assert accel.apply(torch.nn.ModuleList([decoder]), torch.device("meta")) == "off"  # other devices: nothing
    assert accel.apply(torch.nn.ModuleList([decoder]), torch.device("cpu")) == "cpu"
    assert isinstance(decoder.cross_entropies, FusedCrossEntropies) and type(embedding).__name__ == "TiedEmbedding"


def one(features, decoder, labels, sampler=None):
    return vocab_cross_entropies([VocabTarget(features, decoder, labels, sampler)])[0]


@pytest.mark.parametrize("n_rows, ignored", [(12, 0), (12, 3), (0, 0)])
def test_fused_equals_logits_then_cross_entropy(n_rows, ignored):
    results = []
    for with_backend in (False, True):
        embedding, decoder, features, labels = decoder_case(n_rows, ignored)
        if with_backend:
            fused(decoder)
        loss = one(features, decoder, labels)
        (loss.total * 0.37).backward()  # a non-unit upstream gradient
        results.append((loss, features.grad, embedding.weight.grad, decoder.bias.grad))
    (reference, *reference_grads), (got, *got_grads) = results
    torch.testing.assert_close(got.total, reference.total, atol=1e-5, rtol=1e-6)
    assert got.count.item() == reference.count.item() == n_rows - ignored
    assert got.correct.item() == reference.correct.item()
    for value, expected in zip(got_grads, reference_grads):
        torch.testing.assert_close(value, expected, atol=1e-6, rtol=1e-5)


def test_under_bf16_autocast_the_plain_path_runs():
    embedding, decoder, features, labels = decoder_case(16)
    fused(decoder)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = one(features, decoder, labels)
        reference = token_cross_entropy(decoder(features), labels)
    assert got.total.dtype == torch.float32
    assert got.total.item() == pytest.approx(reference.total.item(), rel=1e-6)


def test_samples_come_from_the_same_rows():
    from spanlm.objectives.electra.rtd import gumbel_max_sample

    embedding, decoder, features, labels = decoder_case(64)
    fused(decoder)
    draw = lambda rows: gumbel_max_sample(rows, 0.7, torch.tensor(3))  # noqa: E731
    sampled = one(features, decoder, labels, draw)
    assert torch.equal(sampled.samples, draw(decoder(features).detach()))  # the row shift leaves the arg-max alone
    plain = one(features, decoder, labels)
    assert sampled.total.item() == pytest.approx(plain.total.item(), rel=1e-6) and plain.samples is None
    sampled.total.backward()
    expected = torch.autograd.grad(token_cross_entropy(decoder(features), labels).total, features)[0]
    torch.testing.assert_close(features.grad, expected, atol=1e-6, rtol=1e-5)


def _reference_gradients(n_rows=12):
    embedding, decoder, features, labels = decoder_case(n_rows)
    token_cross_entropy(decoder(features), labels).total.backward()
    return features.grad, embedding.weight.grad, decoder.bias.grad


def test_the_workspace_is_reused_across_steps():
    embedding, decoder, features, labels = decoder_case(12)
    fused(decoder)
    pointers = []
    for _ in range(3):
        features.grad = embedding.weight.grad = decoder.bias.grad = None
        loss = one(features, decoder, labels)
        pointers.append(decoder.cross_entropies.workspace.buffer.data_ptr())
        loss.total.backward()
        for got, expected in zip((features.grad, embedding.weight.grad, decoder.bias.grad), _reference_gradients()):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        one(features, decoder, labels)
    assert len(set(pointers + [decoder.cross_entropies.workspace.buffer.data_ptr()])) == 1


def test_two_forwards_before_backward_are_both_right():
    embedding, decoder, features, labels = decoder_case(12)
    fused(decoder)
    first = one(features, decoder, labels)
    second = one(features * 1.0, decoder, labels)  # the first still holds the buffer: a new one
    (first.total + second.total).backward()
    for got, expected in zip((features.grad, embedding.weight.grad, decoder.bias.grad), _reference_gradients()):
        torch.testing.assert_close(got, 2 * expected, atol=1e-6, rtol=1e-5)


def test_a_retained_graph_gives_the_same_gradients_twice():
    embedding, decoder, features, labels = decoder_case(12)
    fused(decoder)
    loss = one(features, decoder, labels)
    loss.total.backward(retain_graph=True)
    first = [t.grad.clone() for t in (features, embedding.weight, decoder.bias)]
    for t in (features, embedding.weight, decoder.bias):
        t.grad = None
    loss.total.backward()
    for tensor, expected in zip((features, embedding.weight, decoder.bias), first):
        torch.testing.assert_close(tensor.grad, expected, atol=1e-6, rtol=1e-5)


def test_a_retained_graph_whose_buffer_was_reused_refuses_a_second_backward():
    embedding, decoder, features, labels = decoder_case(12)
    fused(decoder)
    loss = one(features, decoder, labels)
    loss.total.backward(retain_graph=True)
    one(features, decoder, labels)  # reuses the buffer the retained graph's gradient is in
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.total.backward()


def _two_heads_case(ignored: int = 0):
    """Two decoders tied to one embedding, each with its own bias, as SpanBERT's MLM and SBO heads."""
    embedding, first, features, labels = decoder_case(12, ignored, seed=1)
    second = TiedDecoder(embedding)
    torch.nn.init.normal_(second.bias, generator=torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(3)
    other_features = torch.randn(7, 8, generator=generator, requires_grad=True)
    other_labels = torch.randint(0, 50, (7,), generator=generator)
    return embedding, (first, second), (features, other_features), (labels, other_labels)


@pytest.mark.parametrize("upstream", [(0.25, 0.5), (0.5, 0.1), (0.0, 0.5)])
@pytest.mark.parametrize("ignored", [0, 3])
@pytest.mark.parametrize("through_lookup", [False, True])  # the tied lookup on the path: it takes the weight gradient
def test_tied_decoders_decoded_together_equal_each_decoded_alone(upstream, ignored, through_lookup):
    results = []
    for with_backend in (False, True):
        embedding, decoders, features, labels = _two_heads_case(ignored)
        if with_backend:
            fused(*decoders)
        if through_lookup:  # features that depend on the embedding's own lookup, as in a model
            ids = torch.arange(features[0].shape[0]) % 50
            features = (features[0] + embedding(ids), features[1])
        parts = vocab_cross_entropies([VocabTarget(f, d, y) for f, d, y in zip(features, decoders, labels)])
        sum(g * part.total for g, part in zip(upstream, parts)).backward()
        grads = [embedding.weight.grad, *(d.bias.grad for d in decoders)]
        results.append((parts, grads))
    (reference, reference_grads), (got_parts, got_grads) = results
    for got, expected in zip(got_parts, reference):
        torch.testing.assert_close(got.total, expected.total, atol=1e-5, rtol=1e-6)
        assert got.count.item() == expected.count.item() and got.correct.item() == expected.correct.item()
    for got, expected in zip(got_grads, reference_grads):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_tied_decoders_share_one_projection():
    embedding, decoders, features, labels = _two_heads_case()
    fused(*decoders)
    calls = []
    original = torch.mm

    def counting_mm(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "mm", counting_mm)
        vocab_cross_entropies([VocabTarget(f, d, y) for f, d, y in zip(features, decoders, labels)])
    assert len(calls) == 1  # one (12 + 7, E) × (E, V) projection for both heads


def test_ignored_rows_get_no_gradient():
    embedding, decoder, features, labels = decoder_case(12, ignored=5)
    fused(decoder)
    one(features, decoder, labels).total.backward()
    assert not features.grad[:5].any() and features.grad[5:].abs().sum() > 0
    assert (labels == IGNORE_INDEX).sum() == 5
