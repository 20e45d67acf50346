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
from spanlm.data.packing import pack_masked
from spanlm.errors import ConfigError, InputError
from spanlm.train.dist import uses_cuda


def split_blocks(n_blocks: int, eval_blocks: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed held-out set of blocks (never trained on) and the training blocks."""
    eval_blocks = min(eval_blocks, n_blocks // 10)
    order = np.random.default_rng([seed, 7919]).permutation(n_blocks)
    return np.sort(order[eval_blocks:]), np.sort(order[:eval_blocks])


class BatchKeySampler:
    """Yields ``(epoch, batch, block_indices)`` for this rank forever, epoch after epoch, from its position.

    A batch is ``batch_size`` blocks, or with ``tokens_per_batch`` the longest run of the epoch's order
    whose ``lengths`` sum to at most that many tokens. Token batches are cut from each rank's share of
    the epoch's permutation and every rank keeps the fewest any rank gets, so all ranks take the same
    number of steps; like the permutation, the cuts are a pure function of (seed, epoch).

    ``state_dict`` / ``load_state_dict``: the position ``{"epoch", "batch"}`` of the next key.
    """

    def __init__(self, blocks: np.ndarray, batch_size: int, seed: int, rank: int, world_size: int,
                 lengths: np.ndarray | None = None, tokens_per_batch: int = 0):
        self.blocks = blocks
        self.batch_size = batch_size
        self.tokens_per_batch = tokens_per_batch
        self.lengths = None if lengths is None else np.asarray(lengths, dtype=np.int64)
        if tokens_per_batch and self.lengths is None:
            raise ValueError("tokens_per_batch needs the blocks' lengths")
        try:
            self.order = BlockSampler(len(blocks), seed=seed, rank=rank, world_size=world_size)
            self.rank_orders = [BlockSampler(len(blocks), seed=seed, rank=r, world_size=world_size) for r in range(world_size)]
        except ValueError as error:  # fewer blocks than processes
            raise ConfigError(str(error)) from None
        self._starts: tuple[int, np.ndarray] | None = None  # (epoch, batch starts) of the last epoch asked for
        if tokens_per_batch:
            if self.lengths.max(initial=0) > tokens_per_batch:
                raise ConfigError(f"data.tokens_per_batch {tokens_per_batch} is less than the longest block "
                                  f"({int(self.lengths.max())} tokens)")
            if self.batches_per_epoch(0) < 1:
                raise ConfigError(f"{len(blocks)} training blocks over {world_size} process(es) is less than one batch of "
                                  f"{tokens_per_batch} tokens: lower data.tokens_per_batch or give more data")
        elif len(self.order) < batch_size:
            raise ConfigError(f"{len(blocks)} training blocks over {world_size} process(es) is less than one batch of "
                              f"{batch_size}: lower train.batch_size or give more data")
        self.epoch, self.batch = 0, 0

    def batch_starts(self, epoch: int) -> np.ndarray:
        """(batches + 1,) where each of this rank's batches of ``epoch`` begins in its order, and where the last ends."""
        if not self.tokens_per_batch:
            return np.arange(len(self.order) // self.batch_size + 1) * self.batch_size
        if self._starts is None or self._starts[0] != epoch:
            cuts = [self._token_cuts(sampler.order(epoch)) for sampler in self.rank_orders]
            self._starts = (epoch, cuts[self.order.rank][: min(len(c) for c in cuts)])
        return self._starts[1]

    def _token_cuts(self, order: np.ndarray) -> np.ndarray:
        """Greedy cuts of ``order`` into runs of at most ``tokens_per_batch`` tokens; a short tail is dropped."""
        total = np.cumsum(self.lengths[self.blocks[order]])  # (n,) tokens up to and including each block
        cuts = [0]
        # One step per batch: the next cut is the first block that would overflow the budget.
        while cuts[-1] < len(order):
            before = int(total[cuts[-1] - 1]) if cuts[-1] else 0
            end = int(np.searchsorted(total, before + self.tokens_per_batch, side="right"))
            if end == len(order) and total[-1] - before < self.tokens_per_batch:
                break  # the epoch's tail: fewer tokens than a batch
            cuts.append(end)
        return np.asarray(cuts, dtype=np.int64)

    def batches_per_epoch(self, epoch: int = 0) -> int:
        return len(self.batch_starts(epoch)) - 1

    def following(self, position: dict) -> dict:
        """The position after ``position``."""
        epoch, batch = position["epoch"], position["batch"] + 1
        return {"epoch": epoch, "batch": batch} if batch < self.batches_per_epoch(epoch) else {"epoch": epoch + 1, "batch": 0}

    def __iter__(self):
        while True:
            order = self.blocks[self.order.order(self.epoch)]
            starts = self.batch_starts(self.epoch)
            while self.batch < len(starts) - 1:
                key = (self.epoch, self.batch, order[starts[self.batch]:starts[self.batch + 1]])
                self.batch += 1
                yield key
            self.epoch, self.batch = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


class MaskedBatches(torch.utils.data.Dataset):
    """Map-style dataset keyed by batch: key → masked batch as a dict of tensors.

    ``pack_width``: pack the masked blocks into rows of that many tokens (:mod:`spanlm.data.packing`;
    rows widen to a block that outgrew it, as CharBERT's noise may). Masking comes first, on one block
    per row, so a key gives the same masks packed or not.
    """

    def __init__(self, blocks: BlockDataset, masker, pad_id: int, seed: int, rank: int, pack_width: int | None = None):
        self.blocks, self.masker, self.pad_id, self.seed, self.rank = blocks, masker, pad_id, seed, rank
        self.pack_width = pack_width

    def __getitem__(self, key) -> dict[str, torch.Tensor]:
        epoch, batch, indices = key
        block_batch = collate_blocks([self.blocks[int(i)] for i in indices], self.pad_id)
        rng = np.random.default_rng([self.seed, self.rank, epoch, batch])
        masked = self.masker(block_batch, rng)
        if self.pack_width:
            width = max(self.pack_width, masked.input_ids.shape[1])
            masked = pack_masked(masked, width, self.pad_id, getattr(self.masker, "packing_gap", 0))
        return masked.to_torch()


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


def block_lengths(blocks: BlockDataset) -> np.ndarray:
    """(n_blocks,) tokens of every block, [CLS] and [SEP] included."""
    return blocks.index[:, 1] - blocks.index[:, 0] + 2


def build_train_loader(blocks: BlockDataset, train_blocks: np.ndarray, masker, config, seed: int, rank: int, world_size: int,
                       data=None) -> KeyedLoader:
    """The resumable pretraining loader; ``data`` (DataConfig, its ``packing`` resolved) packs rows and sets a token budget."""
    tokens = data.tokens_per_batch if data is not None else 0
    sampler = BatchKeySampler(train_blocks, config.batch_size, seed, rank, world_size,
                              lengths=block_lengths(blocks), tokens_per_batch=tokens)
    dataset = MaskedBatches(blocks, masker, blocks.corpus.special_ids["pad"], seed, rank, pack_width(data))
    return KeyedLoader(dataset, sampler, config.num_workers, seed, pin_memory=uses_cuda(config.device))


def pack_width(data) -> int | None:
    """Rows of ``data.max_len`` when ``data.packing`` is true, else None (padded batches)."""
    if data is None or data.packing is False:
        return None
    if data.packing is not True:
        raise ValueError(f"data.packing must be resolved to true / false before batching, not {data.packing!r}")
    return data.max_len


def build_window_loader(windows, config, seed: int, rank: int, world_size: int, tokens_per_batch: int = 0) -> KeyedLoader:
    """The resumable training loader of a fine-tuning task over ``len(windows)`` windows (``windows.pack_width``
    packs them), ``config.batch_size`` windows or ``tokens_per_batch`` tokens a batch."""
    try:
        sampler = BatchKeySampler(np.arange(len(windows)), config.batch_size, seed, rank, world_size,
                                  lengths=windows.attention_mask.sum(axis=1), tokens_per_batch=tokens_per_batch)
    except ConfigError as error:
        raise ConfigError(f"data.train: {error}") from None
    return KeyedLoader(WindowBatches(windows), sampler, config.num_workers, seed, pin_memory=uses_cuda(config.device))


EVAL_EPOCH = 2**31 - 1  # the RNG key of held-out batches: never a training epoch


def eval_batches(blocks: BlockDataset, eval_blocks: np.ndarray, masker, batch_size: int, seed: int, rank: int, world_size: int,
                 data=None):
    """This rank's held-out blocks, masked with fixed RNGs so every evaluation sees the same batches.

    Every rank gets the same number of batches (the held-out set is trimmed to a multiple of the
    world size), so the metrics can be reduced across ranks.
    """
    dataset = MaskedBatches(blocks, masker, blocks.corpus.special_ids["pad"], seed, rank, pack_width(data))
    mine = eval_blocks[: len(eval_blocks) - len(eval_blocks) % world_size][rank::world_size]
    for number, start in enumerate(range(0, len(mine), batch_size)):
        yield dataset[(EVAL_EPOCH, number, mine[start:start + batch_size])]
