"""Training data: blocks → masked batches in DataLoader workers, deterministic and resumable.

Each batch is a pure function of (seed, rank, epoch, batch number): the sampler yields a *key* per
batch, and the dataset builds the whole batch from it — reading the blocks, padding them, and masking
them with ``np.random.default_rng([seed, rank, epoch, batch])``. So the masks do not depend on the
number of workers or on prefetching, and the position of the next batch to hand out is all a loader
has to remember to resume exactly (:class:`KeyedLoader`).
"""

from __future__ import annotations

import contextlib
import functools
import signal

import numpy as np
import torch

from spanlm.data.block_index import ConcatenatedIndex
from spanlm.data.blocks import BlockDataset, BlockSampler, KeyedPermutation, collate_blocks
from spanlm.data.packing import pack_masked
from spanlm.errors import ConfigError, InputError
from spanlm.masking.base import with_rate
from spanlm.train.dist import uses_cuda

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


class BatchKeySampler:
    """Yields ``(epoch, batch, block_indices)`` for this rank forever, epoch after epoch, from its position.

    ``blocks``: the blocks to draw from, indexable by an array of positions (an array, or
    :class:`TrainingBlocks`). Each epoch's order is a :class:`BlockSampler`'s, computed a batch at a time,
    so the sampler holds nothing per block.

    A batch is ``batch_size`` blocks, or with ``tokens_per_batch`` the longest run of the epoch's order
    whose ``lengths`` sum to at most that many tokens. Token batches are cut greedily from each rank's
    share of the epoch's permutation, and the epoch ends when any rank's share has fewer tokens left
    than a batch, so all ranks take the same number of steps; like the permutation, the cuts are a pure
    function of (seed, epoch). Each sampler cuts every rank's share in step with its own, one batch at a
    time, so it never reads an epoch ahead.

    ``state_dict`` / ``load_state_dict``: the position ``{"epoch", "batch"}`` of the next key, with token
    batches also ``"starts"``: where that batch begins in each rank's order (without it, a restored
    sampler finds them again from the epoch's start).
    """

    def __init__(
        self, blocks, batch_size: int, seed: int, rank: int, world_size: int, lengths=None, tokens_per_batch: int = 0
    ):
        self.blocks = blocks
        self.batch_size = batch_size
        self.tokens_per_batch = tokens_per_batch
        self.lengths = lengths
        if tokens_per_batch and self.lengths is None:
            raise ValueError("tokens_per_batch needs the blocks' lengths")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        try:
            self.rank_orders = [
                BlockSampler(len(blocks), seed=seed, rank=r, world_size=world_size) for r in range(world_size)
            ]
            self.order = self.rank_orders[rank]
        except ValueError as error:  # fewer blocks than processes
            raise ConfigError(str(error)) from None
        # The loader's bookkeeping (``following``) cuts the batches the iterator cut a few batches before.
        self._cuts = functools.lru_cache(maxsize=64)(self._cut_every_rank)
        # Cumulative tokens of each rank's chunks of its order: most batches are cut with one searchsorted.
        self._chunk_tokens = functools.lru_cache(maxsize=2 * world_size)(self._tokens_up_to_each_block)
        self._window = 64  # positions read to cut one batch; doubled while a batch outgrows it
        self.epoch, self.batch, self.starts = 0, 0, self._epoch_start()
        if tokens_per_batch:
            if self.lengths.max() > tokens_per_batch:
                raise ConfigError(
                    f"data.tokens_per_batch {tokens_per_batch} is less than the longest block "
                    f"({int(self.lengths.max())} tokens)"
                )
            if self._cuts(0, self.starts) is None:
                raise ConfigError(
                    f"{len(blocks)} training blocks over {world_size} process(es) is less than one batch of "
                    f"{tokens_per_batch} tokens: lower data.tokens_per_batch or give more data"
                )
        elif len(self.order) < batch_size:
            raise ConfigError(
                f"{len(blocks)} training blocks over {world_size} process(es) is less than one batch of "
                f"{batch_size}: lower train.batch_size or give more data"
            )

    def _epoch_start(self) -> tuple[int, ...]:
        return (0,) * len(self.rank_orders)

    def _batch_ends(self, epoch: int, batch: int, starts: tuple[int, ...]) -> tuple[int, ...] | None:
        """Where the batch that begins at ``starts`` (one position per rank) ends in each rank's order; None
        when the epoch has no such batch."""
        if not self.tokens_per_batch:
            if batch >= len(self.order) // self.batch_size:
                return None
            return tuple(start + self.batch_size for start in starts)
        return self._cuts(epoch, starts)

    def _cut_every_rank(self, epoch: int, starts: tuple[int, ...]) -> tuple[int, ...] | None:
        ends = []
        for sampler, start in zip(self.rank_orders, starts):
            end = self._token_cut(sampler, epoch, start)
            if end is None:
                return None
            ends.append(end)
        return tuple(ends)

    def _tokens_up_to_each_block(self, rank: int, epoch: int, chunk: int) -> np.ndarray:
        """(CHUNK,) or fewer: tokens up to and including each block of ``chunk`` of ``rank``'s order."""
        sampler = self.rank_orders[rank]
        start = chunk * sampler.CHUNK
        return np.cumsum(self.lengths[self.blocks[sampler.order(epoch, start, start + sampler.CHUNK)]])

    def _token_cut(self, sampler: BlockSampler, epoch: int, start: int) -> int | None:
        """The end of the greedy token batch of ``sampler``'s order that begins at ``start`` (the first block
        that would overflow the budget), or None when fewer tokens than a batch are left."""
        chunk, offset = divmod(start, sampler.CHUNK)
        total = self._chunk_tokens(sampler.rank, epoch, chunk)
        before = int(total[offset - 1]) if offset else 0
        end = int(np.searchsorted(total, before + self.tokens_per_batch, side="right"))
        if end < len(total):  # the batch ends inside the chunk
            return chunk * sampler.CHUNK + end
        # It runs to the chunk's end or past it: read from its start on.
        while True:
            stop = min(start + self._window, len(sampler))
            total = np.cumsum(self.lengths[self.blocks[sampler.order(epoch, start, stop)]])  # tokens up to each block
            end = int(np.searchsorted(total, self.tokens_per_batch, side="right"))
            if end < len(total):
                return start + end
            if stop == len(sampler):  # the epoch's tail: a batch only if it fills the budget exactly
                return stop if len(total) and total[-1] == self.tokens_per_batch else None
            self._window *= 2

    def _walk(self, epoch: int, batch: int) -> tuple[int, ...]:
        """The starts of ``batch`` of ``epoch``, found by cutting every batch before it."""
        if not self.tokens_per_batch:
            if batch > len(self.order) // self.batch_size:
                raise InputError(f"the data position (epoch {epoch}, batch {batch}) is past the end of that epoch")
            return (batch * self.batch_size,) * len(self.rank_orders)
        starts = self._epoch_start()
        for number in range(batch):
            starts = self._batch_ends(epoch, number, starts)
            if starts is None:
                raise InputError(f"the data position (epoch {epoch}, batch {batch}) is past the end of that epoch")
        return starts

    def batches_per_epoch(self, epoch: int = 0) -> int:
        """Batches each rank takes in ``epoch`` (with token batches, found by cutting the whole epoch)."""
        if not self.tokens_per_batch:
            return len(self.order) // self.batch_size
        count, starts = 0, self._epoch_start()
        while (starts := self._cuts(epoch, starts)) is not None:
            count += 1
        return count

    def number(self, epoch: int, batch: int) -> int:
        """How many batches this rank takes before ``batch`` of ``epoch`` (the same on every rank): a function of
        the key alone, which a masking-rate schedule turns into the optimiser step."""
        if not self.tokens_per_batch:
            return epoch * (len(self.order) // self.batch_size) + batch
        if not hasattr(self, "_epoch_firsts"):
            self._epoch_firsts = [0]  # batches before each epoch, extended as epochs are reached
        while len(self._epoch_firsts) <= epoch:
            self._epoch_firsts.append(self._epoch_firsts[-1] + self.batches_per_epoch(len(self._epoch_firsts) - 1))
        return self._epoch_firsts[epoch] + batch

    def following(self, position: dict) -> dict:
        """The position after ``position``."""
        epoch, batch = position["epoch"], position["batch"]
        starts = tuple(position["starts"]) if "starts" in position else self._walk(epoch, batch)
        ends = self._batch_ends(epoch, batch, starts)
        if ends is None or self._batch_ends(epoch, batch + 1, ends) is None:
            return self._position(epoch + 1, 0, self._epoch_start())
        return self._position(epoch, batch + 1, ends)

    def _position(self, epoch: int, batch: int, starts: tuple[int, ...]) -> dict:
        return (
            {"epoch": epoch, "batch": batch, "starts": list(starts)}
            if self.tokens_per_batch
            else {"epoch": epoch, "batch": batch}
        )

    def __iter__(self):
        while True:
            ends = self._batch_ends(self.epoch, self.batch, self.starts)
            if ends is None:
                self.epoch, self.batch, self.starts = self.epoch + 1, 0, self._epoch_start()
                continue
            start, stop = self.starts[self.order.rank], ends[self.order.rank]
            key = (self.epoch, self.batch, self.blocks[self.order.order(self.epoch, start, stop)])
            self.batch, self.starts = self.batch + 1, ends
            yield key

    def state_dict(self) -> dict:
        return self._position(self.epoch, self.batch, self.starts)

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        if "starts" in state and self.tokens_per_batch:
            self.starts = tuple(int(start) for start in state["starts"])
        else:
            self.starts = self._walk(self.epoch, self.batch)


class ScheduledRate:
    """The masking rate of a training batch from its key: the key's batch number (:meth:`BatchKeySampler.number`)
    → its optimiser step (``grad_accum`` micro-batches a step) → ``schedule.rate_at(step)``."""

    def __init__(self, schedule, sampler: BatchKeySampler, grad_accum: int):
        self.schedule, self.sampler, self.grad_accum = schedule, sampler, grad_accum

    def __call__(self, epoch: int, batch: int) -> float:
        if epoch == EVAL_EPOCH:
            return self.schedule.final_rate
        return self.schedule.rate_at(self.sampler.number(epoch, batch) // self.grad_accum)


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


class WindowBatches(torch.utils.data.Dataset):
    """Fine-tuning windows (NER, QA) keyed by batch like the pretraining batches: key → ``windows.batch(indices)``."""

    def __init__(self, windows):
        self.windows = windows

    def __getitem__(self, key) -> dict[str, torch.Tensor | int]:
        _, _, indices = key
        return self.windows.batch(indices)


def _single(batch):
    return batch


# The signals that stop a run (spanlm.train.loop.StopSignal). A job scheduler (Slurm's scancel, `timeout`,
# `docker stop`) and a terminal's Ctrl-C send them to the whole process group, DataLoader workers included.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def leave_the_stop_to_the_main_process(worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn``: ignore the stop signals, which the main process acts on
    (finish the step, save, exit), then take the ones it blocked while forking (:func:`stop_signals_held`).

    A worker killed by them would end the main process with "DataLoader worker is killed by signal" instead
    of a saved checkpoint. A worker still ends with the main process: the loader's shutdown sends it no more
    work, and its watchdog notices when the main process is gone."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # set before unblocking: a signal already pending is discarded
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def stop_signals_held(workers: int):
    """Block the stop signals while DataLoader workers are forked (they inherit the mask), so none arrives in a
    worker before it ignores them; the main process gets any that arrived when they are unblocked."""
    if workers == 0:
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class KeyedLoader:
    """A DataLoader over a keyed dataset (each sampler key is one whole batch), resumable with any
    number of workers.

    Its state is the position of the next batch it will hand out. Since a batch is a pure function of
    its key, starting the sampler there gives exactly the batches that would have come next, whatever
    ``num_workers`` and however far the workers had prefetched. (torchdata's StatefulDataLoader
    snapshots its workers instead, so its state resumes only with the same number of workers.)
    """

    def __init__(
        self,
        dataset: torch.utils.data.Dataset,
        sampler: BatchKeySampler,
        num_workers: int,
        seed: int,
        pin_memory: bool = False,
    ):
        self.sampler = sampler
        self.position = sampler.state_dict()
        self.loader = torch.utils.data.DataLoader(
            dataset,
            sampler=sampler,
            batch_size=None,
            collate_fn=_single,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            prefetch_factor=4 if num_workers > 0 else None,
            pin_memory=pin_memory,  # page-locked batches: the loop's non_blocking copies to the GPU overlap compute
            worker_init_fn=leave_the_stop_to_the_main_process if num_workers > 0 else None,
            # Its own generator: creating an iterator must not draw from the global torch RNG, which the
            # model's dropout uses and a resumed run restores (a draw there would break bit-exact resume).
            generator=torch.Generator().manual_seed(seed),
        )

    def __iter__(self):
        self.sampler.load_state_dict(self.position)  # the workers are fed keys from here on
        with stop_signals_held(self.loader.num_workers):  # the workers start here (persistent: the first time)
            batches = iter(self.loader)
        for batch in batches:
            self.position = self.sampler.following(self.position)
            yield batch

    def state_dict(self) -> dict:
        return dict(self.position)

    def load_state_dict(self, state: dict) -> None:
        """Set the position of the next batch (before iterating)."""
        if "epoch" not in state or "batch" not in state:
            raise InputError(
                "the checkpoint's data position is a torchdata StatefulDataLoader state, written by an earlier "
                "spanlm; resume it with that version, or continue from an export of it in a new run"
            )
        self.position = {"epoch": int(state["epoch"]), "batch": int(state["batch"])}
        if "starts" in state:  # token batches: where the batch begins in each rank's order
            self.position["starts"] = [int(start) for start in state["starts"]]


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
    rate = ScheduledRate(rate_schedule, sampler, config.grad_accum) if rate_schedule and rate_schedule.active else None
    dataset = MaskedBatches(blocks, masker, blocks.corpus.special_ids["pad"], seed, rank, packs(data), fields, rate)
    return KeyedLoader(dataset, sampler, config.num_workers, seed, pin_memory=uses_cuda(config.device))


def packs(data) -> bool:
    """Whether batches are packed: ``data.packing``, which must be resolved to true / false by now."""
    if data is None or data.packing is False:
        return False
    if data.packing is not True:
        raise ValueError(f"data.packing must be resolved to true / false before batching, not {data.packing!r}")
    return True


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
