"""Batches of a fine-tuning task's windows outside the training loader."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch


def to_device(batch: dict[str, torch.Tensor | int], device: torch.device) -> dict[str, torch.Tensor | int]:
    """``batch``'s tensors on ``device``; a packed batch's ``max_seq_len``, an int the attention takes on the
    host (spanlm.data.packing), stays as it is."""
    return {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in batch.items()}


def held_out_batches(windows, batch_size: int, rank: int, world_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's held-out batches of ``windows`` (anything with ``len`` and ``batch(indices)``). Every rank
    gets the same number of windows, so the loop can average the losses over ranks."""
    mine = np.arange(len(windows) - len(windows) % world_size)[rank::world_size]
    for first in range(0, len(mine), batch_size):
        yield windows.batch(mine[first : first + batch_size])
