"""ModernBERT's GeGLU gate as one autograd function (spanlm.accel.glu): transformers' values and gradients, in the
function and in a whole model, and only where it applies."""

from __future__ import annotations

import copy

import torch
import transformers

from spanlm.accel.glu import FusedGegluModernBertMLP, _GatedGelu, use_fused_geglu


def test_the_gate_and_its_gradient_are_gelu_of_the_input_half_times_the_gate_half():
    generator = torch.Generator().manual_seed(0)
    projected = torch.randn(3, 5, 12, generator=generator, dtype=torch.float64, requires_grad=True)
    inputs, gate = projected.chunk(2, dim=-1)
    torch.testing.assert_close(_GatedGelu.apply(projected), torch.nn.functional.gelu(inputs) * gate)
    assert torch.autograd.gradcheck(_GatedGelu.apply, (projected,))


def tiny(**config) -> transformers.ModernBertForMaskedLM:
    torch.manual_seed(0)
    return transformers.ModernBertForMaskedLM(
        transformers.ModernBertConfig(
            vocab_size=97,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=48,
            max_position_embeddings=64,
            pad_token_id=0,
            **config,
        )
    )


def test_a_model_trains_the_same_with_the_fused_gate():
    stock = tiny()
    fused = use_fused_geglu(copy.deepcopy(stock))
    assert sum(isinstance(module, FusedGegluModernBertMLP) for module in fused.modules()) == 2
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 97, (3, 16), generator=generator)
    labels = torch.where(torch.rand(ids.shape, generator=generator) < 0.3, ids, -100)
    losses, grads = [], []
    for model in (stock, fused):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(losses[1], losses[0])
    assert grads[1].keys() == grads[0].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, msg=name)


def test_another_activation_or_autocast_keeps_transformers_path():
    called = []
    original = _GatedGelu.apply
    _GatedGelu.apply = lambda *args: called.append(1) or original(*args)
    try:
        ids = torch.randint(2, 97, (2, 10))
        use_fused_geglu(tiny(hidden_activation="gelu_pytorch_tanh"))(input_ids=ids)
        model = use_fused_geglu(tiny())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids)
        assert called == []
        model(input_ids=ids)
        assert called
    finally:
        _GatedGelu.apply = original
