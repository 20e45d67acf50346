"""On a GPU (``pytest -m gpu``; skipped without CUDA): packed streams through the accelerator's variable-length
attention — PyTorch's varlen kernel in bf16 without dropout, the segments padded again otherwise — equal
the blocks run one at a time. ``SPANLM_GPU_TESTS_DEVICE=cpu`` runs the same code on the CPU (there the
attention is the per-block loop)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from spanlm.models.packed import varlen_attention

DEVICE = os.environ.get("SPANLM_GPU_TESTS_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_each_segment_attends_to_itself_only(dtype):
    generator = torch.Generator().manual_seed(0)
    lengths = [37, 1, 64, 20]
    bounds = torch.tensor([0, 37, 38, 102, 122], dtype=torch.int32, device=DEVICE)
    query, key, value = (torch.randn(1, 4, 122, 64, generator=generator).to(DEVICE, dtype) for _ in range(3))
    context, _ = varlen_attention(
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
            for q, k, v in zip(query.split(lengths, 2), key.split(lengths, 2), value.split(lengths, 2))
        ],
        2,
    )
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(context.float(), alone.transpose(1, 2).float(), **tolerance)
