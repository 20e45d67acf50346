"""The packed layout: placement of blocks in rows, positions, and remapping a masked batch's targets."""

from __future__ import annotations

import numpy as np
import pytest

from spanlm.data.blocks import BlockDataset, collate_blocks
from spanlm.data.packing import pack_lengths, pack_masked
from spanlm.data.shards import PreparedCorpus
from spanlm.masking.base import MaskingConfig, build_masker


@pytest.mark.parametrize("gap", [0, 1])
def test_blocks_fit_their_rows_without_overlap(gap):
    lengths = np.random.default_rng(0).integers(3, 33, size=200)
    layout = pack_lengths(lengths, 32, gap)
    occupied = np.zeros((layout.rows, 32), dtype=np.int64)
    for row, offset, length in zip(layout.row, layout.offset, lengths):
        assert offset + length <= 32
        occupied[row, offset:offset + length] += 1
    assert occupied.max() == 1 and occupied.sum() == lengths.sum()
    if gap:  # no two blocks touch
        ends = {(r, o + n) for r, o, n in zip(layout.row, layout.offset, lengths)}
        assert not any((r, o) in ends for r, o in zip(layout.row, layout.offset))
    # first-fit decreasing packs 200 random blocks far tighter than one block per row
    assert layout.rows < 0.7 * len(lengths)
    assert layout.padding_share < 0.1 + 0.05 * gap
    again = pack_lengths(lengths, 32, gap)
    assert (again.row == layout.row).all() and (again.offset == layout.offset).all()


def test_rows_are_cut_to_the_longest_one():
    layout = pack_lengths(np.array([5, 3, 6]), 32)  # everything fits one row of 14
    assert layout.rows == 1 and layout.width == 14 and layout.padding_share == 0.0


def test_a_block_wider_than_the_rows_is_refused():
    with pytest.raises(ValueError, match="does not fit rows of 8"):
        pack_lengths(np.array([4, 9]), 8)


def test_positions_restart_per_block_and_padding_never_starts_one():
    layout = pack_lengths(np.array([3, 5, 2]), 8)  # decreasing: 5 → row 0, 3 → row 0, 2 → row 1
    assert (layout.row == [0, 0, 1]).all() and (layout.offset == [5, 0, 0]).all() and layout.width == 8
    assert layout.position_ids().tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 1, 1, 1, 1, 1, 1]]
    # each packed token's flat position in the padded (3, 5) layout; padding is 3·5
    assert layout.source_index(5).tolist() == [[5, 6, 7, 8, 9, 0, 1, 2], [10, 11, 15, 15, 15, 15, 15, 15]]


@pytest.mark.parametrize("scheme", ["mlm", "wwm", "span"])
def test_packed_targets_point_at_the_same_tokens(embedded_prepared, scheme):
    corpus = PreparedCorpus(embedded_prepared)
    blocks = BlockDataset(corpus, 32)
    batch = collate_blocks([blocks[i] for i in range(0, 400, 25)], corpus.special_ids["pad"])
    masked = build_masker(MaskingConfig(scheme=scheme), corpus)(batch, np.random.default_rng(0))
    packed = pack_masked(masked, 32, corpus.special_ids["pad"])
    ids, packed_ids = masked.input_ids.reshape(-1), packed.input_ids.reshape(-1)
    for name in ("target_index", "sbo_index", "sbo_left", "sbo_right", "span_start"):
        assert (packed_ids[getattr(packed, name)] == ids[getattr(masked, name)]).all(), name
    assert (packed_ids[packed.span_end - 1] == ids[masked.span_end - 1]).all()
    assert (packed.target_labels == masked.target_labels).all()
    # every real token is moved once, in order within its block, and padding is the pad id
    real = packed.attention_mask.reshape(-1)
    assert sorted(packed_ids[real]) == sorted(ids[masked.attention_mask.reshape(-1)])
    assert (packed_ids[~real] == corpus.special_ids["pad"]).all()
    source = packed.source_index.reshape(-1)
    assert (ids[source[real]] == packed_ids[real]).all() and (source[~real] == ids.size).all()
    assert packed.input_ids.shape[0] < masked.input_ids.shape[0]
