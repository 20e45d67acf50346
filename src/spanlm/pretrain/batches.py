"""Pretraining's batches: the held-out split of the prepared blocks, and blocks → masked batches by key.

A key is the engine's (:class:`spanlm.train.loader.BatchKeySampler`): (epoch, batch, block indices). The batch is
masked with ``np.random.default_rng([seed, rank, epoch, batch])``, so it is the same whatever the workers, packed
or not, and a resumed run draws exactly the batches that would have come next.
"""

from __future__ import annotations

import numpy as np
import torch

from spanlm.data.block_index import ConcatenatedIndex
from spanlm.data.blocks import BlockDataset, KeyedPermutation, collate_blocks
from spanlm.data.packing import pack_masked
from spanlm.masking.base import with_rate
from spanlm.train.dist import uses_cuda
from spanlm.train.loader import BatchKeySampler, KeyedLoader, packs

HELD_OUT_KEY = 7919  # the RNG key of the held-out draw: never an epoch's


def split_blocks(n_blocks: int, eval_blocks: int, seed: int) -> tuple[TrainingBlocks, np.ndarray]:
    """A fixed held-out set of blocks (never trained on), sorted, and the training blocks (the rest).

    The held-out blocks are the first positions of a keyed permutation, so drawing them costs memory for
    them only, whatever ``n_blocks``.
    """
    eval_blocks = min(eval_blocks, n_blocks // 10)
    draw = KeyedPermutation(n_blocks, np.random.default_rng([seed, HELD_OUT_KEY]))
    held_out = np.sort(draw(np.arange(eval_blocks)))
    return TrainingBlocks(n_blocks, held_out), held_out


def split_held_out_text(
    blocks: BlockDataset, reference: BlockDataset, reference_blocks: int, eval_blocks: int, seed: int
) -> tuple[TrainingBlocks, np.ndarray]:
    """:func:`split_blocks` of ``blocks`` by the text it holds out: the blocks :func:`split_blocks` holds out of the
    first ``reference_blocks`` of ``reference`` (the same corpus in blocks of another length, or fewer shards), as
    token spans. The blocks of ``blocks`` inside a span are held out (scored); those that overlap one are neither
    trained on nor scored. So every phase of a curriculum, whatever its block length, holds out the same text and
    never trains on it (a split by block index would name other text at each length)."""
    if reference.max_len == blocks.max_len and reference_blocks == len(blocks):
        return split_blocks(len(blocks), eval_blocks, seed)
    _, chosen = split_blocks(reference_blocks, eval_blocks, seed)
    spans = np.array([reference.index[int(i)] for i in chosen], dtype=np.int64).reshape(-1, 2)  # (E, 2) [start, end)
    index = blocks.index if isinstance(blocks.index, np.ndarray) else np.asarray(blocks.index)  # a memmap stays one
    starts, ends = index[:, 0], index[:, 1]  # both increasing: blocks follow the corpus
    first = np.searchsorted(ends, spans[:, 0], side="right")  # the first block that ends after the span starts
    after = np.searchsorted(starts, spans[:, 1], side="left")  # the first block that starts at or after its end
    overlapping = np.unique(np.concatenate([np.arange(f, a) for f, a in zip(first, after)] + [np.zeros(0, np.int64)]))
    span = np.searchsorted(spans[:, 0], starts[overlapping], side="right") - 1  # the span a block could lie in
    inside = (span >= 0) & (ends[overlapping] <= spans[np.maximum(span, 0), 1])
    return TrainingBlocks(len(blocks), overlapping), overlapping[inside]


class TrainingBlocks:
    """The blocks [0, n_blocks) less a few sorted ``held_out`` ones, indexed by position without listing them.

    ``training[p]`` is the p-th block not held out (``p`` an int or an array of positions).
    """

    def __init__(self, n_blocks: int, held_out: np.ndarray):
        self.n_blocks, self.held_out = n_blocks, np.asarray(held_out, dtype=np.int64)
        self.kept_before = self.held_out - np.arange(len(self.held_out))  # training blocks before each held-out one

    def __len__(self) -> int:
        return self.n_blocks - len(self.held_out)

    def __getitem__(self, positions):
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self)):
            raise IndexError(f"training block positions outside [0, {len(self)})")
        # The p-th kept block comes after every held-out block with at most p kept blocks before it.
        return positions + np.searchsorted(self.kept_before, positions, side="right")


class MixedBlocks:
    """The training blocks of a sharded corpus drawn by shard weight: each epoch holds ``c_s`` blocks of shard ``s``,
    its share of the training blocks as its weight says (a downweighted shard's fewer, an upweighted one's repeated),
    for a mixture of sources in one run (ModernBERT's and mmBERT's data mixes; a phase may change the weights).

    Positions [0, M) are laid out shard after shard; position ``k`` of shard ``s``'s segment is its training block
    ``(k + epoch · c_s) mod n_s``, so a downweighted shard's window moves on each epoch and every block is reached,
    and the epoch's permutation of the positions (spanlm.train.loader) mixes the shards. A pure function of the
    epoch and the position: nothing is held per block, and a resume draws the same blocks.
    """

    def __init__(self, training: TrainingBlocks, shard_block_starts: np.ndarray, weights: list[float]):
        self.training = training
        # each shard's training positions (shards are contiguous in block order): its blocks less the held-out ones
        bounds = np.append(shard_block_starts, training.n_blocks)
        held = training.held_out
        first = bounds[:-1] - np.searchsorted(held, bounds[:-1])
        last = bounds[1:] - np.searchsorted(held, bounds[1:])
        self.first, self.sizes = first.astype(np.int64), (last - first).astype(np.int64)
        shares = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
        # a source with blocks and a weight draws at least one a epoch; a weight of 0 keeps it out
        drawn = (self.sizes > 0) & (shares > 0)
        self.counts = np.where(drawn, np.maximum(np.rint(len(training) * shares), 1), 0).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def at(self, epoch: int, positions) -> np.ndarray:
        """The block indices at ``positions`` of ``epoch``'s layout."""
        positions = np.asarray(positions, dtype=np.int64)
        shard = np.searchsorted(self.offsets, positions, side="right") - 1
        within = (positions - self.offsets[shard] + epoch * self.counts[shard]) % self.sizes[shard]
        return self.training[self.first[shard] + within]


class BlockLengths:
    """Tokens of blocks ([CLS] and [SEP] included), read from the memory-mapped block index on demand.

    ``lengths[indices]`` for an array of block indices; ``max()`` is ``max_len``, the longest a block can be
    (the index is not read whole to find the longest one).
    """

    def __init__(self, blocks: BlockDataset):
        self.index, self.max_len = blocks.index, blocks.max_len

    def __getitem__(self, indices) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        if isinstance(self.index, ConcatenatedIndex):  # rows of each shard's own index (offsets cancel out)
            shard = np.searchsorted(self.index.block_starts, indices, side="right") - 1
            lengths = np.empty(indices.shape, dtype=np.int64)
            for number in np.unique(shard).tolist():
                mine = shard == number
                rows = self.index.parts[number][indices[mine] - self.index.block_starts[number]]
                lengths[mine] = rows[..., 1] - rows[..., 0] + 2
            return lengths
        rows = self.index[indices]
        return (rows[..., 1] - rows[..., 0] + 2).astype(np.int64)

    def max(self) -> int:
        return self.max_len


class ScheduledRate:
    """The masking rate of a training batch from its key: the key's batch number (:meth:`BatchKeySampler.number`)
    → its optimiser step in the run (``grad_accum`` micro-batches a step, after the ``first_step`` a phase starts at)
    → ``schedule.rate_at(step)``."""

    def __init__(self, schedule, sampler: BatchKeySampler, grad_accum: int, first_step: int = 0):
        self.schedule, self.sampler, self.grad_accum, self.first_step = schedule, sampler, grad_accum, first_step

    def __call__(self, epoch: int, batch: int) -> float:
        if epoch == EVAL_EPOCH:
            return self.schedule.final_rate
        return self.schedule.rate_at(self.first_step + self.sampler.number(epoch, batch) // self.grad_accum)


class MaskedBatches(torch.utils.data.Dataset):
    """Map-style dataset keyed by batch: key → masked batch as a dict of tensors.

    ``packed``: the masked blocks one after another in one stream (:mod:`spanlm.data.packing`), with the
    stream's segment bounds and longest segment, computed here so the model reads neither from the device.
    Masking comes first, on one block per row, so a key gives the same masks packed or not.
    ``rate``: (epoch, batch) → the masking rate of that batch (a :class:`ScheduledRate`); None: the masker's own.
    """

    def __init__(
        self,
        blocks: BlockDataset,
        masker,
        pad_id: int,
        seed: int,
        rank: int,
        packed: bool = False,
        fields: tuple[str, ...] | None = None,
        rate=None,
    ):
        self.blocks, self.masker, self.pad_id, self.seed, self.rank = blocks, masker, pad_id, seed, rank
        self.packed = packed
        self.fields = fields  # the arrays the objective reads (Objective.batch_fields); None: all
        self.rate = rate

    def __getitem__(self, key) -> dict[str, torch.Tensor | int]:
        epoch, batch, indices = key
        block_batch = collate_blocks([self.blocks[int(i)] for i in indices], self.pad_id)
        rng = np.random.default_rng([self.seed, self.rank, epoch, batch])
        masker = self.masker if self.rate is None else with_rate(self.masker, self.rate(epoch, batch))
        masked = masker(block_batch, rng)
        if self.packed:
            masked = pack_masked(masked, self.pad_id, getattr(self.masker, "packing_gap", 0))
        return masked.to_torch() if self.fields is None else masked.to_torch(self.fields)


def build_train_loader(
    blocks: BlockDataset,
    train_blocks: np.ndarray,
    masker,
    config,
    seed: int,
    rank: int,
    world_size: int,
    data=None,
    fields: tuple[str, ...] | None = None,
    rate_schedule=None,
) -> KeyedLoader:
    """The resumable pretraining loader; ``data`` (DataConfig, its ``packing`` resolved) packs batches and sets a
    token budget; ``fields``: the batch arrays the objective reads (None: all); ``rate_schedule``: the masking
    rate by step (a :class:`~spanlm.masking.base.RateSchedule`; None or constant: the masker's own)."""
    tokens = data.tokens_per_batch if data is not None else 0
    sampler = BatchKeySampler(
        train_blocks, config.batch_size, seed, rank, world_size, lengths=BlockLengths(blocks), tokens_per_batch=tokens
    )
    active = rate_schedule is not None and rate_schedule.active
    rate = ScheduledRate(rate_schedule, sampler, config.grad_accum, config.first_step) if active else None
    dataset = MaskedBatches(blocks, masker, blocks.corpus.special_ids["pad"], seed, rank, packs(data), fields, rate)
    return KeyedLoader(dataset, sampler, config.num_workers, seed, pin_memory=uses_cuda(config.device))


EVAL_EPOCH = 2**31 - 1  # the RNG key of held-out batches: never a training epoch


def eval_batches(
    blocks: BlockDataset,
    eval_blocks: np.ndarray,
    masker,
    batch_size: int,
    seed: int,
    rank: int,
    world_size: int,
    data=None,
    fields: tuple[str, ...] | None = None,
    rate_schedule=None,
):
    """This rank's held-out blocks, masked with fixed RNGs so every evaluation sees the same batches.

    Every rank gets the same number of batches (the held-out set is trimmed to a multiple of the
    world size), so the metrics can be reduced across ranks. Under a masking-rate schedule they are masked at
    its last rate, so every evaluation of the run is scored on the same targets.
    """
    if rate_schedule is not None and rate_schedule.active:
        masker = with_rate(masker, rate_schedule.final_rate)
    dataset = MaskedBatches(blocks, masker, blocks.corpus.special_ids["pad"], seed, rank, packs(data), fields)
    mine = eval_blocks[: len(eval_blocks) - len(eval_blocks) % world_size][rank::world_size]
    for number, start in enumerate(range(0, len(mine), batch_size)):
        yield dataset[(EVAL_EPOCH, number, mine[start : start + batch_size])]
