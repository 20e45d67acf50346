"""Batches of a fine-tuning task's windows outside the training loader."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch


def held_out_batches(windows, batch_size: int, rank: int, world_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's held-out batches of ``windows`` (anything with ``len`` and ``batch(indices)``). Every rank
    gets the same number of windows, so the loop can average the losses over ranks."""
    mine = np.arange(len(windows) - len(windows) % world_size)[rank::world_size]
    for first in range(0, len(mine), batch_size):
        yield windows.batch(mine[first : first + batch_size])
