"""ModernBERT's and EuroBERT's rotary embeddings as one autograd function (spanlm.accel.rotary): the same values and
gradients as transformers' RoPE, in the function and in whole models (sliding-window and global layers, padded
and packed), and only where it applies."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

from spanlm import accel
from spanlm.accel.rotary import (
    FusedRotaryEuroBertAttention,
    FusedRotaryModernBertAttention,
    rotary,
    use_fused_rotary,
)


def test_the_rotation_and_its_gradient_are_transformers_rope():
    generator = torch.Generator().manual_seed(0)
    # ModernBERT's fused projection (B, L, 3, heads, D): the query and key rotated, the value passed through.
    qkv = torch.randn(2, 5, 3, 4, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    angles = torch.randn(2, 5, 4, generator=generator, dtype=torch.float64)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    table = cos[:, :, None, None, :], sin[:, :, None, None, :]
    ours = rotary(qkv, *table, rotated=2)
    query, key = apply_rotary_pos_emb(qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2), cos, sin)
    torch.testing.assert_close(ours[:, :, 0], query.transpose(1, 2))
    torch.testing.assert_close(ours[:, :, 1], key.transpose(1, 2))
    torch.testing.assert_close(ours[:, :, 2], qkv[:, :, 2])
    assert torch.autograd.gradcheck(lambda x: rotary(x, *table, rotated=2), (qkv,))
    strided = qkv.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_(True)  # other strides
    assert torch.autograd.gradcheck(lambda x: rotary(x, *table, rotated=2), (strided,))
    # Cosines whose halves differ (no RoPE table has them, but the algebra must not assume equal halves).
    cos, sin = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    x = torch.randn(2, 5, 4, 8, dtype=torch.float64, requires_grad=True)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    rotated = torch.cat([-x[..., 4:], x[..., :4]], -1)
    torch.testing.assert_close(rotary(x, c, s), x * c + rotated * s)
    assert torch.autograd.gradcheck(lambda x: rotary(x, c, s), (x,))


def tiny(family: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    common = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    if family == "modernbert":  # layers 0 and 3 global, 1 and 2 in an 8-token window
        config = transformers.ModernBertConfig(**common, local_attention=8, global_attn_every_n_layers=3)
        return transformers.ModernBertForMaskedLM(config)
    config = transformers.EuroBertConfig(**common, num_key_value_heads=2, mask_token_id=1)  # grouped-query keys
    return transformers.EuroBertForMaskedLM(config)


def loss_and_grads(model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_a_model_trains_the_same_with_the_fused_rotation(family):
    stock = tiny(family)
    fused = use_fused_rotary(copy.deepcopy(stock))
    kind = FusedRotaryModernBertAttention if family == "modernbert" else FusedRotaryEuroBertAttention
    assert sum(isinstance(module, kind) for module in fused.modules()) == 3
    assert fused.state_dict().keys() == stock.state_dict().keys()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 97, (3, 20), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0  # a padded row
    labels = torch.where(torch.rand(ids.shape, generator=generator) < 0.3, ids, -100)
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    (stock_loss, stock_grads), (fused_loss, fused_grads) = loss_and_grads(stock, inputs), loss_and_grads(fused, inputs)
    torch.testing.assert_close(fused_loss, stock_loss, rtol=1e-5, atol=1e-6)
    assert fused_grads.keys() == stock_grads.keys()
    for name in stock_grads:
        torch.testing.assert_close(fused_grads[name], stock_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_a_packed_stream_is_rotated_per_block_as_the_blocks_alone(family):
    from spanlm.models.packed import encoder_states

    stock = tiny(family)
    fused = copy.deepcopy(stock)
    accel.apply(stock, torch.device("cpu"), "off", packed=True)
    accel.apply(fused, torch.device("cpu"), "auto", packed=True)
    if accel.backend(torch.device("cpu")) != "cpu":
        pytest.skip("the CPU backend's kernels are not built here")
    assert any(isinstance(m, (FusedRotaryModernBertAttention, FusedRotaryEuroBertAttention)) for m in fused.modules())
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 97, (1, 21), generator=generator)
    bounds = torch.tensor([0, 12, 21], dtype=torch.int32)
    positions = torch.cat([torch.arange(12), torch.arange(9)])[None]

    def states(model):
        return encoder_states(
            model.base_model, ids, torch.ones_like(ids), position_ids=positions, cu_seq_lens=bounds, max_seq_len=12
        )

    torch.testing.assert_close(states(fused), states(stock), rtol=1e-5, atol=1e-5)


def test_it_steps_aside_outside_float32_cpu_training():
    model = use_fused_rotary(tiny("modernbert"))
    ids = torch.randint(2, 97, (2, 10))
    called = []
    original = accel.rotary._Rotary.apply
    accel.rotary._Rotary.apply = lambda *args: called.append(1) or original(*args)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids)
        assert called == []  # bf16 autocast: transformers' own path
        model(input_ids=ids)
        assert called  # float32: the fused one
    finally:
        accel.rotary._Rotary.apply = original
