"""DeBERTa's disentangled attention through one fused call (spanlm.accel.disentangled) against transformers' own
module: the same outputs and gradients in float32, with padding, log-bucketed distances and each layout of the
relative terms."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import DEBERTA_V2, DEBERTA_V2_C2P, DEBERTA_V3, assert_same_gradients, tiny_deberta
from spanlm.accel.disentangled import (
    FusedDisentangledSelfAttention,
    _flex,
    _sdpa,
    use_fused_disentangled_attention,
)


def models(layout: dict):
    theirs = tiny_deberta(layout)
    ours = copy.deepcopy(theirs)
    use_fused_disentangled_attention(ours)
    assert isinstance(ours.encoder.layer[0].attention.self, FusedDisentangledSelfAttention)
    return theirs, ours


def batch(length: int = 40):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (3, length), generator=generator)
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, 25:] = 0  # padding
    mask[2, 7:] = 0
    return ids, mask


@pytest.mark.parametrize("layout", [DEBERTA_V3, DEBERTA_V2_C2P, DEBERTA_V2], ids=["v3", "v2-c2p", "v2-both"])
def test_outputs_and_gradients_are_transformers(layout):
    theirs, ours = models(layout)
    ids, mask = batch()
    # a loss of random weights on the tokens (a sum of squares after the last LayerNorm would be constant)
    weights = torch.randn(*ids.shape, 32, generator=torch.Generator().manual_seed(3)) * mask[..., None]
    outputs = []
    for model in (theirs, ours):
        model.train()
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        (hidden * weights).sum().backward()
        outputs.append(hidden)
    # every row, padding too (its queries spread evenly over the row, as transformers' masked softmax does)
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
    assert_same_gradients(theirs, ours)


def test_attention_dropout_drops_in_training_only():
    theirs, ours = models(DEBERTA_V3)
    for model in (theirs, ours):
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.5
    ids, mask = batch()
    ours.eval()
    theirs.eval()
    torch.testing.assert_close(ours(ids, mask).last_hidden_state, theirs(ids, mask).last_hidden_state)
    ours.train()
    first, second = (ours(ids, mask).last_hidden_state for _ in range(2))
    assert not torch.allclose(first, second)


def test_flex_equals_the_gathered_bias_on_token_rows():
    """The CUDA path's score modification (run here by FlexAttention's reference loop) reads the same terms at
    the same buckets as the gathered bias; rows whose query is padding are nobody's output."""
    from spanlm.accel.disentangled import _relative_buckets

    generator = torch.Generator().manual_seed(2)
    batch_size, heads, length, width, span = 2, 2, 40, 8, 8
    query, key, value = (torch.randn(batch_size, heads, length, width, generator=generator) for _ in range(3))
    c2p, p2c = (torch.randn(batch_size, heads, length, 2 * span, generator=generator) for _ in range(2))
    offsets = _relative_buckets(length, span, span, 32, torch.device("cpu"))
    tokens = torch.ones(batch_size, length, dtype=torch.bool)
    tokens[1, 30:] = False
    mask = tokens[:, None, :, None] & tokens[:, None, None, :]  # (B, 1, L, L)
    expected = _sdpa(query, key, value, mask, c2p, p2c, offsets, 0.25, 0.0)
    with pytest.warns(UserWarning):  # the uncompiled loop says it is one
        got = _flex(query, key, value, mask, c2p, p2c, offsets, 0.25)
    rows = tokens[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[rows], expected[rows], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "device, mode, fused", [("cuda", "auto", True), ("cuda", "off", False), ("cpu", "auto", False)]
)
def test_the_trainer_puts_it_in_on_cuda_only(device, mode, fused):
    """accel.apply (what the trainer calls) swaps the attention's class on CUDA under train.accel: auto; on the CPU
    it measured no faster than transformers' own (BENCHMARKS.md), so it stays out."""
    from spanlm import accel

    model, _ = models(DEBERTA_V3)
    accel.apply(model, torch.device(device), mode)
    assert isinstance(model.encoder.layer[0].attention.self, FusedDisentangledSelfAttention) == fused


@pytest.mark.parametrize("layout", [DEBERTA_V3, DEBERTA_V2], ids=["v3", "v2-both"])
def test_a_packed_stream_projects_once_and_attends_as_transformers_per_segment(layout):
    """A packed stream (spanlm.models.packed_deberta): the fused class lays out only the queries, keys and values,
    and gives the outputs and gradients of transformers' attention run on the segments' rows."""
    from spanlm.models.packed import encoder_states

    theirs, ours = models(layout)
    ids = torch.randint(5, 100, (1, 30), generator=torch.Generator().manual_seed(4))
    ids[0, 12:14] = 0  # padding after the first block: a segment of its own
    real = (ids != 0).long()
    positions = torch.tensor([[*range(12), 1, 1, *range(9), *range(7)]])
    bounds = torch.tensor([0, 12, 14, 23, 30], dtype=torch.int32)
    weights = torch.randn(1, 30, 32, generator=torch.Generator().manual_seed(3)) * real[..., None]
    outputs = []
    for model in (theirs, ours):
        model.train()
        hidden = encoder_states(model, ids, real, positions, cu_seq_lens=bounds, max_seq_len=12)
        (hidden * weights).sum().backward()
        outputs.append(hidden[real.bool()])
    assert isinstance(ours.encoder.layer[0].attention.self, FusedDisentangledSelfAttention)  # not switched back
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
    assert_same_gradients(theirs, ours)
