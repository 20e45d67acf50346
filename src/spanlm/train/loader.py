"""The engine's resumable loader: a sampler of batch *keys*, and a DataLoader that builds each batch from its key.

Each batch is a pure function of (seed, rank, epoch, batch number): the sampler yields a key per batch, and the
task's dataset builds the whole batch from it (pretraining: reads the blocks, pads and masks them with
``np.random.default_rng([seed, rank, epoch, batch])``; fine-tuning: gathers its windows). So a batch does not
depend on the number of workers or on prefetching, and the position of the next batch to hand out is all a
loader has to remember to resume exactly (:class:`KeyedLoader`).
"""

from __future__ import annotations

import contextlib
import functools
import signal

import numpy as np
import torch

from spanlm.data.blocks import BlockSampler
from spanlm.errors import ConfigError, InputError


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

    def _blocks(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The blocks at ``positions`` of ``epoch``'s order: ``blocks.at(epoch, positions)`` where the blocks drawn
        change with the epoch (a mixture by weight: spanlm.pretrain.batches.MixedBlocks), else ``blocks[positions]``."""
        at = getattr(self.blocks, "at", None)
        return at(epoch, positions) if at is not None else self.blocks[positions]

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
        return np.cumsum(self.lengths[self._blocks(epoch, sampler.order(epoch, start, start + sampler.CHUNK))])

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
            # tokens up to each block
            total = np.cumsum(self.lengths[self._blocks(epoch, sampler.order(epoch, start, stop))])
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
            key = (self.epoch, self.batch, self._blocks(self.epoch, self.order.order(self.epoch, start, stop)))
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


def _single(batch):
    return batch


# The signals that stop a run (spanlm.train.stop.StopSignal). A job scheduler (Slurm's scancel, `timeout`,
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


def packs(data) -> bool:
    """Whether batches are packed: ``data.packing``, which must be resolved to true / false by now."""
    if data is None or data.packing is False:
        return False
    if data.packing is not True:
        raise ValueError(f"data.packing must be resolved to true / false before batching, not {data.packing!r}")
    return True
