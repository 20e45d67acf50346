"""On a GPU (``pytest -m gpu``; skipped without CUDA): packed streams through the device's attention path
(spanlm.accel.varlen) — FlashAttention's varlen kernel in half precision, with and without dropout, the segments
padded again in float32 — equal the blocks run one at a time, and the kernel's dropout is dropout at rate p whose
backward pass applies the same mask. ``SPANLM_GPU_TESTS_DEVICE=cpu`` runs the same code on the CPU (there the
path is the per-segment loop, and the dropout checks compare its SDPA dropout instead)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from spanlm.accel.varlen import PACKED_PATHS, packed_attention, path_for

DEVICE = os.environ.get("SPANLM_GPU_TESTS_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LENGTHS = [37, 1, 64, 20]
BOUNDS = [0, 37, 38, 102, 122]


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)  # seeds the CUDA generators too, whose Philox stream flash's dropout reads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_each_segment_attends_to_itself_only_forward_and_backward(dtype):
    generator = torch.Generator().manual_seed(0)
    bounds = torch.tensor(BOUNDS, dtype=torch.int32, device=DEVICE)
    query, key, value = (
        torch.randn(1, 4, 122, 64, generator=generator).to(DEVICE, dtype).requires_grad_() for _ in range(3)
    )
    context, _ = packed_attention(
        None,
        query,
        key,
        value,
        None,
        scaling=0.125,
        cu_seq_lens_q=bounds,
        cu_seq_lens_k=bounds,
        max_length_q=64,
        max_length_k=64,
    )  # (1, T, heads, d)
    alone = torch.cat(
        [
            F.scaled_dot_product_attention(q, k, v, scale=0.125)
            for q, k, v in zip(query.split(LENGTHS, 2), key.split(LENGTHS, 2), value.split(LENGTHS, 2))
        ],
        2,
    ).transpose(1, 2)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(context.float(), alone.float(), **tolerance)
    weights = torch.linspace(-1, 1, context.numel(), device=DEVICE).view_as(context).to(dtype)
    for packed, reference in zip(
        torch.autograd.grad((context * weights).sum(), (query, key, value)),
        torch.autograd.grad((alone * weights).sum(), (query, key, value)),
    ):
        torch.testing.assert_close(packed.float(), reference.float(), **tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_sliding_window_stays_inside_each_segment_forward_and_backward(dtype):
    """ModernBERT's local layers: ``sliding_window`` 9 (a query sees the keys at distance ≤ 8 in its own segment),
    through the kernel's own window in half precision, a banded mask in float32; GQA keys repeated per head."""
    generator = torch.Generator().manual_seed(1)
    bounds = torch.tensor(BOUNDS, dtype=torch.int32, device=DEVICE)
    query = torch.randn(1, 4, 122, 64, generator=generator).to(DEVICE, dtype).requires_grad_()
    key, value = (torch.randn(1, 2, 122, 64, generator=generator).to(DEVICE, dtype).requires_grad_() for _ in "kv")
    context, _ = packed_attention(
        None,
        query,
        key,
        value,
        None,
        scaling=0.125,
        cu_seq_lens_q=bounds,
        cu_seq_lens_k=bounds,
        max_length_q=64,
        max_length_k=64,
        sliding_window=9,
    )  # (1, T, heads, d)

    def band(n):
        within = torch.arange(n, device=DEVICE)
        return (within[:, None] - within[None, :]).abs() <= 8

    alone = torch.cat(
        [
            F.scaled_dot_product_attention(q, k, v, attn_mask=band(q.shape[2]), scale=0.125, enable_gqa=True)
            for q, k, v in zip(query.split(LENGTHS, 2), key.split(LENGTHS, 2), value.split(LENGTHS, 2))
        ],
        2,
    ).transpose(1, 2)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(context.float(), alone.float(), **tolerance)
    for packed, reference in zip(
        torch.autograd.grad(context.float().sum(), (query, key, value)),
        torch.autograd.grad(alone.float().sum(), (query, key, value)),
    ):
        torch.testing.assert_close(packed.float(), reference.float(), **tolerance)


def dropped_uniform_attention(p: float, seed: int, requires_grad: bool = False):
    """Attention of constant queries (uniform probabilities 1/n) onto one-hot values, dropout p: the context of
    a query is its row of dropped probabilities, each 0 or (1/n)/(1 − p). Returns (context, value), both
    (T, heads, n) for segments of n = 64 tokens."""
    n, segments, heads = 64, 6, 4
    dtype = torch.bfloat16
    bounds = torch.arange(0, n * (segments + 1), n, dtype=torch.int32, device=DEVICE)
    query = torch.zeros(n * segments, heads, n, device=DEVICE, dtype=dtype)
    key = torch.randn(n * segments, heads, n, device=DEVICE, dtype=dtype)  # any keys: the scores are all 0
    value = torch.eye(n, device=DEVICE, dtype=dtype).repeat(segments, 1)[:, None, :].expand(-1, heads, -1).contiguous()
    value.requires_grad_(requires_grad)
    seed_all(seed)
    path = PACKED_PATHS[path_for(query)]
    return path(query, key, value, bounds, n, p, None), value


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_drops_at_rate_p_unbiased_and_is_a_function_of_the_generator_state(p):
    context, _ = dropped_uniform_attention(p, seed=0)
    again, _ = dropped_uniform_attention(p, seed=0)
    other, _ = dropped_uniform_attention(p, seed=1)
    assert torch.equal(context, again) and not torch.equal(context, other)
    dropped = (context == 0).float().mean().item()
    count = context.numel()
    assert abs(dropped - p) < 5 * (p * (1 - p) / count) ** 0.5, dropped  # 5 standard errors
    # Unbiased: a kept probability is scaled by 1 / (1 − p), so each query's context sums to 1 in expectation.
    assert abs(context.float().sum(-1).mean().item() - 1.0) < 0.02


def test_the_backward_pass_drops_what_the_forward_pass_dropped():
    """With one-hot values the context is the matrix D of dropped, rescaled probabilities; the gradient of the
    values under an upstream gradient G is Dᵀ G per segment and head, so it must be built from the same D."""
    context, value = dropped_uniform_attention(0.3, seed=2, requires_grad=True)
    upstream = torch.randn(context.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE, context.dtype)
    (grad_value,) = torch.autograd.grad(context, value, upstream)
    n = context.shape[-1]
    dropped = context.float().view(-1, n, context.shape[1], n).permute(0, 2, 1, 3)  # (S, heads, query, key)
    expected = dropped.transpose(-1, -2) @ upstream.float().view(-1, n, context.shape[1], n).permute(0, 2, 1, 3)
    torch.testing.assert_close(
        grad_value.float(), expected.permute(0, 2, 1, 3).reshape(grad_value.shape), rtol=2e-2, atol=2e-2
    )


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_path_compiles_as_one_graph_with_and_without_dropout(dropout):
    """The trainer compiles the packed step: the flash kernel (its autograd function with dropout, PyTorch's varlen
    op without) traces into one graph; without dropout it equals the eager path."""
    generator = torch.Generator().manual_seed(4)
    bounds = torch.tensor(BOUNDS, dtype=torch.int32, device=DEVICE)
    query, key, value = (
        torch.randn(122, 4, 64, generator=generator).to(DEVICE, torch.bfloat16).requires_grad_() for _ in range(3)
    )
    path = PACKED_PATHS[path_for(query)]

    def attend(query, key, value, bounds):
        return path(query, key, value, bounds, 64, dropout, 0.125)

    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")(query, key, value, bounds)
    grads = torch.autograd.grad(compiled.float().square().sum(), (query, key, value))
    assert compiled.shape == query.shape and all(torch.isfinite(g).all() for g in grads)
    if dropout == 0.0:
        eager = attend(query, key, value, bounds)
        torch.testing.assert_close(compiled.float(), eager.float(), rtol=2e-2, atol=2e-2)
