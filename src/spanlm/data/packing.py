"""Packed batches: a batch's blocks (or fine-tuning windows) one after another in one token stream, each
attending only to itself.

A padded batch computes every row to the length of its longest block; a packed batch places the blocks
end to end in one row of all their tokens, so the linear layers, embeddings, heads and losses compute no
padding, and the attention runs per block (variable-length attention, :mod:`spanlm.models.packed`). These
fields describe a packed batch to the model:

* ``input_ids`` (1, T) and ``attention_mask`` (1, T) — real tokens, as in a padded batch;
* ``position_ids`` (1, T) — positions restarting at 0 at every block start, the convention of
  transformers' ``DataCollatorWithFlattening``; a block is the run from one 0 to the next;
* ``cu_seq_lens`` (S + 1,) int32 and ``max_seq_len`` — the bounds of the stream's segments (a segment is a
  block, or the padding after one: CharBERT's pad between blocks) and the longest, what the variable-length
  attention takes. They are computed here, with the batch, from the layout: derived from ``position_ids``
  on a GPU they would cost a ``nonzero`` and a read of the longest, two waits for the device every step.
  ``max_seq_len`` is a Python ``int`` (FlashAttention's ``max_length_q`` must be one; transformers'
  ``DataCollatorWithFlattening`` keeps it one too) that the training loop passes on as it is;
* ``source_index`` (1, T) — the flat position ``b·L + t`` in the padded (B, L) layout of each packed
  token, ``B·L`` for padding: what maps per-block inputs (CharBERT's char channel) into the packed layout.

Maskers keep working on the padded block layout (one block per row), so every per-block rule — the
masking budget, spans and whole words inside their block, SBO boundaries, RTD over real tokens — holds
by construction; :func:`pack_masked` then moves the corrupted ids and remaps every flat target position.
The masks drawn from a batch key are the same packed or padded, so a packed batch gives the padded
batch's losses (tests/objectives/test_packing.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

# How a masked batch's array packs (the batch says which of its arrays is which: MaskedBatch.packing): flat
# positions into the (B, L) layout are remapped, exclusive ends too, the rest is copied (labels, and per-block
# inputs that stay in the block layout for the model to map with source_index). The names are the masking
# layer's (spanlm.masking.base), which this layer sits below.
FLAT, END = "flat", "end"


@dataclasses.dataclass(frozen=True)
class PackedLayout:
    """Where each of B blocks lies in the packed stream of ``width`` positions (one row)."""

    lengths: np.ndarray  # (B,) tokens of each block
    offset: np.ndarray  # (B,) its first position in the stream
    width: int

    def padded_to_packed(self, flat: np.ndarray, padded_width: int) -> np.ndarray:
        """Flat positions ``b·L + t`` of the padded layout → ``offset[b] + t`` in the stream."""
        flat = np.asarray(flat, dtype=np.int64)
        return self.offset[flat // padded_width] + flat % padded_width

    def token_positions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every real token, in block order: its block, its position in the block, its position in the stream."""
        block = np.repeat(np.arange(len(self.lengths), dtype=np.int64), self.lengths)
        within = np.arange(len(block), dtype=np.int64) - np.repeat(np.cumsum(self.lengths) - self.lengths, self.lengths)
        return block, within, self.offset[block] + within

    def position_ids(self) -> np.ndarray:
        """(1, W) int64: positions restarting at 0 per block; padding is 1 (it never starts a block, and it
        is a position of every encoder's table)."""
        positions = np.ones(self.width, dtype=np.int64)
        _, within, packed = self.token_positions()
        positions[packed] = within
        return positions.reshape(1, self.width)

    def segment_bounds(self) -> np.ndarray:
        """(S + 1,) int32: the bounds of the stream's segments, as the model would derive them from the positions
        (``spanlm.models.modeling_charbert.segment_bounds``): a segment starts at the stream's start, at each
        (non-empty) block, and at the padding right after a block; the last bound is the stream's width."""
        real = self.lengths > 0
        ends = (self.offset + self.lengths)[real]
        starts = np.concatenate([[0], self.offset[real], ends[ends < self.width]])
        return np.append(np.unique(starts), self.width).astype(np.int32)

    def source_index(self, padded_width: int) -> np.ndarray:
        """(1, W) int64: each packed token's flat position in the padded (B, ``padded_width``) layout, B·L for
        padding."""
        source = np.full(self.width, len(self.lengths) * padded_width, dtype=np.int64)
        block, within, packed = self.token_positions()
        source[packed] = block * padded_width + within
        return source.reshape(1, self.width)

    def pack(self, padded: np.ndarray, fill) -> np.ndarray:
        """A (B, L) per-token array of the padded layout as (1, W), ``fill`` where no token is."""
        out = np.full(self.width, fill, dtype=padded.dtype)
        block, within, packed = self.token_positions()
        out[packed] = padded[block, within]
        return out.reshape(1, self.width)

    @property
    def padding_share(self) -> float:
        """Share of the stream's positions that hold no token."""
        return 1.0 - float(self.lengths.sum()) / max(self.width, 1)


def stream_layout(lengths: np.ndarray, gap: int = 0) -> PackedLayout:
    """Blocks of ``lengths`` one after another, in batch order, in one stream.

    ``gap`` padding tokens separate neighbouring blocks (CharBERT's fusion convolution reads one token to
    each side, so one pad between blocks keeps them apart as padding does).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    offset = np.cumsum(lengths + gap) - lengths - gap  # each block after every earlier block and its gap
    width = int(lengths.sum()) + gap * max(len(lengths) - 1, 0)
    return PackedLayout(lengths=lengths, offset=offset, width=max(width, 1))


def stream_bounds(layout: PackedLayout) -> dict:
    """``cu_seq_lens`` (S + 1,) int32 and ``max_seq_len`` (an ``int``) of the stream ``layout``."""
    bounds = layout.segment_bounds()
    return {"cu_seq_lens": bounds, "max_seq_len": int(np.diff(bounds).max())}


def pack_masked(masked, pad_id: int, gap: int = 0):
    """The masked batch ``masked`` (one block per row, as the maskers build it) as one packed stream.

    Returns a copy of the same dataclass with ``input_ids`` / ``attention_mask`` (1, T), the packed
    ``position_ids``, ``cu_seq_lens``, ``max_seq_len`` and ``source_index``, and every flat position remapped
    (target order unchanged): the arrays ``masked.packing()`` calls flat or end, the scheme's own included.
    """
    batch_size, padded_width = masked.input_ids.shape
    layout = stream_layout(masked.attention_mask.sum(axis=1), gap)
    changes = {
        "input_ids": layout.pack(masked.input_ids, pad_id),
        "attention_mask": layout.pack(masked.attention_mask, False),
        "position_ids": layout.position_ids(),
        **stream_bounds(layout),
        "source_index": layout.source_index(padded_width),
    }
    extras = dict(masked.extras)
    for name, packing in masked.packing().items():
        positions = getattr(masked, name)
        if packing == FLAT:
            positions = layout.padded_to_packed(positions, padded_width)
        elif packing == END and len(positions):  # one past a block's last token: its last token's position + 1
            positions = layout.padded_to_packed(positions - 1, padded_width) + 1
        (extras if name in extras else changes)[name] = positions
    return dataclasses.replace(masked, **changes, extras=extras, extra_packing=dict(masked.extra_packing))


def pack_encoder_inputs(rows: dict[str, np.ndarray], pad_id: int, gap: int = 0) -> dict[str, np.ndarray | int]:
    """Fine-tuning windows (one per row of ``rows``' (B, L) arrays) packed into one stream for the encoder.

    Returns the packed ``input_ids``, ``attention_mask`` and (when given) ``token_type_ids`` (1, T), their
    ``position_ids``, ``cu_seq_lens``, ``max_seq_len`` (an ``int``) and ``source_index``, and ``unpack_index``
    (B, L): the stream position of each window token (0 for padding), which takes the encoder's output back to
    one window per row for the task head.
    """
    attention = np.asarray(rows["attention_mask"]).astype(bool)
    batch_size, length = attention.shape
    layout = stream_layout(attention.sum(axis=1), gap)
    packed = {
        "input_ids": layout.pack(np.asarray(rows["input_ids"]), pad_id),
        "attention_mask": layout.pack(attention, False),
    }
    if "token_type_ids" in rows:
        packed["token_type_ids"] = layout.pack(np.asarray(rows["token_type_ids"]), 0)
    unpack = np.zeros(batch_size * length, dtype=np.int64)
    block, within, flat = layout.token_positions()
    unpack[block * length + within] = flat
    return {
        **packed,
        "position_ids": layout.position_ids(),
        **stream_bounds(layout),
        "source_index": layout.source_index(length),
        "unpack_index": unpack.reshape(batch_size, length),
    }
