"""Packed batches: several blocks (or fine-tuning windows) share one row, each attending only to itself.

A padded batch computes every row to the length of its longest block; a packed batch places the blocks
one after another in rows of ``width`` tokens (first-fit decreasing, a pure function of the lengths),
so the encoder computes little padding. Three arrays describe a packed batch to the model:

* ``input_ids`` (R, W) and ``attention_mask`` (R, W) — real tokens, as in a padded batch;
* ``position_ids`` (R, W) — positions restarting at 0 at every block start, the convention of
  transformers' ``DataCollatorWithFlattening``; a block is the run from one 0 to the next, so the
  model derives its block-diagonal attention mask from them (:mod:`spanlm.models.packed`);
* ``source_index`` (R, W) — the flat position ``b·L + t`` in the padded (B, L) layout of each packed
  token, ``B·L`` for padding: what maps per-block inputs (CharBERT's char channel) into the packed layout.

Maskers keep working on the padded block layout (one block per row), so every per-block rule — the
masking budget, spans and whole words inside their block, SBO boundaries, RTD over real tokens — holds
by construction; :func:`pack_masked` then moves the corrupted ids and remaps every flat target position.
The masks drawn from a batch key are the same packed or padded, so a packed batch gives the padded
batch's losses (tests/data/test_packing.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Fields of a MaskedBatch (and its subclasses) holding flat positions into the (B, L) layout.
FLAT_POSITIONS = ("target_index", "sbo_index", "sbo_left", "sbo_right", "nlm_index", "span_start")
EXCLUSIVE_END_POSITIONS = ("span_end",)
# Per-block inputs that stay in the block layout (the model maps them with source_index).
BLOCK_LAYOUT_FIELDS = ("char_ids", "char_lengths", "char_first", "char_last")


@dataclasses.dataclass(frozen=True)
class PackedLayout:
    """Where each of B blocks lies in the packed (rows, width) layout."""

    lengths: np.ndarray  # (B,) tokens of each block
    row: np.ndarray  # (B,) its row
    offset: np.ndarray  # (B,) its first column
    rows: int
    width: int

    def padded_to_packed(self, flat: np.ndarray, padded_width: int) -> np.ndarray:
        """Flat positions ``b·L + t`` of the padded layout → ``row·W + offset + t`` of the packed one."""
        flat = np.asarray(flat, dtype=np.int64)
        block, column = flat // padded_width, flat % padded_width
        return self.row[block] * self.width + self.offset[block] + column

    def token_positions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every real token, in block order: its block, its position in the block, its packed flat position."""
        block = np.repeat(np.arange(len(self.lengths), dtype=np.int64), self.lengths)
        within = np.arange(len(block), dtype=np.int64) - np.repeat(np.cumsum(self.lengths) - self.lengths, self.lengths)
        return block, within, (self.row * self.width + self.offset)[block] + within

    def position_ids(self) -> np.ndarray:
        """(R, W) int64: positions restarting at 0 per block; padding is 1 (it never starts a block, and it
        is a position of every encoder's table however wide the row)."""
        positions = np.ones(self.rows * self.width, dtype=np.int64)
        _, within, packed = self.token_positions()
        positions[packed] = within
        return positions.reshape(self.rows, self.width)

    def source_index(self, padded_width: int) -> np.ndarray:
        """(R, W) int64: each packed token's flat position in the padded (B, ``padded_width``) layout, B·L for padding."""
        source = np.full(self.rows * self.width, len(self.lengths) * padded_width, dtype=np.int64)
        block, within, packed = self.token_positions()
        source[packed] = block * padded_width + within
        return source.reshape(self.rows, self.width)

    def pack(self, padded: np.ndarray, fill) -> np.ndarray:
        """A (B, L) per-token array of the padded layout as (R, W), ``fill`` where no token is."""
        out = np.full(self.rows * self.width, fill, dtype=padded.dtype)
        block, within, packed = self.token_positions()
        out[packed] = padded[block, within]
        return out.reshape(self.rows, self.width)

    @property
    def padding_share(self) -> float:
        """Share of the packed layout's positions that hold no token."""
        return 1.0 - float(self.lengths.sum()) / (self.rows * self.width)


def pack_lengths(lengths: np.ndarray, width: int, gap: int = 0) -> PackedLayout:
    """First-fit decreasing of blocks of ``lengths`` into rows of at most ``width`` tokens.

    ``gap`` padding tokens follow every block that has a neighbour after it (CharBERT's fusion convolution
    reads one token to each side, so one pad between blocks keeps them apart as padding does). The
    placement depends on the lengths only (ties keep block order), so it is a pure function of the batch.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and int(lengths.max()) > width:
        raise ValueError(f"a block of {int(lengths.max())} tokens does not fit rows of {width}")
    order = np.argsort(-lengths, kind="stable")
    free = np.zeros(0, dtype=np.int64)  # room left in each open row
    row = np.zeros(len(lengths), dtype=np.int64)
    offset = np.zeros(len(lengths), dtype=np.int64)
    # One step per block, at most a few hundred per batch: the first row with room for it (gap included).
    for block in order.tolist():
        need = int(lengths[block])
        fits = np.flatnonzero(free >= need + gap)
        if len(fits):
            target = int(fits[0])
            offset[block] = width - free[target] + gap
            free[target] -= need + gap
        else:
            target = len(free)
            free = np.append(free, width - need)
        row[block] = target
    # Columns no row reaches are dropped: a batch of short blocks is not widened to ``width``.
    used = int((offset + lengths).max(initial=1))
    return PackedLayout(lengths=lengths, row=row, offset=offset, rows=len(free), width=used)


def pack_masked(masked, width: int, pad_id: int, gap: int = 0):
    """The masked batch ``masked`` (one block per row, as the maskers build it) in the packed layout.

    Returns a copy of the same dataclass with ``input_ids`` / ``attention_mask`` (R, W), the packed
    ``position_ids`` and ``source_index``, and every flat position remapped (target order unchanged).
    """
    batch_size, padded_width = masked.input_ids.shape
    lengths = masked.attention_mask.sum(axis=1).astype(np.int64)
    layout = pack_lengths(lengths, width, gap)
    changes = {
        "input_ids": layout.pack(masked.input_ids, pad_id),
        "attention_mask": layout.pack(masked.attention_mask, False),
        "position_ids": layout.position_ids(),
        "source_index": layout.source_index(padded_width),
    }
    for name in FLAT_POSITIONS:
        changes[name] = layout.padded_to_packed(getattr(masked, name), padded_width)
    for name in EXCLUSIVE_END_POSITIONS:  # one past a block's last token may be past its row's end
        end = getattr(masked, name)
        changes[name] = layout.padded_to_packed(end - 1, padded_width) + 1 if len(end) else end
    return dataclasses.replace(masked, **changes)


def pack_encoder_inputs(rows: dict[str, np.ndarray], width: int, pad_id: int, gap: int = 0) -> dict[str, np.ndarray]:
    """Fine-tuning windows (one per row of ``rows``' (B, L) arrays) packed for the encoder.

    Returns the packed ``input_ids``, ``attention_mask`` and (when given) ``token_type_ids`` (R, W), their
    ``position_ids`` and ``source_index``, and ``unpack_index`` (B, L): the packed flat position of each
    window token (0 for padding), which takes the encoder's output back to one window per row for the
    task head. Rows widen to the longest window when it is longer than ``width``.
    """
    attention = np.asarray(rows["attention_mask"]).astype(bool)
    batch_size, length = attention.shape
    lengths = attention.sum(axis=1).astype(np.int64)
    layout = pack_lengths(lengths, max(width, int(lengths.max(initial=1))), gap)
    packed = {"input_ids": layout.pack(np.asarray(rows["input_ids"]), pad_id), "attention_mask": layout.pack(attention, False)}
    if "token_type_ids" in rows:
        packed["token_type_ids"] = layout.pack(np.asarray(rows["token_type_ids"]), 0)
    unpack = np.zeros(batch_size * length, dtype=np.int64)
    block, within, flat = layout.token_positions()
    unpack[block * length + within] = flat
    return {**packed, "position_ids": layout.position_ids(), "source_index": layout.source_index(length),
            "unpack_index": unpack.reshape(batch_size, length)}
