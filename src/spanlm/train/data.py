"""Training data: blocks → masked batches in DataLoader workers, deterministic and resumable.

Each batch is a pure function of (seed, rank, epoch, batch number): the sampler yields a *key* per
batch, and the dataset builds the whole batch from it — reading the blocks, padding them, and masking
them with ``np.random.default_rng([seed, rank, epoch, batch])``. So the masks do not depend on the
number of workers or on prefetching, and the position of the next batch to hand out is all a loader
has to remember to resume exactly (:class:`KeyedLoader`).
"""

from __future__ import annotations

import numpy as np
import torch

from spanlm.data.blocks import BlockDataset, BlockSampler, collate_blocks
from spanlm.errors import ConfigError, InputError
from spanlm.train.dist import uses_cuda


def split_blocks(n_blocks: int, eval_blocks: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed held-out set of blocks (never trained on) and the training blocks."""
    eval_blocks = min(eval_blocks, n_blocks // 10)
    order = np.random.default_rng([seed, 7919]).permutation(n_blocks)
    return np.sort(order[eval_blocks:]), np.sort(order[:eval_blocks])


class BatchKeySampler:
    """Yields ``(epoch, batch, block_indices)`` for this rank forever, epoch after epoch, from its position.

    ``state_dict`` / ``load_state_dict``: the position ``{"epoch", "batch"}`` of the next key.
    """

    def __init__(self, blocks: np.ndarray, batch_size: int, seed: int, rank: int, world_size: int):
        self.blocks = blocks
        self.batch_size = batch_size
        try:
            self.order = BlockSampler(len(blocks), seed=seed, rank=rank, world_size=world_size)
        except ValueError as error:  # fewer blocks than processes
            raise ConfigError(str(error)) from None
        if len(self.order) < batch_size:
            raise ConfigError(f"{len(blocks)} training blocks over {world_size} process(es) is less than one batch of "
                              f"{batch_size}: lower train.batch_size or give more data")
        self.epoch, self.batch = 0, 0

    def batches_per_epoch(self) -> int:
        return len(self.order) // self.batch_size

    def following(self, position: dict) -> dict:
        """The position after ``position``."""
        epoch, batch = position["epoch"], position["batch"] + 1
        return {"epoch": epoch, "batch": batch} if batch < self.batches_per_epoch() else {"epoch": epoch + 1, "batch": 0}

    def __iter__(self):
        while True:
            order = self.blocks[self.order.order(self.epoch)]
            while self.batch < self.batches_per_epoch():
                start = self.batch * self.batch_size
                key = (self.epoch, self.batch, order[start:start + self.batch_size])
                self.batch += 1
                yield key
            self.epoch, self.batch = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


class MaskedBatches(torch.utils.data.Dataset):
    """Map-style dataset keyed by batch: key → masked batch as a dict of tensors."""

    def __init__(self, blocks: BlockDataset, masker, pad_id: int, seed: int, rank: int):
        self.blocks, self.masker, self.pad_id, self.seed, self.rank = blocks, masker, pad_id, seed, rank

    def __getitem__(self, key) -> dict[str, torch.Tensor]:
        epoch, batch, indices = key
        block_batch = collate_blocks([self.blocks[int(i)] for i in indices], self.pad_id)
        rng = np.random.default_rng([self.seed, self.rank, epoch, batch])
        return self.masker(block_batch, rng).to_torch()


class WindowBatches(torch.utils.data.Dataset):
    """Fine-tuning windows (NER, QA) keyed by batch like the pretraining batches: key → ``windows.batch(indices)``."""

    def __init__(self, windows):
        self.windows = windows

    def __getitem__(self, key) -> dict[str, torch.Tensor]:
        _, _, indices = key
        return self.windows.batch(indices)


def _single(batch):
    return batch


class KeyedLoader:
    """A DataLoader over a keyed dataset (each sampler key is one whole batch), resumable with any
    number of workers.

    Its state is the position of the next batch it will hand out. Since a batch is a pure function of
    its key, starting the sampler there gives exactly the batches that would have come next, whatever
    ``num_workers`` and however far the workers had prefetched. (torchdata's StatefulDataLoader
    snapshots its workers instead, so its state resumes only with the same number of workers.)
    """

    def __init__(self, dataset: torch.utils.data.Dataset, sampler: BatchKeySampler, num_workers: int, seed: int,
                 pin_memory: bool = False):
        self.sampler = sampler
        self.position = sampler.state_dict()
        self.loader = torch.utils.data.DataLoader(
            dataset, sampler=sampler, batch_size=None, collate_fn=_single, num_workers=num_workers,
            persistent_workers=num_workers > 0, prefetch_factor=4 if num_workers > 0 else None,
            pin_memory=pin_memory,  # page-locked batches: the loop's non_blocking copies to the GPU overlap compute
            # Its own generator: creating an iterator must not draw from the global torch RNG, which the
            # model's dropout uses and a resumed run restores (a draw there would break bit-exact resume).
            generator=torch.Generator().manual_seed(seed),
        )

    def __iter__(self):
        self.sampler.load_state_dict(self.position)  # the workers are fed keys from here on
        for batch in self.loader:
            self.position = self.sampler.following(self.position)
            yield batch

    def state_dict(self) -> dict:
        return dict(self.position)

    def load_state_dict(self, state: dict) -> None:
        """Set the position of the next batch (before iterating)."""
        if "epoch" not in state or "batch" not in state:
            raise InputError("the checkpoint's data position is a torchdata StatefulDataLoader state, written by an earlier "
                             "spanlm; resume it with that version, or continue from an export of it in a new run")
        self.position = {"epoch": int(state["epoch"]), "batch": int(state["batch"])}


def build_train_loader(blocks: BlockDataset, train_blocks: np.ndarray, masker, config, seed: int, rank: int, world_size: int) -> KeyedLoader:
    sampler = BatchKeySampler(train_blocks, config.batch_size, seed, rank, world_size)
    dataset = MaskedBatches(blocks, masker, blocks.corpus.special_ids["pad"], seed, rank)
    return KeyedLoader(dataset, sampler, config.num_workers, seed, pin_memory=uses_cuda(config.device))


def build_window_loader(windows, config, seed: int, rank: int, world_size: int) -> KeyedLoader:
    """The resumable training loader of a fine-tuning task over ``len(windows)`` windows."""
    try:
        sampler = BatchKeySampler(np.arange(len(windows)), config.batch_size, seed, rank, world_size)
    except ConfigError as error:
        raise ConfigError(f"data.train: {error}") from None
    return KeyedLoader(WindowBatches(windows), sampler, config.num_workers, seed, pin_memory=uses_cuda(config.device))


EVAL_EPOCH = 2**31 - 1  # the RNG key of held-out batches: never a training epoch


def eval_batches(blocks: BlockDataset, eval_blocks: np.ndarray, masker, batch_size: int, seed: int, rank: int, world_size: int):
    """This rank's held-out blocks, masked with fixed RNGs so every evaluation sees the same batches.

    Every rank gets the same number of batches (the held-out set is trimmed to a multiple of the
    world size), so the metrics can be reduced across ranks.
    """
    dataset = MaskedBatches(blocks, masker, blocks.corpus.special_ids["pad"], seed, rank)
    mine = eval_blocks[: len(eval_blocks) - len(eval_blocks) % world_size][rank::world_size]
    for number, start in enumerate(range(0, len(mine), batch_size)):
        yield dataset[(EVAL_EPOCH, number, mine[start:start + batch_size])]
