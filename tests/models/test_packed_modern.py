"""Packed batches on ModernBERT and EuroBERT: the stream's blocks get the states they get one at a time, ModernBERT's
local layers windowed inside each block, through their own transformers attention path."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModel, DataCollatorWithFlattening

from spanlm.models.packed import VARLEN_ATTENTION, encoder_states, resolve_packing

SIZES = {"vocab_size": 60, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 48}
SEQUENCES = [list(range(5, 23)), [30, 31, 32], list(range(33, 45)), [50, 51, 52, 53, 54, 55, 56]]


def model_of(family: str, **settings):
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, **SIZES, pad_token_id=0, **settings)
    return AutoModel.from_config(config, attn_implementation="sdpa")


@pytest.mark.parametrize(
    "family, settings",
    [
        # a 4-token window (2 each side) in blocks of up to 18 tokens: layers 0 and 2 global, 1 local
        ("modernbert", {"local_attention": 4, "global_attn_every_n_layers": 2}),
        ("modernbert", {"local_attention": 4, "global_attn_every_n_layers": 100}),  # layers 1, 2 local
        ("modernbert", {"local_attention": 4, "global_attn_every_n_layers": 1}),  # global layers only
        ("eurobert", {}),
        ("eurobert", {"num_key_value_heads": 2}),  # grouped-query attention
    ],
)
def test_packed_blocks_equal_the_blocks_run_one_at_a_time(family, settings):
    model = model_of(family, **settings).eval()
    flat = DataCollatorWithFlattening(return_tensors="pt", return_flash_attn_kwargs=True)(
        [{"input_ids": s} for s in SEQUENCES]
    )
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in SEQUENCES]  # the stock path
        packed = encoder_states(
            model,
            flat["input_ids"],
            torch.ones_like(flat["input_ids"]),
            flat["position_ids"],
            cu_seq_lens=flat["cu_seq_lens_q"],
            max_seq_len=flat["max_length_q"],
        )[0]
    assert model.config._attn_implementation == VARLEN_ATTENTION
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # and padded batches still take the model's own masks after the switch
        padded = torch.zeros(2, 18, dtype=torch.long)
        padded[0], padded[1, :3] = torch.tensor(SEQUENCES[0]), torch.tensor(SEQUENCES[1])
        states = encoder_states(model, padded, (padded != 0).long())
    torch.testing.assert_close(states[0], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states[1, :3], alone[1], rtol=1e-5, atol=1e-5)


def test_the_window_stays_inside_its_block():
    """A local-only ModernBERT: the first block's states ignore the next block, even at its last tokens, whose
    window would reach across the boundary in the stream."""
    model = model_of("modernbert", local_attention=8, global_attn_every_n_layers=100).eval()
    results = []
    for second in ([30, 31, 32, 33], [40, 41, 42, 43]):
        ids = torch.tensor([[5, 6, 7, 8, 9, 10, *second]])
        positions = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3]])
        with torch.no_grad():
            results.append(encoder_states(model, ids, torch.ones_like(ids), positions)[0, :6])
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_packing_is_taken_when_asked_and_auto_pads(family):
    model = model_of(family)
    model.supports_packing = True
    assert resolve_packing(True, model, "cpu") is True
    assert resolve_packing("auto", model, "cpu") is False  # not measured faster than padded batches
