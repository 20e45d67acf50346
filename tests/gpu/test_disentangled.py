"""On a GPU (``pytest -m gpu``; skipped without CUDA): DeBERTa's disentangled attention through FlexAttention
(spanlm.accel.disentangled, no attention dropout) and through SDPA with the relative bias (with it) gives
transformers' outputs and gradients on the tokens, eager and under ``torch.compile``, and runs in bf16.
``SPANLM_GPU_TESTS_DEVICE=cpu`` runs the SDPA half on the CPU (FlexAttention has no CPU backward)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from transformers import DebertaV2Config, DebertaV2Model

from spanlm.accel.disentangled import use_fused_disentangled_attention

DEVICE = os.environ.get("SPANLM_GPU_TESTS_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def pair(attention_dropout: float):
    config = DebertaV2Config(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=attention_dropout,
        relative_attention=True,
        position_buckets=32,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
    )
    torch.manual_seed(0)
    theirs = DebertaV2Model(config).to(DEVICE)
    ours = copy.deepcopy(theirs)
    use_fused_disentangled_attention(ours)
    return theirs, ours


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_flex_gives_transformers_outputs_and_gradients(compiled):
    if DEVICE != "cuda":
        pytest.skip("FlexAttention's backward needs CUDA")
    torch.backends.cuda.matmul.allow_tf32 = False
    theirs, ours = pair(0.0)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 1000, (4, 200), generator=generator).to(DEVICE)
    mask = torch.ones(4, 200, dtype=torch.long, device=DEVICE)
    mask[1, 120:] = 0
    weights = torch.randn(4, 200, 64, generator=generator).to(DEVICE) * mask[..., None]
    hidden = {}
    for name, model in (("theirs", theirs), ("ours", ours)):
        forward = torch.compile(model) if compiled and name == "ours" else model
        hidden[name] = forward(input_ids=ids, attention_mask=mask).last_hidden_state
        (hidden[name] * weights).sum().backward()
    tokens = mask.bool()
    torch.testing.assert_close(hidden["ours"][tokens], hidden["theirs"][tokens], atol=1e-4, rtol=1e-4)
    for (name, a), (_, b) in zip(theirs.named_parameters(), ours.named_parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, atol=1e-4, rtol=1e-3, msg=lambda m, name=name: f"{name}: {m}")


def test_bf16_training_steps_run_both_paths():
    for dropout in (0.0, 0.1):  # flex without attention dropout, SDPA with it
        _, ours = pair(dropout)
        ids = torch.randint(5, 1000, (2, 128), device=DEVICE)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = ours(input_ids=ids).last_hidden_state.float().square().mean()
        loss.backward()
        assert torch.isfinite(loss) and all(
            torch.isfinite(p.grad).all() for p in ours.parameters() if p.grad is not None
        )


def test_flex_follows_the_padded_length_from_batch_to_batch():
    """Padded batches change length every step: the compiled FlexAttention takes each (its length made symbolic,
    not a compile per length that would exhaust dynamo's cache) and stays transformers' on the tokens."""
    if DEVICE != "cuda":
        pytest.skip("the compiled FlexAttention runs on CUDA")
    from torch._dynamo.utils import counters

    torch.backends.cuda.matmul.allow_tf32 = False
    theirs, ours = pair(0.0)
    theirs.eval(), ours.eval()
    counters.clear()
    for length in (96, 131, 170, 203, 250):
        ids = torch.randint(5, 1000, (2, length), device=DEVICE)
        with torch.no_grad():
            torch.testing.assert_close(
                ours(input_ids=ids).last_hidden_state, theirs(input_ids=ids).last_hidden_state, atol=1e-4, rtol=1e-4
            )
    assert counters["stats"]["unique_graphs"] <= 4  # the first length, then a symbolic one: not one per length
