"""DeBERTa-V2 / V3 over a packed stream (spanlm.models.packed_deberta): each block's states and gradients are those
of the block alone through transformers' own ``DebertaV2Model``, for every layout of the relative terms, absolute
positions and the convolution; every layer but the attention computes the stream's tokens only."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import DEBERTA_V2, DEBERTA_V3, assert_same_gradients, tiny_deberta
from spanlm.models.packed import encoder_states
from spanlm.models.packed_deberta import PackedDisentangledSelfAttention, segment_layout

# DeBERTa-V2 xlarge's convolution beside the first layer
V2_CONV = {**DEBERTA_V2, "conv_kernel_size": 3, "conv_act": "gelu"}

BLOCKS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [30, 31, 32], [40, 41, 42, 43, 44, 45]]


def stream(blocks=BLOCKS, pad_after_first: int = 2):
    """A packed stream (1, T) of ``blocks`` with a run of padding after the first (a segment of its own)."""
    ids = [*blocks[0], *[0] * pad_after_first, *[t for block in blocks[1:] for t in block]]
    later = [p for block in blocks[1:] for p in range(len(block))]
    positions = [*range(len(blocks[0])), *[1] * pad_after_first, *later]
    lengths = [len(blocks[0]), pad_after_first, *map(len, blocks[1:])]
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    ids = torch.tensor([ids])
    return ids, (ids != 0).long(), torch.tensor([positions]), bounds, max(lengths)


@pytest.mark.parametrize("layout", [DEBERTA_V3, DEBERTA_V2, V2_CONV], ids=["v3", "v2", "v2-conv"])
def test_each_block_gets_its_states_and_gradients_alone(layout):
    ours = tiny_deberta(layout).train()
    theirs = copy.deepcopy(ours)
    ids, real, positions, bounds, longest = stream()
    weights = torch.randn(1, ids.shape[1], 32, generator=torch.Generator().manual_seed(3)) * real[..., None]
    packed = encoder_states(ours, ids, real, positions, cu_seq_lens=bounds, max_seq_len=longest)
    (packed * weights).sum().backward()
    tokens = real[0].bool()
    expected = torch.cat([theirs(input_ids=torch.tensor([block])).last_hidden_state[0] for block in BLOCKS])
    (expected * weights[0][tokens]).sum().backward()
    torch.testing.assert_close(packed[0][tokens], expected, atol=1e-5, rtol=1e-5)
    assert_same_gradients(theirs, ours)
    assert isinstance(ours.encoder.layer[0].attention.self, PackedDisentangledSelfAttention)


def test_only_the_attention_is_laid_out_in_rows():
    """The feed-forward layers see the stream's T positions, not S rows of the longest segment."""
    model = tiny_deberta(DEBERTA_V3).eval()
    ids, real, positions, bounds, longest = stream()
    seen = []
    model.encoder.layer[0].intermediate.register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    with torch.no_grad():
        encoder_states(model, ids, real, positions, cu_seq_lens=bounds, max_seq_len=longest)
    assert seen == [torch.Size([1, ids.shape[1], 32])]


def test_the_layout_places_every_token_once():
    ids, real, positions, bounds, longest = stream()
    layout = segment_layout(positions, real, bounds, longest)
    assert (layout.rows, layout.width) == (len(bounds) - 1, longest)
    values = torch.arange(ids.shape[1]).float()[:, None]
    rows = layout.pad(values)  # (S, W, 1)
    torch.testing.assert_close(layout.unpad(rows), values)
    assert layout.tokens.sum() == real.sum()  # the padding segment's places are not tokens
    assert rows[1, :2, 0].tolist() == [18.0, 19.0] and not layout.tokens[1].any()
