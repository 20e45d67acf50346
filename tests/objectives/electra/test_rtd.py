"""RTD: Gumbel-max sampling, labels, the ELECTRA and DeBERTa-V3 heads, the BCE loss and its counts."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from spanlm.objectives.electra.rtd import DebertaV3RTDHead, ElectraRTDHead, gumbel_max_sample, replace_tokens, rtd_loss


def seeded(seed: int) -> torch.Tensor:
    return torch.tensor(seed)


def test_gumbel_max_samples_the_softmax():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    logits = probs.log().expand(40000, 4)
    samples = gumbel_max_sample(logits, 1.0, seeded(0))
    frequencies = torch.bincount(samples, minlength=4).float() / len(samples)
    assert torch.allclose(frequencies, probs, atol=0.01), frequencies
    # Temperature sharpens (T < 1) or flattens (T > 1) the distribution it samples: softmax(logits / T).
    cold = torch.bincount(gumbel_max_sample(logits, 0.5, seeded(1)), minlength=4).float() / len(samples)
    assert torch.allclose(cold, torch.softmax(probs.log() / 0.5, -1), atol=0.01), cold


def test_gumbel_max_is_a_function_of_its_seed_without_gradient():
    logits = torch.randn(64, 50, requires_grad=True)
    first = gumbel_max_sample(logits, 1.0, seeded(7))
    torch.manual_seed(123)  # the global RNG plays no part
    assert torch.equal(first, gumbel_max_sample(logits, 1.0, seeded(7)))
    assert not torch.equal(first, gumbel_max_sample(logits, 1.0, seeded(8)))
    assert first.grad_fn is None and first.dtype == torch.int64
    with pytest.raises(ValueError, match="temperature"):
        gumbel_max_sample(logits, 0.0, seeded(7))


def test_replaced_means_masked_and_different_from_the_original():
    input_ids = torch.tensor([[2, 4, 4, 4, 3], [2, 4, 4, 3, 0]])  # 4 = [MASK], 0 = pad
    target_index = torch.tensor([1, 2, 3, 6, 7])  # flat b·5 + t
    originals = torch.tensor([10, 11, 12, 13, 14])
    samples = torch.tensor([10, 99, 12, 98, 14])  # positions 1, 3 and 7 drew their original token
    ids, replaced = replace_tokens(input_ids, target_index, samples, originals)
    assert ids.tolist() == [[2, 10, 99, 12, 3], [2, 98, 14, 3, 0]]
    assert replaced.tolist() == [[False, False, True, False, False], [False, True, False, False, False]]


def test_electra_head_is_the_transformers_discriminator_head():
    from transformers import ElectraConfig
    from transformers.models.electra.modeling_electra import ElectraDiscriminatorPredictions

    torch.manual_seed(0)
    config = ElectraConfig(hidden_size=16, hidden_act="gelu")
    reference = ElectraDiscriminatorPredictions(config).eval()
    head = ElectraRTDHead(16)
    with torch.no_grad():
        head.dense.weight.copy_(reference.dense.weight)
        head.dense.bias.copy_(reference.dense.bias)
        head.classifier.weight.copy_(reference.dense_prediction.weight)
        head.classifier.bias.copy_(reference.dense_prediction.bias)
    hidden = torch.randn(2, 5, 16)
    positions = torch.tensor([0, 3, 4, 5, 8])
    expected = reference(hidden).flatten()[positions]  # (B, L) → the scored positions
    assert torch.allclose(head(hidden, positions), expected, atol=1e-6)


def test_deberta_v3_head_adds_each_rows_cls_state_before_the_layer_norm():
    torch.manual_seed(0)
    head = DebertaV3RTDHead(8, layer_norm_eps=1e-7)
    with torch.no_grad():  # non-trivial LayerNorm affine so its place in the chain matters
        head.layer_norm.weight.uniform_(0.5, 1.5)
        head.layer_norm.bias.uniform_(-0.5, 0.5)
    hidden = torch.randn(3, 4, 8)
    # The authors' LMMaskPredictionHead, written out on the full (B, L, H) tensor.
    states = F.layer_norm(hidden[:, :1] + hidden, (8,), head.layer_norm.weight, head.layer_norm.bias, 1e-7)
    expected = F.linear(
        F.gelu(F.linear(states, head.dense.weight, head.dense.bias)), head.classifier.weight, head.classifier.bias
    ).squeeze(-1)  # (B, L)
    positions = torch.tensor([0, 2, 5, 7, 8, 11])
    assert torch.allclose(head(hidden, positions), expected.flatten()[positions], atol=1e-6)


def test_rtd_loss_is_the_mean_bce_and_counts_precision_and_recall():
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, -0.2], requires_grad=True)
    labels = torch.tensor([True, True, False, False, True, False])
    loss = rtd_loss(logits, labels)
    assert torch.allclose(loss.mean, F.binary_cross_entropy_with_logits(logits, labels.float()))
    metrics = {k: float(v) for k, v in loss.metrics().items()}
    # predicted replaced: 0, 2, 4 → true positives 0, 4; 3 replaced in all; correct: 0, 3, 4, 5
    assert metrics["n_rtd"] == 6 and metrics["n_replaced"] == 3 and metrics["n_predicted_replaced"] == 3
    assert metrics["n_true_replaced"] == 2 and metrics["rtd_accuracy"] == pytest.approx(4 / 6)
    assert metrics["rtd_precision"] == pytest.approx(2 / 3) and metrics["rtd_recall"] == pytest.approx(2 / 3)
    loss.mean.backward()
    assert logits.grad is not None and bool((logits.grad != 0).all())


def test_pad_positions_never_reach_the_loss():
    """Only the gathered (non-pad) rows are scored: whatever the pad rows hold, the loss is the same."""
    torch.manual_seed(0)
    head = ElectraRTDHead(8)
    hidden = torch.randn(2, 6, 8)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    labels = torch.zeros(2, 6, dtype=torch.bool)
    labels[0, 1] = labels[1, 3] = True
    positions = mask.flatten().nonzero().squeeze(1)
    before = rtd_loss(head(hidden, positions), labels.flatten()[positions])
    hidden[0, 4:] = 1e4  # garbage at the pads
    labels[0, 4:] = True
    after = rtd_loss(head(hidden, positions), labels.flatten()[positions])
    assert int(after.count) == 10 and torch.equal(before.total, after.total) and int(after.replaced) == 2


def test_an_empty_batch_is_zero_not_nan():
    loss = rtd_loss(torch.zeros(0), torch.zeros(0, dtype=torch.bool))
    assert float(loss.mean) == 0.0 and all(torch.isfinite(v.float()) for v in loss.metrics().values())


def lowbias32(x: int) -> int:
    """Wellons' lowbias32 on a Python int (uint32 arithmetic)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_uniforms_are_hashes_of_the_seed_row_and_column():
    from spanlm.objectives.electra.rtd import uniforms

    seed = 2**62 + 12345  # both 32-bit halves matter
    key = lowbias32((seed & 0xFFFFFFFF) ^ lowbias32(((seed >> 32) + 0x9E3779B9) & 0xFFFFFFFF))
    expected = []
    for row in range(3):
        row_key = lowbias32((key + row * 0x9E3779B9) & 0xFFFFFFFF)
        expected.append([((lowbias32(lowbias32(col) ^ row_key) >> 8) + 0.5) * 2.0**-24 for col in range(4)])
    assert torch.equal(uniforms(torch.tensor(seed), (3, 4), torch.device("cpu")), torch.tensor(expected))


def test_gumbel_max_samples_the_softmax_by_a_chi_square_test_in_bfloat16_too():
    from scipy.stats import chisquare

    probs = torch.tensor([0.4, 0.2, 0.15, 0.1, 0.08, 0.05, 0.02])
    for dtype, seed in ((torch.float32, 0), (torch.bfloat16, 1)):
        logits = probs.log().to(dtype).expand(50000, -1)
        counts = torch.bincount(gumbel_max_sample(logits, 1.0, seeded(seed)), minlength=len(probs))
        expected = torch.softmax(probs.log().to(dtype).double(), -1) * len(logits)  # the logits as given
        assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3, counts


def test_gumbel_max_makes_no_int64_and_no_float32_copy_of_the_logits():
    """The noise is one float32 (N, V) buffer made from one int32 one: no int64 tensor of the logits' size (the
    SplitMix64 counters this replaced) and the bfloat16 logits are never converted to a float32 copy."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self, logits):
            super().__init__()
            self.made, self.reading_logits, self.logits = [], [], logits.data_ptr()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(isinstance(a, torch.Tensor) and a.data_ptr() == self.logits for a in args):
                self.reading_logits.append(str(func))
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor):
                    self.made.append((str(func), tensor.dtype, tensor.numel()))
            return out

    logits = torch.randn(64, 500).to(torch.bfloat16)
    with Record(logits) as record:
        gumbel_max_sample(logits, 1.0, seeded(3))
    assert not [m for m in record.made if m[1] == torch.int64 and m[2] >= logits.numel()], record.made
    assert record.reading_logits == ["aten.add_.Tensor"]  # added into the float32 noise, in its own dtype
