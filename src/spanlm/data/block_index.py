"""The block index: where every pretraining block of a prepared corpus starts and ends, built with NumPy.

Whole sentences of one document are packed greedily into blocks of at most ``max_len - 2`` tokens (room
for [CLS] and [SEP]); a sentence longer than that is cut into pieces of that size (see
:mod:`spanlm.data.blocks`). The index is an ``(n_blocks, 2)`` int64 array of [start, end) token offsets,
kept as ``block_index-<max_len>.npy`` in the prepared directory so that every rank memory-maps one copy
and a run's start-up builds nothing per block.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from spanlm.data.shards import NpyAppender, PreparedCorpus, ShardedCorpus, block_index_file
from spanlm.errors import InputError


def build_block_index(sentence_offsets: np.ndarray, document_offsets: np.ndarray, capacity: int) -> np.ndarray:
    """Greedy packing of whole sentences into blocks of ≤ ``capacity`` tokens, per document.

    Returns an ``(n_blocks, 2)`` int64 array of [start, end) token offsets into the flat ids.
    """
    sentence_offsets = np.asarray(sentence_offsets, dtype=np.int64)
    lengths = np.diff(sentence_offsets)
    # Split over-long sentences into capacity-sized pieces up front; the pieces of one sentence are
    # consecutive, so afterwards every unit fits and packing is a greedy walk over units.
    pieces = np.maximum(1, -(-lengths // capacity))
    unit_sentence = np.repeat(np.arange(len(lengths)), pieces)
    piece_index = np.arange(len(unit_sentence)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    unit_start = sentence_offsets[:-1][unit_sentence] + piece_index * capacity
    unit_end = np.minimum(unit_start + capacity, sentence_offsets[1:][unit_sentence])
    unit_document = np.searchsorted(document_offsets, unit_sentence, side="right") - 1
    del pieces, unit_sentence, piece_index
    n_units = len(unit_start)

    # The block that starts at unit u takes every following unit of its document that still fits:
    # ``following[u]`` is the unit after it. The greedy walk's blocks start at each document's first
    # unit and at the units reachable from there through ``following``.
    document_end = np.searchsorted(unit_document, unit_document, side="right")
    following = np.minimum(np.searchsorted(unit_end, unit_start + capacity, side="right"), document_end)
    # Reachability by pointer doubling instead of a walk per block: ``jump`` is ``following`` applied
    # 2^k times (leaving the document leads to the sink ``n_units``), and after round k ``is_start``
    # holds every unit within 2^(k+1) - 1 steps of a document's first unit — log2(blocks per document)
    # vectorised rounds.
    jump = np.append(np.where(following == document_end, n_units, following), n_units)
    is_start = np.zeros(n_units + 1, dtype=bool)
    is_start[:n_units][np.concatenate([[True], unit_document[1:] != unit_document[:-1]])[:n_units]] = True
    while True:
        is_start[jump[is_start]] = True
        if (jump[:n_units] == n_units).all():
            break
        jump = jump[jump]
    starts = np.flatnonzero(is_start[:n_units])
    return np.stack([unit_start[starts], unit_end[following[starts] - 1]], axis=1).reshape(-1, 2)


INDEX_CHUNK_SENTENCES = 1 << 16  # sentences packed at once: bounds the index build's memory, not its result


def block_index_chunks(sentence_offsets: np.ndarray, document_offsets: np.ndarray, max_len: int):
    """The block index of a corpus in pieces (int64 ``(n, 2)`` arrays), packed a run of whole documents at a time.

    Blocks never cross a document, so packing runs of documents separately gives the same blocks as
    packing the whole corpus, with memory bounded by the run (or by the longest document).
    """
    document_offsets = np.asarray(document_offsets)
    n_sentences = len(sentence_offsets) - 1
    cuts = np.unique(np.searchsorted(document_offsets, np.arange(0, n_sentences, INDEX_CHUNK_SENTENCES), side="left"))
    cuts = np.append(cuts[cuts < len(document_offsets) - 1], len(document_offsets) - 1)
    for first, last in zip(cuts[:-1], cuts[1:]):
        local_documents = document_offsets[first : last + 1]
        sentences = np.asarray(sentence_offsets[local_documents[0] : local_documents[-1] + 1])
        yield build_block_index(sentences, local_documents - local_documents[0], max_len - 2)


def write_block_index(directory: Path, max_len: int, path: Path) -> None:
    """Write the index of ``max_len`` blocks of the corpus arrays in ``directory`` to ``path`` (a .npy
    every rank memory-maps)."""
    offsets = [
        np.load(Path(directory) / f"{name}.npy", mmap_mode="r") for name in ("sentence_offsets", "document_offsets")
    ]
    index = NpyAppender(path, np.int64, (2,))
    try:
        for chunk in block_index_chunks(*offsets, max_len):
            index.append(chunk)
    except BaseException:
        index.discard()
        raise
    index.close()


def share_block_index(corpus: PreparedCorpus, max_len: int, log=print) -> None:
    """Write the corpus's index of ``max_len`` blocks into its directory when it is not there yet
    (``spanlm prepare`` writes the one of ``data.max_len``), so that every rank memory-maps one copy.

    Written beside and renamed into place, so a reader sees it whole or not at all; a directory that
    cannot be written leaves every rank to build the index in its own memory.
    """
    path = corpus.directory / block_index_file(max_len)
    if path.is_file():
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write_block_index(corpus.directory, max_len, tmp)
        os.replace(tmp, path)
    except OSError as error:
        log(f"{path}: cannot write the block index ({error.strerror or error}); every process builds it in memory")
    finally:
        tmp.unlink(missing_ok=True)


def load_block_index(corpus: PreparedCorpus, max_len: int):
    """``corpus``'s index of ``max_len`` blocks: its file memory-mapped, or built in memory when there is none;
    for a :class:`ShardedCorpus`, the shards' indexes read as one (:class:`ConcatenatedIndex`)."""
    if isinstance(corpus, ShardedCorpus):
        return ConcatenatedIndex([load_block_index(shard, max_len) for shard in corpus.shards], corpus.token_starts)
    path = corpus.directory / block_index_file(max_len)
    if not path.is_file():
        return np.concatenate(list(block_index_chunks(corpus.sentence_offsets, corpus.document_offsets, max_len)))
    try:
        index = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: unreadable ({error}); delete it or run `spanlm prepare` again") from None
    if (
        index.dtype != np.int64
        or index.ndim != 2
        or index.shape[1] != 2
        or len(index) == 0
        or index[-1, 1] != len(corpus.ids)
    ):
        raise InputError(
            f"{path}: not the block index of this corpus's {len(corpus.ids)} tokens; "
            "delete it or run `spanlm prepare` again"
        )
    return index


class ConcatenatedIndex:
    """The block indexes of several shards read as one ``(n_blocks, 2)`` index of global token offsets,
    without copying them: ``index[i]`` reads one row of its shard's memory-mapped index. Anything
    else (a slice, a column) materialises the whole index first."""

    def __init__(self, parts: list[np.ndarray], token_starts: np.ndarray):
        self.parts, self.token_starts = parts, token_starts
        self.block_starts = np.concatenate([[0], np.cumsum([len(part) for part in parts])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.block_starts[-1])

    @property
    def shape(self) -> tuple[int, int]:
        return len(self), 2

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            if not -len(self) <= key < len(self):
                raise IndexError(f"block {key} of {len(self)}")
            key = int(key) % len(self)
            shard = int(np.searchsorted(self.block_starts, key, side="right")) - 1
            return self.parts[shard][key - self.block_starts[shard]] + self.token_starts[shard]
        return np.asarray(self)[key]

    def __array__(self, dtype=None, copy=None):
        whole = np.concatenate([np.asarray(part) + start for part, start in zip(self.parts, self.token_starts)])
        return whole if dtype is None else whole.astype(dtype)
