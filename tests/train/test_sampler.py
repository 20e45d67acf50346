"""The pretraining sampler at corpus scale: held-out split and epoch orders without per-block arrays,
token batches cut in step across ranks, exact resume, start-up memory that does not grow with the corpus."""

from __future__ import annotations

import time
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from spanlm.data.block_index import ConcatenatedIndex
from spanlm.data.blocks import BlockSampler
from spanlm.errors import InputError
from spanlm.pretrain.batches import BlockLengths, MaskedBatches, split_blocks
from spanlm.train.loader import BatchKeySampler, KeyedLoader


@pytest.mark.parametrize("n_blocks, eval_blocks", [(100_003, 64), (50, 64), (10, 0)])
def test_training_blocks_are_the_complement_of_the_held_out(n_blocks, eval_blocks):
    train, held_out = split_blocks(n_blocks, eval_blocks, seed=3)
    assert len(held_out) == min(eval_blocks, n_blocks // 10) and (np.diff(held_out) > 0).all()
    assert np.array_equal(train[np.arange(len(train))], np.setdiff1d(np.arange(n_blocks), held_out))
    assert int(train[len(train) - 1]) == np.setdiff1d(np.arange(n_blocks), held_out)[-1]
    with pytest.raises(IndexError):
        train[np.array([0, len(train)])]


def greedy_batches(
    train, lengths: np.ndarray, tokens: int, seed: int, world_size: int, epoch: int
) -> list[list[np.ndarray]]:
    """Each rank's token batches of ``epoch``, cut from its whole order at once (the rule the sampler keeps)."""
    cut_orders = []
    for rank in range(world_size):
        order = train[BlockSampler(len(train), seed=seed, rank=rank, world_size=world_size).order(epoch)]
        total, cuts = np.cumsum(lengths[order]), [0]
        while cuts[-1] < len(order):
            before = int(total[cuts[-1] - 1]) if cuts[-1] else 0
            end = int(np.searchsorted(total, before + tokens, side="right"))
            if end == len(order) and total[-1] - before < tokens:
                break
            cuts.append(end)
        cut_orders.append((order, cuts))
    fewest = min(len(cuts) for _, cuts in cut_orders) - 1
    return [[order[cuts[k] : cuts[k + 1]] for k in range(fewest)] for order, cuts in cut_orders]


@pytest.mark.parametrize("world_size, tokens", [(1, 100), (3, 100), (2, 3000)])
def test_token_batches_are_the_greedy_cuts_of_each_ranks_whole_order(world_size, tokens):
    """Cut a batch at a time, in step across ranks, the batches are those of cutting each rank's whole
    order and keeping the fewest any rank gets (3000 tokens: batches of more blocks than a first read)."""
    train, _ = split_blocks(3000, 8, seed=0)
    lengths = np.random.default_rng(0).integers(3, 33, size=3000)
    for rank in range(world_size):
        sampler = BatchKeySampler(
            train, 8, seed=5, rank=rank, world_size=world_size, lengths=lengths, tokens_per_batch=tokens
        )
        epochs = [greedy_batches(train, lengths, tokens, 5, world_size, epoch)[rank] for epoch in range(2)]
        assert [sampler.batches_per_epoch(epoch) for epoch in range(2)] == [len(batches) for batches in epochs]
        expected = epochs[0] + epochs[1]
        keys = [key for _, key in zip(range(len(expected)), iter(sampler))]
        assert [indices.tolist() for _, _, indices in keys] == [batch.tolist() for batch in expected]


@pytest.mark.parametrize("tokens", [0, 120])
def test_a_restored_sampler_continues_exactly_from_any_position(tokens):
    """The loader's positions (``following``) restore the keys that came next, with or without each rank's
    starts (a position written before they were recorded is found again from the epoch's start)."""
    train, _ = split_blocks(400, 8, seed=0)
    lengths = np.random.default_rng(1).integers(3, 33, size=400)
    make = lambda: BatchKeySampler(train, 16, seed=2, rank=1, world_size=3, lengths=lengths, tokens_per_batch=tokens)
    sampler = make()
    keys = [key for _, key in zip(range(3 * sampler.batches_per_epoch(0) + 2), iter(sampler))]
    position = make().state_dict()
    for step, (epoch, batch, _) in enumerate(keys):
        assert (position["epoch"], position["batch"]) == (epoch, batch)
        for state in (position, {"epoch": epoch, "batch": batch}):
            restored = make()
            restored.load_state_dict(state)
            got = [key for _, key in zip(range(len(keys[step : step + 3])), iter(restored))]
            assert [(e, b, i.tolist()) for e, b, i in got] == [(e, b, i.tolist()) for e, b, i in keys[step : step + 3]]
        position = sampler.following(position)
    with pytest.raises(InputError, match="past the end of that epoch"):
        make().load_state_dict({"epoch": 0, "batch": 10**6})


@pytest.mark.parametrize("tokens", [0, 120])
def test_a_keys_batch_number_counts_the_batches_before_it_on_every_rank(tokens):
    """``number(epoch, batch)``: how many batches came before, across epochs of different lengths (token
    batches), the same on every rank, and the same from a fresh sampler (a DataLoader worker's copy)."""
    train, _ = split_blocks(400, 8, seed=0)
    lengths = np.random.default_rng(1).integers(3, 33, size=400)
    samplers = [
        BatchKeySampler(train, 16, seed=2, rank=rank, world_size=2, lengths=lengths, tokens_per_batch=tokens)
        for rank in range(2)
    ]
    per_epoch = [samplers[0].batches_per_epoch(epoch) for epoch in range(3)]
    assert tokens == 0 or len(set(per_epoch)) > 1  # token batches: epochs of different lengths
    for sampler in samplers:
        keys = [key for _, key in zip(range(sum(per_epoch)), iter(sampler))]
        fresh = BatchKeySampler(train, 16, seed=2, rank=0, world_size=2, lengths=lengths, tokens_per_batch=tokens)
        assert [fresh.number(epoch, batch) for epoch, batch, _ in reversed(keys)] == list(range(len(keys)))[::-1]


def test_a_loader_position_round_trips_each_ranks_starts():
    train, _ = split_blocks(400, 8, seed=0)
    lengths = np.random.default_rng(1).integers(3, 33, size=400)
    sampler = BatchKeySampler(train, 16, seed=2, rank=0, world_size=2, lengths=lengths, tokens_per_batch=120)
    loader = KeyedLoader(MaskedBatches(None, None, 0, 2, 0), sampler, num_workers=0, seed=2)
    loader.load_state_dict({"epoch": 1, "batch": 3, "starts": [np.int64(40), 41]})
    assert loader.state_dict() == {"epoch": 1, "batch": 3, "starts": [40, 41]}


def test_block_lengths_read_plain_and_sharded_indexes():
    rng = np.random.default_rng(0)
    parts = [np.cumsum(rng.integers(1, 30, size=(n, 2)), axis=None).reshape(n, 2) for n in (5, 7, 4)]
    sharded = ConcatenatedIndex(parts, np.array([0, 1000, 5000]))
    whole = np.asarray(sharded)
    indices = rng.integers(0, len(whole), size=(3, 6))
    for index in (whole, sharded):
        lengths = BlockLengths(SimpleNamespace(index=index, max_len=32))
        assert np.array_equal(lengths[indices], whole[indices, 1] - whole[indices, 0] + 2) and lengths.max() == 32


class ComputedLengths:
    """Lengths of a corpus of any size, computed from the block index instead of stored."""

    def __getitem__(self, indices) -> np.ndarray:
        return 3 + (np.asarray(indices) * 7919) % 60

    def max(self) -> int:
        return 62


def start_up(n_blocks: int, tokens: int) -> tuple[int, float]:
    """Peak traced bytes and seconds to split ``n_blocks`` blocks, build rank 1 of 4's sampler and draw its first
    batch."""
    tracemalloc.start()
    began = time.perf_counter()
    train, _ = split_blocks(n_blocks, 64, seed=0)
    sampler = BatchKeySampler(
        train, 256, seed=0, rank=1, world_size=4, lengths=ComputedLengths(), tokens_per_batch=tokens
    )
    next(iter(sampler))
    seconds = time.perf_counter() - began
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, seconds


@pytest.mark.parametrize("tokens", [0, 8192])
def test_sampler_start_up_memory_does_not_grow_with_the_corpus(tokens):
    """10⁶ and 10⁷ blocks: the same peak, far below one 8-byte array of the blocks (80 MB at 10⁷)."""
    start_up(10**5, tokens)  # first calls' one-off allocations
    small, _ = start_up(10**6, tokens)
    large, seconds = start_up(10**7, tokens)
    assert large < small + 64 * 1024 and large < 1024**2
    assert seconds < 2.0  # the goal is 10 s at any size; this takes milliseconds
