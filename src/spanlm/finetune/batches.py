"""Batches of a fine-tuning task's windows outside the training loader."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from spanlm.data.packing import pack_encoder_inputs


def to_device(batch: dict[str, torch.Tensor | int], device: torch.device) -> dict[str, torch.Tensor | int]:
    """``batch``'s tensors on ``device``; a packed batch's ``max_seq_len``, an int the attention takes on the
    host (spanlm.data.packing), stays as it is."""
    return {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in batch.items()}


def window_batch(
    rows: dict[str, np.ndarray], offsets: np.ndarray, texts: list[str], featurizer, packed: bool, pad_id: int
) -> dict[str, torch.Tensor | int]:
    """A batch of windows from their ``rows`` ((B, L) arrays cut to the longest window, and targets), with the
    inputs ``featurizer`` adds (CharBERT's characters, from the tokens' ``offsets`` (B, L, 2) into ``texts``),
    packed into one stream when ``packed`` (spanlm.data.packing), as tensors."""
    if featurizer is not None:
        rows.update(featurizer(rows["input_ids"], offsets, texts))
    if packed:
        rows.update(pack_encoder_inputs(rows, pad_id, getattr(featurizer, "packing_gap", 0)))
    # Arrays as tensors; a packed batch's max_seq_len stays the int the attention takes on the host.
    return {
        name: torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
        for name, value in rows.items()
    }


def held_out_batches(windows, batch_size: int, rank: int, world_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's held-out batches of ``windows`` (anything with ``len`` and ``batch(indices)``). Every rank
    gets the same number of windows, so the loop can average the losses over ranks."""
    mine = np.arange(len(windows) - len(windows) % world_size)[rank::world_size]
    for first in range(0, len(mine), batch_size):
        yield windows.batch(mine[first : first + batch_size])
