"""Encoders over packed streams: block boundaries from per-block positions, as transformers'
DataCollatorWithFlattening writes them, through the variable-length attention; and the families that cannot
be packed."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModel, DataCollatorWithFlattening

from helpers import forbid_deriving_segment_bounds
from spanlm.errors import ConfigError
from spanlm.models.modeling_charbert import segment_bounds
from spanlm.models.packed import VARLEN_ATTENTION, check_packable, encoder_states, resolve_packing

SIZES = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "vocab_size": 100,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
DEBERTA = {
    "relative_attention": True,
    "position_buckets": 8,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
}


def test_segments_start_at_each_block_and_at_padding_after_one():
    positions = torch.tensor([[0, 1, 2, 1, 0, 1, 1, 1]])  # a block, a pad, a block, two pads
    real = torch.tensor([[1, 1, 1, 0, 1, 1, 0, 0]])
    assert segment_bounds(positions, real).tolist() == [0, 3, 4, 6, 8]


def model_of(family: str, attention: str, **settings):
    extra = {"pad_token_id": 1} if family == "roberta" else {}
    extra.update(DEBERTA if family == "deberta-v2" else {})
    torch.manual_seed(0)
    return AutoModel.from_config(
        AutoConfig.for_model(family, **SIZES, **extra, **settings), attn_implementation=attention
    )


# DeBERTa-V2 has only the eager attention (and runs packed batches padded).
@pytest.mark.parametrize(
    "family, attention",
    [(family, attention) for family in ("bert", "roberta", "electra") for attention in ("sdpa", "eager")]
    + [("deberta-v2", "eager")],
)
def test_a_flattened_batch_gives_each_sequence_its_own_states(family, attention):
    """DataCollatorWithFlattening's one-row batch (positions restarting per sequence) through encoder_states."""
    model = model_of(family, attention).eval()
    sequences = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    flat = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": s} for s in sequences])
    with torch.no_grad():
        packed = encoder_states(model, flat["input_ids"], torch.ones_like(flat["input_ids"]), flat["position_ids"])[0]
        alone = [
            encoder_states(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0] for s in sequences
        ]
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-5)
    if family != "deberta-v2":  # switched to the varlen attention, which still runs padded batches as SDPA
        assert model.config._attn_implementation == VARLEN_ATTENTION


@pytest.mark.parametrize("family", ["bert", "roberta", "electra"])
def test_the_bounds_a_batch_carries_are_used_as_they_are(family, monkeypatch):
    """DataCollatorWithFlattening's FlashAttention arguments (bounds, and the longest as an int) as the batch's own
    ``cu_seq_lens`` / ``max_seq_len``: nothing is derived from the positions, and each sequence gets its states."""
    model = model_of(family, "sdpa").eval()
    sequences = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    flat = DataCollatorWithFlattening(return_tensors="pt", return_flash_attn_kwargs=True)(
        [{"input_ids": s} for s in sequences]
    )
    assert type(flat["max_length_q"]) is int
    forbid_deriving_segment_bounds(monkeypatch)
    with torch.no_grad():
        packed = encoder_states(
            model,
            flat["input_ids"],
            torch.ones_like(flat["input_ids"]),
            flat["position_ids"],
            cu_seq_lens=flat["cu_seq_lens_q"],
            max_seq_len=flat["max_length_q"],
        )[0]
        alone = [
            encoder_states(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0] for s in sequences
        ]
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError, match="derived from its positions"):  # positions alone: the fallback
        encoder_states(model, flat["input_ids"], torch.ones_like(flat["input_ids"]), flat["position_ids"])


@pytest.mark.parametrize("family", ["bert", "deberta-v2"])
def test_changing_block_2_changes_nothing_of_block_1_forward_or_backward(family):
    """Block 1's states, and the gradients its states send to every weight, do not depend on block 2."""
    model = model_of(family, "eager" if family == "deberta-v2" else "sdpa").train()
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    real = torch.ones_like(positions)
    results = []
    for second in ([20, 21, 22], [30, 31, 32]):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        ids = torch.tensor([[5, 6, 7, 8, 9, *second]])
        embeddings = model.get_input_embeddings()
        states = encoder_states(model, ids, real, positions)
        states[0, :5].sum().backward()  # block 1's outputs only
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        word_rows = embeddings.weight.grad[[5, 6, 7, 8, 9]].clone()
        results.append((states[0, :5].detach(), grads, word_rows, embeddings.weight.grad[second].abs().sum()))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-6, atol=1e-6)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(results[0][2], results[1][2], rtol=1e-5, atol=1e-6)
    assert results[0][3] == 0 and results[1][3] == 0  # nothing flows back into block 2's tokens


def test_an_unknown_family_is_refused_and_auto_pads_deberta():
    model = AutoModel.from_config(
        AutoConfig.for_model("distilbert", vocab_size=100, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    )
    with pytest.raises(ConfigError, match="not 'distilbert'"):
        check_packable(model)
    deberta = model_of("deberta-v2", "eager")
    deberta.supports_packing = True
    assert resolve_packing("auto", deberta, packs_by_default=True) is False  # no varlen path: padded is as fast
    assert resolve_packing(True, deberta, packs_by_default=False) is True
    # under train.compile it runs padded, one line says why (inductor fails on the re-padded layout on CUDA)
    lines = []
    assert resolve_packing(True, deberta, packs_by_default=False, compiled=True, log=lines.append) is False
    assert len(lines) == 1 and "deberta-v2" in lines[0] and "train.compile" in lines[0]
    bert = model_of("bert", "sdpa")
    bert.supports_packing = True
    assert resolve_packing("auto", bert, packs_by_default=True) is True  # the device's choice (spanlm.accel)
    assert resolve_packing("auto", bert, packs_by_default=False) is False
    assert resolve_packing(True, bert, packs_by_default=False, compiled=True, log=lines.append) is True


def test_a_packed_deberta_runs_one_segment_per_row_without_reading_the_host(monkeypatch):
    """DeBERTa has no varlen path: its stream is cut into the batch's segments (blocks and padding runs), each a row,
    with the bounds and longest segment the batch carries: device operations only, and each block's own states."""
    model = model_of("deberta-v2", "eager").eval()
    sequences = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    ids = torch.tensor([[*sequences[0], 0, *sequences[1], *sequences[2], 0, 0]])  # padding after the first block
    real = (ids != 0).long()
    positions = torch.tensor([[0, 1, 2, 3, 4, 1, 0, 1, 2, 0, 1, 2, 3, 1, 1]])
    bounds = torch.tensor([0, 5, 6, 9, 13, 15], dtype=torch.int32)
    with torch.no_grad():
        alone = [
            encoder_states(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0] for s in sequences
        ]
        forbid_deriving_segment_bounds(monkeypatch)
        reads = []
        for name in ("item", "tolist", "__bool__", "__int__", "__index__"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(
                torch.Tensor, name, lambda t, *a, _n=name, _o=original, **k: reads.append(_n) or _o(t, *a, **k)
            )
        packed = encoder_states(model, ids, real, positions, cu_seq_lens=bounds, max_seq_len=5)[0]
        monkeypatch.undo()
    assert not reads
    torch.testing.assert_close(packed[real[0].bool()], torch.cat(alone), rtol=1e-5, atol=1e-5)
