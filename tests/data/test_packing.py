"""The packed layout: blocks one after another in one stream, positions, and remapping a masked batch's targets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from spanlm.data.blocks import BlockDataset, collate_blocks
from spanlm.data.packing import pack_encoder_inputs, pack_masked, stream_layout
from spanlm.data.shards import PreparedCorpus
from spanlm.masking.base import FLAT, KEEP, MaskingConfig, build_masker
from spanlm.models.modeling_charbert import segment_bounds


@pytest.mark.parametrize("gap", [0, 1])
def test_blocks_lie_one_after_another_in_one_stream(gap):
    lengths = np.random.default_rng(0).integers(3, 33, size=200)
    layout = stream_layout(lengths, gap)
    occupied = np.zeros(layout.width, dtype=np.int64)
    for offset, length in zip(layout.offset, lengths):
        occupied[offset : offset + length] += 1
    assert occupied.max() == 1 and occupied.sum() == lengths.sum()
    assert (np.diff(layout.offset) == lengths[:-1] + gap).all()  # batch order, ``gap`` pads apart
    assert layout.width == lengths.sum() + gap * (len(lengths) - 1)
    assert layout.padding_share == pytest.approx(gap * 199 / layout.width)


def test_positions_restart_per_block_and_padding_never_starts_one():
    layout = stream_layout(np.array([3, 5, 2]), gap=1)
    assert (layout.offset == [0, 4, 10]).all() and layout.width == 12
    assert layout.position_ids().tolist() == [[0, 1, 2, 1, 0, 1, 2, 3, 4, 1, 0, 1]]
    # each packed token's flat position in the padded (3, 5) layout; padding is 3·5
    assert layout.source_index(5).tolist() == [[0, 1, 2, 15, 5, 6, 7, 8, 9, 15, 10, 11]]
    assert layout.pack(np.arange(15).reshape(3, 5), -1).tolist() == [[0, 1, 2, -1, 5, 6, 7, 8, 9, -1, 10, 11]]


def derived_bounds(position_ids: np.ndarray, attention_mask: np.ndarray) -> list[int]:
    """The bounds the model would derive on the device from the stream's positions (its fallback)."""
    return segment_bounds(torch.from_numpy(position_ids), torch.from_numpy(attention_mask)).tolist()


@pytest.mark.parametrize("gap", [0, 1, 2])  # 1: CharBERT's one pad between blocks
def test_the_bounds_a_batch_carries_are_those_the_model_would_derive(gap):
    rng = np.random.default_rng(gap)
    for _ in range(300):
        lengths = rng.integers(0, 12, size=rng.integers(1, 20))  # empty blocks included
        rows = {
            "input_ids": rng.integers(5, 100, size=(len(lengths), 12)),
            "attention_mask": np.arange(12)[None, :] < lengths[:, None],
        }
        layout = stream_layout(lengths, gap)
        attention = layout.pack(rows["attention_mask"], False)
        expected = derived_bounds(layout.position_ids(), attention)
        bounds = layout.segment_bounds()
        assert bounds.dtype == np.int32 and bounds.tolist() == expected, lengths
        packed = pack_encoder_inputs(rows, 0, gap)
        assert packed["cu_seq_lens"].tolist() == expected
        assert type(packed["max_seq_len"]) is int and packed["max_seq_len"] == max(np.diff(expected))


@pytest.mark.parametrize("scheme", ["mlm", "wwm", "span"])
def test_packed_targets_point_at_the_same_tokens(embedded_prepared, scheme):
    corpus = PreparedCorpus(embedded_prepared)
    blocks = BlockDataset(corpus, 32)
    batch = collate_blocks([blocks[i] for i in range(0, 400, 25)], corpus.special_ids["pad"])
    masked = build_masker(MaskingConfig(scheme=scheme), corpus)(batch, np.random.default_rng(0))
    packed = pack_masked(masked, corpus.special_ids["pad"])
    ids, packed_ids = masked.input_ids.reshape(-1), packed.input_ids.reshape(-1)
    flat = [name for name, packing in masked.packing().items() if packing == FLAT]  # the scheme's own included
    assert set(flat) == {"target_index", "span_start"} | (
        {"sbo_index", "sbo_left", "sbo_right"} if scheme == "span" else set()
    )
    for name in flat:
        assert (packed_ids[getattr(packed, name)] == ids[getattr(masked, name)]).all(), name
    for name, packing in masked.packing().items():
        if packing == KEEP:  # labels and per-target values are copied
            assert (getattr(packed, name) == getattr(masked, name)).all(), name
    assert (packed_ids[packed.span_end - 1] == ids[masked.span_end - 1]).all()
    assert (packed.target_labels == masked.target_labels).all()
    # every real token is moved once, in order within its block, and padding is the pad id
    real = packed.attention_mask.reshape(-1)
    assert sorted(packed_ids[real]) == sorted(ids[masked.attention_mask.reshape(-1)])
    assert (packed_ids[~real] == corpus.special_ids["pad"]).all()
    source = packed.source_index.reshape(-1)
    assert (ids[source[real]] == packed_ids[real]).all() and (source[~real] == ids.size).all()
    assert packed.input_ids.shape == (1, masked.attention_mask.sum())  # one stream, no padding
    for gap in (0, 1):  # the bounds the model reads, computed with the batch (1: CharBERT's one pad between blocks)
        packed = pack_masked(masked, corpus.special_ids["pad"], gap)
        expected = derived_bounds(packed.position_ids, packed.attention_mask)
        assert packed.cu_seq_lens.tolist() == expected and len(expected) == len(masked.input_ids) * (1 + gap) + 1 - gap
        assert packed.max_seq_len == max(np.diff(expected)) == masked.attention_mask.sum(axis=1).max()
        batch = packed.to_torch(("cu_seq_lens", "max_seq_len"))
        assert batch["cu_seq_lens"].dtype == torch.int32 and type(batch["max_seq_len"]) is int


def test_the_documented_packing_example_runs(embedded_prepared, capsys):
    from helpers import doc_section

    (code,) = doc_section("docs/pretrain.md", "Packed batches")
    code = code.replace('"runs/prepared/english-wordpiece-8000"', repr(str(embedded_prepared)))
    exec(compile(code, "docs/pretrain.md", "exec"), {})
    padded, starts = capsys.readouterr().out.splitlines()
    assert padded.startswith("padded (16, ") and "packed (1, " in padded
    starts = json.loads(starts)
    assert len(starts) == 16 and starts[0] == 0 and starts == sorted(starts)
