"""Fused training self-attention: transformers' arithmetic and gradients, the same dropout draws, and
the module's own forward wherever it does not apply."""

import copy
import functools
import pickle

import pytest
import torch
from torch.nn import functional as F

import spanlm.accel.attention as attention
from spanlm import accel
from spanlm.accel.attention import (
    FUSED,
    GROUP_PADDING,
    _SelfAttention,
    _VarlenSelfAttention,
    segment_groups,
    use_fused_self_attention,
)
from spanlm.accel.dropout import apply_dropout, dropout_stream

STOCK = {fused: stock for stock, fused in FUSED.items()}


def _model(family: str, attention_dropout: float = 0.3):
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(
        family,
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=attention_dropout,
    )
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="sdpa")
    accel.apply(model, torch.device("cpu"))
    return model.train()


def _unfused(model):
    model = copy.deepcopy(model)
    for module in model.modules():
        if type(module) in STOCK:
            module.__class__ = STOCK[type(module)]
    return model


def _inputs():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 60, (3, 11), generator=generator)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0  # padding: transformers hands the attention a boolean mask
    return ids, mask


def _run(model, seed=5):
    ids, mask = _inputs()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = torch.linspace(-1, 1, hidden.numel()).view_as(hidden)
    (hidden * weights).sum().backward()
    return hidden.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.fixture
def calls(monkeypatch):
    """How many times the fused function ran."""
    count = {"n": 0}
    apply = _SelfAttention.apply

    def counted(*args):
        count["n"] += 1
        return apply(*args)

    monkeypatch.setattr(_SelfAttention, "apply", counted)
    return count


@pytest.mark.parametrize("family", ["bert", "roberta", "electra"])
def test_equals_the_unfused_layer_with_the_same_dropout_draws(family, calls):
    model = _model(family)
    assert sum(type(m) in STOCK for m in model.modules()) == 2  # one per layer
    hidden, grads = _run(model)
    assert calls["n"] == 2
    expected_hidden, expected_grads = _run(_unfused(model))
    assert calls["n"] == 2  # the unfused copy did not call it
    torch.testing.assert_close(hidden, expected_hidden, atol=1e-6, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        scale = expected_grads[name].abs().max().clamp(min=1e-3)
        torch.testing.assert_close(grad / scale, expected_grads[name] / scale, atol=2e-6, rtol=0, msg=name)


def test_a_different_seed_drops_differently():
    model = _model("bert")
    assert not torch.equal(_run(model, seed=5)[0], _run(model, seed=6)[0])


def _reference(hidden, allowed, heads, scale, keep, keep_scale, wq, bq, wk, bk, wv, bv):
    """Multi-head attention written out: softmax(QKᵀ·scale, masked) ⊙ keep · keep_scale, times V."""
    batch, length, width = hidden.shape

    def split(x):  # (B, L, H) → (B, heads, L, d)
        return x.view(batch, length, heads, width // heads).transpose(1, 2)

    query, key, value = (
        split(F.linear(hidden, wq, bq)),
        split(F.linear(hidden, wk, bk)),
        split(F.linear(hidden, wv, bv)),
    )
    scores = query @ key.transpose(-1, -2) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1) * keep * keep_scale
    return (weights @ value).transpose(1, 2).reshape(batch, length, width)


@pytest.mark.slow
def test_forward_and_gradients_equal_the_formula_in_float64(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    batch, length, width, heads = 2, 5, 8, 2
    keep = (torch.rand(batch, heads, length, length, generator=generator) > 0.3).double()
    monkeypatch.setattr(attention, "dropout_stream", lambda p: (0, 0, 1 / 0.7))
    monkeypatch.setattr(
        attention,
        "apply_dropout",  # the decisions of `keep` (the kernels are float32 only)
        lambda x, out, key, threshold, kept: torch.mul(x, keep.to(x.dtype) * kept, out=out),
    )
    allowed = torch.ones(batch, 1, length, length, dtype=torch.bool)
    allowed[1, :, :, 3:] = False
    inputs = [torch.randn(batch, length, width, dtype=torch.float64, generator=generator, requires_grad=True)]
    for _ in range(3):
        inputs += [
            torch.randn(width, width, dtype=torch.float64, generator=generator, requires_grad=True),
            torch.randn(width, dtype=torch.float64, generator=generator, requires_grad=True),
        ]
    hidden, *parameters = inputs

    def fused(hidden, *parameters):
        return _SelfAttention.apply(hidden, allowed, heads, 0.5, 0.3, *parameters)

    torch.testing.assert_close(
        fused(hidden, *parameters), _reference(hidden, allowed, heads, 0.5, keep, 1 / 0.7, *parameters)
    )
    assert torch.autograd.gradcheck(fused, tuple(inputs))


def _per_block_reference(hidden, bounds, heads, scale, keep_of, keep_scale, *parameters):
    """Each segment of the flattened stream through :func:`_reference` alone, with its dropout keep decisions."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    contexts = [
        _reference(
            rows[start:end].unsqueeze(0), None, heads, scale, keep_of(number, end - start), keep_scale, *parameters
        )[0]
        for number, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]))
    ]
    return torch.cat(contexts).view(hidden.shape)


def _position_keep(shape) -> torch.Tensor:
    """Keep decisions that depend only on (query, key) within a segment, so any grouping of segments draws them
    alike."""
    query, key = torch.arange(shape[-2]).unsqueeze(1), torch.arange(shape[-1])
    return ((query * 7 + key * 3) % 5 != 0).expand(shape)


@pytest.mark.parametrize("padding", [0, 100])  # every segment a product of its own, or short ones grouped
@pytest.mark.slow
def test_varlen_forward_and_gradients_equal_the_per_block_formula_in_float64(monkeypatch, padding):
    monkeypatch.setattr(attention, "segment_groups", functools.partial(segment_groups, padding=padding))
    generator = torch.Generator().manual_seed(0)
    bounds, width, heads = [0, 4, 5, 9, 11, 17], 8, 2  # segments of 4, 1, 4, 2 and 6 tokens in a (1, 17) stream
    monkeypatch.setattr(attention, "dropout_stream", lambda p: (0, 0, 1 / 0.7))
    monkeypatch.setattr(
        attention,
        "apply_dropout",  # position decisions (the kernels are float32 only)
        lambda x, out, key, threshold, kept: torch.mul(x, _position_keep(x.shape).to(x.dtype) * kept, out=out),
    )
    inputs = [torch.randn(1, 17, width, dtype=torch.float64, generator=generator, requires_grad=True)]
    for _ in range(3):
        inputs += [
            torch.randn(width, width, dtype=torch.float64, generator=generator, requires_grad=True),
            torch.randn(width, dtype=torch.float64, generator=generator, requires_grad=True),
        ]
    hidden, *parameters = inputs

    def fused(hidden, *parameters):
        return _VarlenSelfAttention.apply(hidden, bounds, heads, 0.5, 0.3, *parameters)

    expected = _per_block_reference(
        hidden, bounds, heads, 0.5, lambda number, n: _position_keep((1, heads, n, n)).double(), 1 / 0.7, *parameters
    )
    torch.testing.assert_close(fused(hidden, *parameters), expected)
    assert torch.autograd.gradcheck(fused, tuple(inputs))


def _stream_layer():
    layer = _model("bert").encoder.layer[0].attention.self
    hidden = torch.randn(1, 23, 32, generator=torch.Generator().manual_seed(2), requires_grad=True)
    bounds = torch.tensor([0, 9, 10, 16, 23], dtype=torch.int32)  # blocks of 9, 6 and 7 with one pad after the first
    return layer, hidden, bounds


def test_the_fused_varlen_layer_equals_a_per_block_reference_with_its_dropout_draws(calls):
    """Float32 with the real dropout kernel: the keep decisions are the stream's, segment after segment."""
    layer, hidden, bounds = _stream_layer()
    weights = torch.linspace(-1, 1, hidden.numel()).view_as(hidden)
    torch.manual_seed(3)
    output = layer(
        hidden, attention_mask=None, cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=9, max_length_k=9
    )[0]
    assert calls["n"] == 0  # the varlen function, not the padded one
    (grad,) = torch.autograd.grad((output * weights).sum(), hidden)
    torch.manual_seed(3)
    # segment → its (1, heads, n, n) keep decisions: one stream per group, in (head, segment, query, key) order
    keeps = {}
    for group in segment_groups(bounds.tolist()):
        key, threshold, keep_scale = dropout_stream(layer.dropout.p)  # the draw the layer made for the group
        shape = (4, group.count, group.length, group.length)
        keep = apply_dropout(torch.ones(shape), torch.empty(shape), key, threshold, 1.0)
        for row, start in enumerate(group.slots.view(group.count, group.length)[:, 0].tolist()):
            n = int(group.real[row].sum())
            keeps[bounds.tolist().index(start)] = keep[:, row, :n, :n].unsqueeze(0)
    parameters = (
        layer.query.weight,
        layer.query.bias,
        layer.key.weight,
        layer.key.bias,
        layer.value.weight,
        layer.value.bias,
    )
    expected = _per_block_reference(
        hidden, bounds.tolist(), 4, layer.scaling, lambda number, n: keeps[number], keep_scale, *parameters
    )
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), hidden)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)


def test_changing_block_2_leaves_block_1_of_the_fused_varlen_layer_unchanged_forward_and_backward():
    layer, hidden, bounds = _stream_layer()
    results = []
    for replacement in (0.0, 5.0):
        changed = hidden.detach().clone()
        changed[0, 10:16] += replacement  # block 2
        changed.requires_grad_(True)
        layer.zero_grad(set_to_none=True)
        torch.manual_seed(4)
        output = layer(
            changed, attention_mask=None, cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=9, max_length_k=9
        )[0]
        output[0, :9].sum().backward()  # block 1's outputs only
        results.append(
            (output[0, :9].detach(), changed.grad.clone(), {n: p.grad.clone() for n, p in layer.named_parameters()})
        )
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)
    assert results[0][1][0, 9:].abs().sum() == 0  # nothing flows back to the pad or the other blocks
    for name, grad in results[0][2].items():
        torch.testing.assert_close(results[1][2][name], grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("case", ["eval", "no dropout", "autocast", "float mask"])
def test_the_module_forward_runs_where_the_fused_one_does_not_apply(case, calls):
    model = _model("bert", attention_dropout=0.0 if case == "no dropout" else 0.3)
    layer = model.encoder.layer[0].attention.self
    hidden = torch.randn(2, 6, 32)
    mask = torch.zeros(2, 1, 6, 6) if case == "float mask" else None
    if case == "eval":
        model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "autocast"):
        torch.manual_seed(0)
        output = layer(hidden, attention_mask=mask)[0]
        torch.manual_seed(0)
        expected = STOCK[type(layer)].forward(layer, hidden, attention_mask=mask)[0]
    assert calls["n"] == 0
    torch.testing.assert_close(output, expected)


def test_parameters_state_dict_and_copies_are_the_stock_ones():
    model = _model("bert")
    stock = _unfused(model)
    assert model.state_dict().keys() == stock.state_dict().keys()
    layer = model.encoder.layer[0].attention.self
    assert isinstance(layer, STOCK[type(layer)]) and type(layer).__name__ == "FusedBertSelfAttention"
    assert type(copy.deepcopy(model).encoder.layer[0].attention.self) is type(layer)
    assert type(pickle.loads(pickle.dumps(model)).encoder.layer[0].attention.self) is type(layer)
    assert use_fused_self_attention(stock) is stock and type(stock.encoder.layer[0].attention.self) is type(layer)


def test_compiled_graphs_trace_the_module_forward_without_breaks():
    layer = _model("bert").encoder.layer[0].attention.self
    explanation = torch._dynamo.explain(layer)(torch.randn(2, 6, 32))
    assert explanation.graph_break_count == 0
    code = str(explanation.graphs[0].code)
    assert "dropout" in code and "_SelfAttention" not in code  # inductor's own dropout, not the fused function


def test_heads_narrower_than_the_hidden_size_run_the_module_forward(calls):
    from transformers import AutoConfig, AutoModel

    # ELECTRA allows hidden 30 with 4 heads (of 7) when it has an embedding_size: the projections are 28 wide.
    config = AutoConfig.for_model(
        "electra",
        vocab_size=60,
        embedding_size=16,
        hidden_size=30,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
    )
    model = AutoModel.from_config(config, attn_implementation="sdpa")
    accel.apply(model, torch.device("cpu"))
    model.train()
    layer = model.encoder.layer[0].attention.self
    assert type(layer) in STOCK and layer.all_head_size == 28
    assert layer(torch.randn(2, 6, 30))[0].shape == (2, 6, 28)
    assert calls["n"] == 0


def test_segment_groups_cover_every_token_once_with_little_padding():
    lengths = torch.randint(1, 129, (40,), generator=torch.Generator().manual_seed(0))
    bounds = [0, *torch.cumsum(lengths, 0).tolist()]
    groups = segment_groups(bounds)
    assert sorted(torch.cat([g.tokens for g in groups]).tolist()) == list(range(bounds[-1]))
    assert 1 < len(groups) < len(lengths)  # fewer products than segments
    for group in groups:
        real = group.real.sum(1)
        assert group.length == int(real.max()) and (real > 0).all()
        assert group.count * group.length**2 - int((real**2).sum()) <= GROUP_PADDING
        slots = group.slots.view(group.count, group.length)
        assert (
            slots == torch.where(group.real, slots, slots[:, :1])
        ).all()  # padding slots read their segment's first token
