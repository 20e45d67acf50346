"""Batches of a fine-tuning task's windows: the resumable training loader over them (keyed like pretraining's),
and the held-out batches."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from spanlm.data.packing import pack_encoder_inputs
from spanlm.errors import ConfigError
from spanlm.train.dist import uses_cuda
from spanlm.train.loader import BatchKeySampler, KeyedLoader


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


class WindowBatches(torch.utils.data.Dataset):
    """Fine-tuning windows (NER, QA) keyed by batch like the pretraining batches: key → ``windows.batch(indices)``."""

    def __init__(self, windows):
        self.windows = windows

    def __getitem__(self, key) -> dict[str, torch.Tensor | int]:
        _, _, indices = key
        return self.windows.batch(indices)


def build_window_loader(
    windows, config, seed: int, rank: int, world_size: int, tokens_per_batch: int = 0
) -> KeyedLoader:
    """The resumable training loader of a fine-tuning task over ``len(windows)`` windows (``windows.packed``
    packs them), ``config.batch_size`` windows or ``tokens_per_batch`` tokens a batch."""
    try:
        sampler = BatchKeySampler(
            np.arange(len(windows)),
            config.batch_size,
            seed,
            rank,
            world_size,
            lengths=windows.attention_mask.sum(axis=1),
            tokens_per_batch=tokens_per_batch,
        )
    except ConfigError as error:
        raise ConfigError(f"data.train: {error}") from None
    return KeyedLoader(WindowBatches(windows), sampler, config.num_workers, seed, pin_memory=uses_cuda(config.device))
