"""Encoders over packed rows: the block-diagonal mask from per-block positions, as transformers'
DataCollatorWithFlattening writes them, and the families that cannot be packed."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModel, DataCollatorWithFlattening

from spanlm.errors import ConfigError
from spanlm.models.packed import block_attention, check_packable, encoder_states

SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
         "max_position_embeddings": 64, "vocab_size": 100, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def test_the_mask_joins_only_tokens_of_one_block():
    positions = torch.tensor([[0, 1, 2, 0, 1, 1]])  # two blocks, then padding
    real = torch.tensor([[1, 1, 1, 1, 1, 0]])
    allowed = block_attention(positions, real)[0, 0]
    assert allowed[:3, :3].all() and allowed[3:5, 3:5].all()
    assert not allowed[:3, 3:].any() and not allowed[3:, :3].any() and not allowed[:, 5].any()


# DeBERTa-V2 has only the eager attention.
@pytest.mark.parametrize("family, attention", [(family, attention) for family in ("bert", "roberta", "electra")
                                               for attention in ("sdpa", "eager")] + [("deberta-v2", "eager")])
def test_a_flattened_batch_gives_each_sequence_its_own_states(family, attention):
    """DataCollatorWithFlattening's one-row batch (positions restarting per sequence) through encoder_states."""
    extra = {"pad_token_id": 1} if family == "roberta" else {}
    extra.update({"relative_attention": True, "position_buckets": 8, "pos_att_type": ["p2c", "c2p"],
                  "position_biased_input": False} if family == "deberta-v2" else {})
    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.for_model(family, **SIZES, **extra), attn_implementation=attention).eval()
    sequences = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    flat = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": s} for s in sequences])
    with torch.no_grad():
        packed = encoder_states(model, flat["input_ids"], torch.ones_like(flat["input_ids"]), flat["position_ids"])[0]
        alone = [encoder_states(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0] for s in sequences]
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("setting, reason", [({"conv_kernel_size": 3}, "conv_kernel_size > 0 convolves"),
                                             ({"z_steps": 2}, "z_steps > 1 re-runs")])
def test_deberta_variants_that_mix_blocks_are_refused_with_the_reason(setting, reason):
    model = AutoModel.from_config(AutoConfig.for_model("deberta-v2", **SIZES, **setting))
    with pytest.raises(ConfigError, match=reason):
        check_packable(model)
