"""Pretraining blocks: SpanBERT-style single segments ``[CLS] sentences… [SEP]`` of at most ``max_len``.

Whole sentences of one document are packed greedily into a block (no NSP, no second segment, as in
SpanBERT §3.3). A sentence longer than a block's capacity is split into capacity-sized pieces rather
than dropped, so no token is lost; the pieces are packed like sentences. Blocks never cross a document
boundary, so a block can be shorter than ``max_len`` (the batch pads it).

Order is a permutation drawn from (seed, epoch); :class:`BlockSampler` keeps its position so training
resumes exactly, and under several processes every rank reads a disjoint, equally long part.
"""

from __future__ import annotations

import dataclasses

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


class BlockSampler(torch.utils.data.Sampler[int]):
    """Seeded, resumable, rank-disjoint order over blocks.

    Epoch ``e`` uses the permutation drawn from ``np.random.default_rng([seed, e])``; rank ``r`` of
    ``world_size`` reads positions ``r, r + W, r + 2W, …`` of it, with the tail that does not divide
    evenly dropped so every rank sees the same number of blocks. ``state_dict`` records the epoch and
    how many blocks this rank has yielded, so a restored sampler continues with the next block.
    """

    def __init__(self, n_blocks: int, seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if n_blocks < world_size:
            raise ValueError(f"{n_blocks} blocks cannot be split over {world_size} processes")
        self.n_blocks, self.seed, self.shuffle = n_blocks, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        return self.n_blocks // self.world_size

    def order(self, epoch: int) -> np.ndarray:
        """This rank's block indices for ``epoch``."""
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n_blocks) if self.shuffle else np.arange(self.n_blocks)
        return order[: len(self) * self.world_size][self.rank::self.world_size]

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def __iter__(self):
        order = self.order(self.epoch)
        while self.position < len(order):
            self.position += 1
            yield int(order[self.position - 1])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed or state["world_size"] != self.world_size:
            raise ValueError("sampler state was saved with another seed or number of processes")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
