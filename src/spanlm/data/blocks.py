"""Pretraining blocks: SpanBERT-style single segments ``[CLS] sentences… [SEP]`` of at most ``max_len``.

Whole sentences of one document are packed greedily into a block (no NSP, no second segment, as in
SpanBERT §3.3). A sentence longer than a block's capacity is split into capacity-sized pieces rather
than dropped, so no token is lost; the pieces are packed like sentences. Blocks never cross a document
boundary, so a block can be shorter than ``max_len`` (the batch pads it).

Order is a keyed permutation drawn from (seed, epoch) and computed a slice at a time (no per-block
array); :class:`BlockSampler` keeps its position so training resumes exactly, and under several
processes every rank reads a disjoint, equally long part.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from spanlm.data.block_index import build_block_index, load_block_index  # noqa: F401  build_block_index: public here too
from spanlm.data.shards import PreparedCorpus


@dataclasses.dataclass
class Block:
    ids: np.ndarray  # (L,) int64, [CLS] … [SEP]
    word_starts: np.ndarray  # (L,) bool; [CLS] and [SEP] are words of their own


class BlockDataset(torch.utils.data.Dataset):
    """Map-style dataset of pretraining blocks over a :class:`PreparedCorpus`."""

    def __init__(self, corpus: PreparedCorpus, max_len: int):
        if max_len < 3:
            raise ValueError("max_len must leave room for [CLS], [SEP] and one token")
        self.corpus = corpus
        self.max_len = max_len
        self.cls_id = corpus.special_ids["cls"]
        self.sep_id = corpus.special_ids["sep"]
        self.index = load_block_index(corpus, max_len)  # (n_blocks, 2) [start, end) token offsets

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Block:
        start, end = self.index[i]
        ids = np.empty(end - start + 2, dtype=np.int64)
        ids[0], ids[1:-1], ids[-1] = self.cls_id, self.corpus.ids[start:end], self.sep_id
        word_starts = np.ones(len(ids), dtype=bool)
        word_starts[1:-1] = self.corpus.word_starts[start:end]
        # A block cut inside a word (a split over-long sentence) starts a word there: it is whole here.
        word_starts[1] = True
        return Block(ids=ids, word_starts=word_starts)


@dataclasses.dataclass
class BlockBatch:
    """Blocks padded to the longest one in the batch."""

    input_ids: np.ndarray  # (B, L) int64
    word_starts: np.ndarray  # (B, L) bool
    attention_mask: np.ndarray  # (B, L) bool: real tokens (pad is False)
    special_mask: np.ndarray  # (B, L) bool: [CLS], [SEP] and pad — never masking targets


def collate_blocks(blocks: list[Block], pad_id: int) -> BlockBatch:
    lengths = np.fromiter((len(b.ids) for b in blocks), dtype=np.int64, count=len(blocks))
    width = int(lengths.max())
    attention = np.arange(width)[None, :] < lengths[:, None]
    input_ids = np.full((len(blocks), width), pad_id, dtype=np.int64)
    word_starts = np.zeros((len(blocks), width), dtype=bool)
    input_ids[attention] = np.concatenate([b.ids for b in blocks])
    word_starts[attention] = np.concatenate([b.word_starts for b in blocks])
    special = ~attention
    special[:, 0] = True
    special[np.arange(len(blocks)), lengths - 1] = True
    return BlockBatch(input_ids=input_ids, word_starts=word_starts, attention_mask=attention, special_mask=special)


class KeyedPermutation:
    """A pseudo-random bijection of [0, n) drawn from ``rng``, evaluated at any positions without listing it.

    A Feistel network on two digits: a position is ``high · b + low`` with ``high`` in [0, a) and ``low``
    in [0, b), a · b ≥ n, a ≈ b ≈ √n. Each round keeps one digit and adds a keyed hash of it to the other
    (modulo that digit's range), which any keys make a bijection of [0, a · b); an even number of rounds
    brings the digits back to their ranges. Positions mapped past ``n`` are mapped again ("cycle walking")
    until they land inside, which keeps a bijection of [0, n) and, with a · b - n < a, rarely takes a
    second pass. Ten rounds, as in format-preserving encryption (FF1), make the order look uniform
    (tests/data/test_blocks.py checks it with chi-square tests).

    Holding it costs ten keys whatever ``n``: an epoch's order over a corpus of any size is computed a
    batch at a time. Up to ``LISTED`` items the permutation is drawn and listed instead: on digits of a
    few values a Feistel network's orders are measurably not uniform, and such a list is small.
    """

    ROUNDS = 10
    LISTED = 2**16

    def __init__(self, n: int, rng: np.random.Generator):
        if n < 1:
            raise ValueError(f"a permutation of {n} items")
        self.n = n
        self.listed = rng.permutation(n) if n <= self.LISTED else None
        if self.listed is not None:
            return
        self.high = math.isqrt(n - 1) + 1  # a = ⌈√n⌉
        self.low = -(-n // self.high)  # b = ⌈n / a⌉
        self.keys = rng.integers(0, 2**64, size=self.ROUNDS, dtype=np.uint64)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The items at ``positions`` (any shape, each in [0, n)) of the order, int64."""
        if self.listed is not None:
            return self.listed[positions]
        out = self._feistel(np.asarray(positions, dtype=np.uint64))
        outside = np.flatnonzero(out >= self.n)
        while len(outside):
            out[outside] = self._feistel(out[outside])
            outside = outside[out[outside] >= self.n]
        return out.astype(np.int64)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        high, low = np.uint64(self.high), np.uint64(self.low)
        left, right = x // low, x % low  # left in [0, a), right in [0, b)
        for round_number, key in enumerate(self.keys):
            modulus = high if round_number % 2 == 0 else low  # the range of the digit this round changes
            left, right = right, (left + _mix(right, key) % modulus) % modulus
        return left * low + right


def _mix(values: np.ndarray, key: np.uint64) -> np.ndarray:
    """SplitMix64's finaliser of ``values + key``: every output bit depends on every input bit (uint64 wraps)."""
    z = values + key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class BlockSampler(torch.utils.data.Sampler[int]):
    """Seeded, resumable, rank-disjoint order over blocks, computed a slice at a time.

    Epoch ``e`` uses the :class:`KeyedPermutation` drawn from ``np.random.default_rng([seed, e])``; rank
    ``r`` of ``world_size`` reads positions ``r, r + W, r + 2W, …`` of it, with the tail that does not
    divide evenly dropped so every rank sees the same number of blocks. ``state_dict`` records the epoch
    and how many blocks this rank has yielded, so a restored sampler continues with the next block.
    """

    CHUNK = 2048  # positions computed at once: a permutation costs little per position only on many of them
    KEPT_CHUNKS = 3  # the chunks a batch spans, and the one a token budget reads ahead into

    def __init__(self, n_blocks: int, seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if n_blocks < world_size:
            raise ValueError(f"{n_blocks} blocks cannot be split over {world_size} processes")
        self.n_blocks, self.seed, self.shuffle = n_blocks, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.position = 0
        self._permutation: tuple[int, KeyedPermutation] | None = None  # (epoch, its permutation) last used
        self._chunks: dict[tuple[int, int], np.ndarray] = {}  # (epoch, chunk) → its blocks, the latest read

    def __len__(self) -> int:
        return self.n_blocks // self.world_size

    def order(self, epoch: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """This rank's block indices for ``epoch``, positions [start, stop) of its share (all of it by default)."""
        stop = max(start, len(self) if stop is None else min(stop, len(self)))
        if not self.shuffle or stop - start > self.CHUNK:
            return self._compute(epoch, start, stop)
        first, last = start // self.CHUNK, max(start, stop - 1) // self.CHUNK
        chunks = [self._chunk(epoch, number) for number in range(first, last + 1)]
        joined = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        return joined[start - first * self.CHUNK : stop - first * self.CHUNK]

    def _chunk(self, epoch: int, number: int) -> np.ndarray:
        if (epoch, number) not in self._chunks:
            if len(self._chunks) >= self.KEPT_CHUNKS:
                del self._chunks[next(iter(self._chunks))]  # the oldest
            self._chunks[epoch, number] = self._compute(
                epoch, number * self.CHUNK, min((number + 1) * self.CHUNK, len(self))
            )
        return self._chunks[epoch, number]

    def _compute(self, epoch: int, start: int, stop: int) -> np.ndarray:
        positions = self.rank + self.world_size * np.arange(start, stop, dtype=np.int64)
        if not self.shuffle:
            return positions
        if self._permutation is None or self._permutation[0] != epoch:
            self._permutation = (epoch, KeyedPermutation(self.n_blocks, np.random.default_rng([self.seed, epoch])))
        return self._permutation[1](positions)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def __iter__(self):
        while self.position < len(self):
            chunk = self.order(self.epoch, self.position, self.position + self.CHUNK)
            for block in chunk.tolist():
                self.position += 1
                yield block

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed or state["world_size"] != self.world_size:
            raise ValueError("sampler state was saved with another seed or number of processes")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
