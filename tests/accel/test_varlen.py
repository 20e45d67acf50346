"""Attention over a packed stream (spanlm.accel.varlen): every path that runs on the CPU equals per-block SDPA,
forward and backward; the CPU path compiles as one graph; paths and devices are chosen by name; the trainer's
choice is set before the first forward. The CUDA kernel itself: tests/gpu/test_varlen.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel

from spanlm import accel
from spanlm.accel import varlen
from spanlm.models.packed import VARLEN_ATTENTION, encoder_states

LENGTHS = [5, 1, 7, 3]  # a one-token segment too (a lone pad between blocks)
BOUNDS = torch.tensor([0, 5, 6, 13, 16], dtype=torch.int32)


def tokens(seed: int = 0, dtype=torch.float64):
    """query, key, value token-major (T, heads, d), leaves that require gradients."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(sum(LENGTHS), 2, 8, generator=generator, dtype=dtype, requires_grad=True) for _ in range(3)]


def per_block_reference(query, key, value, scale, window=None):
    """Each segment on its own, in (1, heads, n, d) SDPA calls: the definition of packed attention; with a
    ``window``, each query sees the keys of its segment at distance ≤ window (a loop over pairs: the definition)."""

    def band(n):
        if window is None:
            return None
        return torch.tensor([[abs(i - j) <= window for j in range(n)] for i in range(n)])

    return torch.cat(
        [
            F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                k.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                attn_mask=band(q.shape[0]),
                scale=scale,
            )[0].transpose(0, 1)
            for q, k, v in zip(query.split(LENGTHS), key.split(LENGTHS), value.split(LENGTHS))
        ]
    )


@pytest.mark.parametrize("name", sorted(varlen.PACKED_PATHS))
def test_every_path_equals_per_block_attention_forward_and_backward(name):
    """On the CPU, "flash" is not applicable and runs its fallback; each path is exact in float64."""
    inputs = tokens()
    context = varlen.PACKED_PATHS[name](*inputs, BOUNDS, max(LENGTHS), 0.0, 0.3)
    reference = per_block_reference(*inputs, 0.3)
    torch.testing.assert_close(context, reference)
    weights = torch.linspace(-1, 1, context.numel(), dtype=context.dtype).view_as(context)
    torch.testing.assert_close(
        torch.autograd.grad((context * weights).sum(), inputs),
        torch.autograd.grad((reference * weights).sum(), inputs),
    )


@pytest.mark.parametrize("name", sorted(varlen.PACKED_PATHS))
def test_every_path_keeps_a_sliding_window_inside_each_segment(name):
    """ModernBERT's local layers: a query sees the keys of its own segment within the window, forward and backward
    (on the CPU "flash" runs its fallback; the kernel's own window: tests/gpu/test_varlen.py)."""
    inputs = tokens(1)
    context = varlen.PACKED_PATHS[name](*inputs, BOUNDS, max(LENGTHS), 0.0, None, 2)
    reference = per_block_reference(*inputs, None, window=2)
    torch.testing.assert_close(context, reference)
    torch.testing.assert_close(torch.autograd.grad(context.sum(), inputs), torch.autograd.grad(reference.sum(), inputs))
    assert not torch.allclose(context, per_block_reference(*inputs, None))  # the window changed something


def test_the_repadded_path_accepts_a_longest_rounded_up():
    """The width only has to hold the longest segment: a bucketed max_seq_len gives the same context."""
    inputs = tokens()
    torch.testing.assert_close(
        varlen.repadded_attention(*inputs, BOUNDS, 16, 0.0, None), per_block_reference(*inputs, None)
    )


@pytest.mark.slow
def test_the_cpu_path_compiles_as_one_graph_and_equals_the_reference():
    """Under torch.compile the per-segment loop (a host read of the bounds) gives way to the padded-again path."""
    inputs = tokens(dtype=torch.float32)

    def attend(query, key, value, bounds):
        return varlen.packed_attention(
            None,
            *(x.view(1, -1, 2, 8).transpose(1, 2) for x in (query, key, value)),
            None,
            scaling=0.3,
            cu_seq_lens_q=bounds,
            cu_seq_lens_k=bounds,
            max_length_q=max(LENGTHS),
            max_length_k=max(LENGTHS),
        )[0]

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(attend)(*inputs, BOUNDS)
    assert explanation.graph_break_count == 0, [reason.reason for reason in explanation.break_reasons]
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")(*inputs, BOUNDS)
    reference = per_block_reference(*inputs, 0.3)
    torch.testing.assert_close(compiled[0], reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        torch.autograd.grad(compiled.sum(), inputs),
        torch.autograd.grad(reference.sum(), inputs),
        rtol=1e-5,
        atol=1e-6,
    )


def test_each_device_takes_its_path_by_name_and_a_new_one_can_be_registered(monkeypatch):
    monkeypatch.setattr(varlen, "PACKED_PATHS", dict(varlen.PACKED_PATHS))
    monkeypatch.setattr(varlen, "DEVICE_PATHS", dict(varlen.DEVICE_PATHS))
    assert varlen.path_for(torch.empty(0)) == "segments"
    assert varlen.path_for(torch.empty(0, device="meta")) == "repadded"  # a device without a path of its own
    calls = []

    def mine(query, key, value, bounds, longest, dropout, scale, window):
        calls.append(longest)
        return varlen.repadded_attention(query, key, value, bounds, longest, dropout, scale, window)

    varlen.register_path("mine", mine, device_type="cpu")
    inputs = [x.detach().view(1, -1, 2, 8).transpose(1, 2) for x in tokens()]
    context, _ = varlen.packed_attention(None, *inputs, None, cu_seq_lens_q=BOUNDS, max_length_q=7)
    assert calls == [7] and context.shape == (1, 16, 2, 8)


def test_packing_by_default_is_the_backends_decision_per_device():
    assert accel.packs_by_default(torch.device("cpu")) and accel.packs_by_default(torch.device("cuda"))
    assert not accel.packs_by_default(torch.device("meta"))


def test_apply_sets_a_packed_runs_encoders_before_the_first_forward_and_keeps_the_state_dict():
    config = AutoConfig.for_model(
        "bert",
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )
    model = AutoModel.from_config(config, attn_implementation="sdpa").eval()
    keys = list(model.state_dict())
    accel.apply(model, torch.device("cpu"), "off")
    assert model.config._attn_implementation == "sdpa"  # a padded run: untouched
    accel.apply(model, torch.device("cpu"), "off", packed=True)
    assert model.config._attn_implementation == VARLEN_ATTENTION and list(model.state_dict()) == keys
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS[VARLEN_ATTENTION] is varlen.packed_attention
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    with torch.no_grad():
        packed = encoder_states(
            model,
            ids,
            torch.ones_like(ids),
            positions,
            cu_seq_lens=torch.tensor([0, 5, 8], dtype=torch.int32),
            max_seq_len=5,
        )[0]
        alone = [
            encoder_states(model, ids[:, a:b], torch.ones(1, b - a, dtype=torch.long))[0] for a, b in ((0, 5), (5, 8))
        ]
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-5)
