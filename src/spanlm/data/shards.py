"""The prepared-corpus directory: memmappable token shards plus metadata.

Layout (format version 1)::

    meta.json               counts, dtypes, tokenizer fingerprint, input fingerprint, statistics
    config.yaml             the resolved recipe that produced it
    tokenizer/              the fast tokenizer (AutoTokenizer loads it)
    ids.npy                 uint16 (vocab ≤ 65536) or uint32: every sentence's tokens, no special tokens
    word_starts.npy         bool, one per token: True where a word (tokenizer word / jieba word) begins
    sentence_offsets.npy    int64, n_sentences + 1: token offsets of the sentences
    document_offsets.npy    int64, n_documents + 1: sentence offsets of the documents
    token_counts.npy        int64, vocab_size: corpus frequency of every id (unigram replacement)
    block_index-<L>.npy     int64, (n_blocks, 2): [start, end) tokens of the blocks of max_len L
                            (spanlm.data.block_index; data.max_len's written by prepare, others on first use)

A corpus prepared in shards (``spanlm prepare --shard i/n``) is one such directory per shard, read as
one corpus by :class:`ShardedCorpus`.

A directory counts as prepared only when its meta.json exists; it is written last, inside a temporary
directory that is renamed into place, so nothing half-written ever looks complete.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np

from spanlm.data.tokenizer import load_tokenizer, tokenizer_fingerprint
from spanlm.errors import InputError
from spanlm.files import read_metadata

FORMAT_VERSION = 1  # of the arrays on disk (a change of what they hold alone does not force a rebuild)
ARRAYS = ("ids", "word_starts", "sentence_offsets", "document_offsets", "token_counts")


def block_index_file(max_len: int) -> str:
    """The block index of ``max_len`` blocks (see :func:`spanlm.data.blocks.write_block_index`)."""
    return f"block_index-{max_len}.npy"


def ids_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


NPY_HEADER_BYTES = 128  # a fixed-size .npy header: written first with a guess, rewritten with the real shape


class NpyAppender:
    """A 1-D or 2-D ``.npy`` file written in appended pieces, its length unknown until it is closed.

    The header is reserved at a fixed size and rewritten on :meth:`close` with the final row count, so a
    streaming writer never holds the array nor copies the file to prepend a header.
    """

    def __init__(self, path: Path, dtype, row_shape: tuple[int, ...] = ()):
        self.path, self.dtype, self.row_shape = Path(path), np.dtype(dtype), tuple(row_shape)
        self.rows = 0
        self.handle = open(self.path, "wb")
        self.handle.write(self._header())

    def _header(self) -> bytes:
        description = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.rows, *self.row_shape),
        }
        text = repr(description).encode("latin1")
        prefix = b"\x93NUMPY\x01\x00" + struct.pack("<H", NPY_HEADER_BYTES - 10)
        return prefix + text.ljust(NPY_HEADER_BYTES - len(prefix) - 1) + b"\n"

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1, *self.row_shape)
        self.handle.write(values.tobytes())
        self.rows += len(values)

    def close(self) -> None:
        self.handle.seek(0)
        self.handle.write(self._header())
        self.handle.close()

    def discard(self) -> None:
        self.handle.close()


# What to do about a prepared directory's damaged metadata: it cannot be checked against its inputs or tokenizer.
REBUILD = "restore it, or prepare the corpus again with `spanlm prepare RECIPE --force` (which replaces its tokenizer)"


def read_meta(directory: str | Path) -> dict | None:
    """The metadata of a complete prepared directory, or None when there is none; a damaged meta.json is an
    InputError (read as none, the directory would be rebuilt, with a new tokenizer)."""
    return read_metadata(Path(directory) / "meta.json", REBUILD)


class PreparedCorpus:
    """Read side of a prepared directory: the arrays as read-only memmaps, the tokenizer on demand."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        meta = read_meta(self.directory)
        if meta is None:
            raise InputError(f"{self.directory}: not a prepared corpus (no meta.json); run `spanlm prepare` first")
        if meta.get("format_version") != FORMAT_VERSION:
            raise InputError(
                f"{self.directory}: prepared with format version {meta.get('format_version')}, "
                f"this spanlm reads {FORMAT_VERSION}; run `spanlm prepare` again"
            )
        self.meta = meta
        arrays = {}
        for name in ARRAYS:
            try:
                arrays[name] = np.load(self.directory / f"{name}.npy", mmap_mode="r")
            except (OSError, ValueError) as error:
                raise InputError(
                    f"{self.directory / (name + '.npy')}: unreadable ({error}); run `spanlm prepare` again"
                ) from None
        self.ids = arrays["ids"]
        self.word_starts = arrays["word_starts"]
        self.sentence_offsets = arrays["sentence_offsets"]
        self.document_offsets = arrays["document_offsets"]
        self.token_counts = arrays["token_counts"]
        if len(self.ids) != meta["n_tokens"] or len(self.sentence_offsets) != meta["n_sentences"] + 1:
            raise InputError(f"{self.directory}: arrays do not match meta.json; run `spanlm prepare` again")
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            tokenizer = load_tokenizer(self.directory / "tokenizer")
            if tokenizer_fingerprint(tokenizer) != self.meta["tokenizer_fingerprint"]:
                raise InputError(f"{self.directory}/tokenizer does not match the tokenizer the shards were made with")
            self._tokenizer = tokenizer
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self.meta["special_ids"])

    @property
    def n_documents(self) -> int:
        return len(self.document_offsets) - 1

    def sentence(self, index: int) -> np.ndarray:
        return np.asarray(self.ids[self.sentence_offsets[index] : self.sentence_offsets[index + 1]])

    def document_token_range(self, index: int) -> tuple[int, int]:
        first, last = self.document_offsets[index], self.document_offsets[index + 1]
        return int(self.sentence_offsets[first]), int(self.sentence_offsets[last])


SHARD_NAME = re.compile(r"shard-(\d+)-of-(\d+)")


def shard_directory(prepared_dir: str | Path, index: int, count: int) -> Path:
    """Where ``spanlm prepare --shard index/count`` writes: one directory per shard under ``prepared_dir``."""
    return Path(prepared_dir) / f"shard-{index:05d}-of-{count:05d}"


def resolve_shards(patterns: list[str]) -> list[Path]:
    """Expand ``data.prepared_shards`` (directories and glob patterns, in order) into prepared directories.

    Shards named by ``spanlm prepare --shard i/n`` are checked complete: every one of the ``n`` must be
    listed, once (a missing one would silently change the corpus, and the blocks a run resumes with).
    """
    import glob

    directories: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(os.path.expanduser(pattern)))
            if not matches:
                raise InputError(f"{pattern}: no prepared directory matches this pattern (data.prepared_shards)")
            directories.extend(Path(match) for match in matches)
        else:
            directories.append(Path(pattern).expanduser())
    seen: dict[tuple[Path, int], set[int]] = {}
    for directory in directories:
        if (match := SHARD_NAME.fullmatch(directory.name)) is not None:
            index, count = int(match.group(1)), int(match.group(2))
            listed = seen.setdefault((directory.parent, count), set())
            if index in listed:
                raise InputError(f"{directory}: listed twice in data.prepared_shards")
            listed.add(index)
    for (parent, count), listed in seen.items():
        for index in range(count):
            if index not in listed:
                raise InputError(
                    f"{shard_directory(parent, index, count)}: shard {index}/{count} is missing from "
                    f"data.prepared_shards; prepare it with `spanlm prepare RECIPE --shard {index}/{count}`"
                )
    return directories


class ConcatenatedTokens:
    """Per-token arrays of several shards read as one: ``tokens[start:end]`` within one shard (a block never
    crosses a document, so never a shard)."""

    def __init__(self, parts: list[np.ndarray], starts: np.ndarray):
        self.parts, self.starts = parts, starts  # starts: (n_shards + 1,) global offset of each shard
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, where: slice) -> np.ndarray:
        start, stop = int(where.start), int(where.stop)
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        if where.step not in (None, 1) or not self.starts[shard] <= start <= stop <= self.starts[shard + 1]:
            raise IndexError(f"[{start}:{stop}] is not a range within one shard")
        offset = int(self.starts[shard])
        return self.parts[shard][start - offset : stop - offset]


class ShardedCorpus(PreparedCorpus):
    """Several prepared directories (the shards of one corpus, prepared with one tokenizer) read as one
    corpus: their documents one after another, in the order given.

    Token positions are global (shard ``k``'s tokens follow shard ``k-1``'s), so blocks, their order
    and a run's resume are what one directory holding every shard would give. The tokenizer, and
    MacBERT's similar-word table, are the first shard's; token counts are summed.
    """

    def __init__(self, directories: list[str | Path]):
        if not directories:
            raise InputError("data.prepared_shards lists no prepared directory")
        self.shards = [PreparedCorpus(directory) for directory in directories]
        first = self.shards[0]
        for shard in self.shards[1:]:
            if shard.meta["tokenizer_fingerprint"] != first.meta["tokenizer_fingerprint"]:
                raise InputError(
                    f"{shard.directory}: prepared with tokenizer {shard.meta['tokenizer_fingerprint']}, but "
                    f"{first.directory} with tokenizer {first.meta['tokenizer_fingerprint']}; prepare every "
                    f"shard with one tokenizer.path (e.g. tokenizer.path={first.directory / 'tokenizer'})"
                )
        self.directory = first.directory
        self.token_starts = np.concatenate([[0], np.cumsum([shard.meta["n_tokens"] for shard in self.shards])]).astype(
            np.int64
        )
        totals = {
            key: sum(int(shard.meta[key]) for shard in self.shards)
            for key in ("n_tokens", "n_words", "n_sentences", "n_documents")
        }
        self.meta = {**first.meta, **totals, "shards": [str(shard.directory) for shard in self.shards]}
        self.ids = ConcatenatedTokens([shard.ids for shard in self.shards], self.token_starts)
        self.word_starts = ConcatenatedTokens([shard.word_starts for shard in self.shards], self.token_starts)
        self.token_counts = np.sum([np.asarray(shard.token_counts) for shard in self.shards], axis=0)
        self._tokenizer = None

    @property
    def n_documents(self) -> int:
        return int(self.meta["n_documents"])

    def _one_directory_only(self):
        raise InputError(
            f"{self.directory}: the sentence offsets of a corpus in several prepared directories are not "
            "one array; this needs a single prepared directory (data.prepared_dir, not data.prepared_shards)"
        )

    sentence_offsets = document_offsets = property(_one_directory_only)
