"""Reading raw text corpora (.txt / .jsonl / .parquet, optionally .gz, and Hugging Face `datasets`) into
sentences and documents.

Validation happens here, at the edge: missing, empty and binary files, invalid UTF-8, broken JSON and
over-long lines all produce an :class:`InputError` naming the file and line, or are skipped and counted
when ``on_bad_line: skip``; a dataset without the text column names the dataset and its columns.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from spanlm.data.hf_datasets import HF_PREFIX, DatasetSplit, is_saved_dataset, load_split
from spanlm.errors import InputError, numbered_lines, require_file, undecodable

TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")


TOKENIZER_KEY = "{tokenizer}"


@dataclasses.dataclass
class DataConfig:
    """Where the corpus is and how it becomes token shards and pretraining blocks."""

    # Files or glob patterns, `datasets` save_to_disk directories, or hf:NAME[@REVISION][:CONFIG][:SPLIT]
    # names for datasets.load_dataset (see spanlm.data.hf_datasets).
    inputs: list[str] = dataclasses.field(default_factory=list)
    # Output of `spanlm prepare`, input of pretraining. "{tokenizer}" is replaced by the tokenizer
    # settings' short name (spanlm.data.tokenizer.settings_key): one directory per tokenizer.
    prepared_dir: str = f"runs/prepared/{TOKENIZER_KEY}"
    # A corpus prepared in shards (`spanlm prepare RECIPE --shard i/n` writes prepared_dir/shard-0000i-of-0000n, one
    # job per shard, all with one tokenizer.path): prepared directories or glob patterns of them, read as
    # one corpus in this order. When set, pretraining reads these and prepares nothing.
    prepared_shards: list[str] = dataclasses.field(default_factory=list)
    # A mixture: each shard's weight (one per shard, in order), its share of every epoch's training blocks (a
    # downweighted shard's fewer, an upweighted one's repeated; spanlm.pretrain.batches.MixedBlocks). Empty: every
    # training block once an epoch.
    shard_weights: list[float] = dataclasses.field(default_factory=list)
    # A mixture inside one prepared corpus: each entry of ``inputs``'s weight (one per entry, in order; a glob
    # pattern's files share theirs), drawn as shard_weights draws shards. 0 keeps an input out of training while
    # its text still trains the tokenizer, for a phase to weigh in later (mmBERT adds languages in its decay).
    input_weights: list[float] = dataclasses.field(default_factory=list)
    text_field: str = "text"  # the text column of .jsonl / .parquet records and of datasets
    split: str = "train"  # the split of a DatasetDict directory or an hf: name that does not name one
    # Word boundaries for whole-word / span masking: "none" = no segmenter, the fast tokenizer's own
    # pre-tokenized words (any family); "jieba" = jieba segmentation, so a multi-character Chinese word
    # is one unit although BERT tokenizes Chinese per character.
    words: Literal["none", "jieba"] = "none"
    max_line_chars: int = 100_000  # longer lines are split at whitespace into several sentences
    on_bad_line: Literal["error", "skip"] = "error"  # invalid UTF-8 / broken JSON: stop, or skip and count
    num_proc: int | None = None  # processes that tokenize (and segment with jieba); None: one per core
    max_len: int = 128  # pretraining block length including [CLS] and [SEP]
    # Packed batches (spanlm.data.packing): a batch's blocks in one token stream, each attending only to
    # itself: true / false, or "auto": per device what measured fastest (config.yaml records the choice).
    packing: bool | Literal["auto"] = "auto"
    # Batches of blocks up to this many real tokens instead of train.batch_size blocks; 0 = off.
    tokens_per_batch: int = 0
    # The seed of the training blocks' order (None: the recipe's seed); each phase of a phased run has its own, so
    # that a phase does not replay the order of the one before.
    order_seed: int | None = None
    # The held-out text of a phased run, set by its phases (spanlm.pretrain.phases): the blocks of held_out_max_len
    # tokens (its longest phase's) that a run would hold out from the shards of held_out_shards (its first phase's
    # data.prepared_shards), so that every phase holds out, and is scored on, the same text whatever its block length.
    # None / empty: data.max_len and the run's own corpus.
    held_out_max_len: int | None = None
    held_out_shards: list[str] = dataclasses.field(default_factory=list)
    # MacBERT similar-word table (similar_words.npz, see spanlm.data.similar_words): "word2vec" trains
    # gensim Word2Vec on the corpus; "synonyms" reads a TSV of word<TAB>synonym...; "vectors" reads a
    # word2vec-format vector file. similar_words_file is the TSV / vector file.
    similar_words: Literal["none", "word2vec", "synonyms", "vectors"] = "none"
    similar_words_file: str | None = None
    similar_words_k: int = 10  # neighbours kept per word (same token count)
    similar_words_min_count: int = 5  # words rarer than this get no neighbours (and no word2vec vector)

    def __post_init__(self) -> None:
        if self.similar_words in ("synonyms", "vectors") and not self.similar_words_file:
            raise ValueError(f"similar_words: {self.similar_words} needs similar_words_file")
        if self.shard_weights and not self.prepared_shards:
            raise ValueError("shard_weights weigh the shards of data.prepared_shards, which lists none")
        for name in ("shard_weights", "input_weights"):
            weights = getattr(self, name)
            if any(not (math.isfinite(w) and w >= 0) for w in weights) or (weights and not sum(weights) > 0):
                raise ValueError(f"{name} must be numbers ≥ 0, one of them positive, got {weights}")
        if self.input_weights and self.prepared_shards:
            raise ValueError(
                "input_weights weigh the inputs of one prepared corpus (data.prepared_dir); a corpus read from "
                "data.prepared_shards is weighed by shard_weights"
            )
        if self.input_weights and self.inputs and len(self.input_weights) != len(self.inputs):
            raise ValueError(
                f"input_weights has {len(self.input_weights)} weights for the {len(self.inputs)} entries of inputs; "
                "give one per entry, in their order"
            )
        if self.similar_words_k < 1 or self.similar_words_min_count < 1:
            raise ValueError("similar_words_k and similar_words_min_count must be at least 1")
        if self.max_line_chars < 16:
            raise ValueError("max_line_chars must be at least 16")
        if self.max_len < 8:
            raise ValueError("max_len must be at least 8")
        if self.num_proc is not None and self.num_proc < 1:
            raise ValueError("num_proc must be at least 1")
        if self.tokens_per_batch and self.tokens_per_batch < self.max_len:
            raise ValueError(
                f"tokens_per_batch must be 0 (off) or at least max_len ({self.max_len}), got {self.tokens_per_batch}"
            )

    def processes(self) -> int:
        """The processes ``num_proc`` asks for: the cores this process may run on when it is None."""
        if self.num_proc is not None:
            return self.num_proc
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


Input = Path | DatasetSplit  # a file, or a split of a Hugging Face dataset


def resolve_inputs(config: DataConfig) -> list[Input]:
    """Expand ``config.inputs``: check every file exists, is a supported kind, is not empty and is not
    binary; load every dataset split (memory-mapped) and check it has ``config.text_field``."""
    return [source for sources in inputs_by_entry(config) for source in sources]


def inputs_by_entry(config: DataConfig) -> list[list[Input]]:
    """:func:`resolve_inputs`, grouped by the entry of ``config.inputs`` each came from (a pattern's files)."""
    if not config.inputs:
        raise InputError("no input files: set data.inputs (files, glob patterns, datasets)")
    grouped: list[list[Input]] = []
    for pattern in config.inputs:
        if pattern.startswith(HF_PREFIX) or not glob.has_magic(pattern):  # a split may slice: hf:x:y:train[:10]
            names = [pattern]
        else:
            names = sorted(glob.glob(os.path.expanduser(pattern)))
            if not names:
                raise InputError(f"{pattern}: no file matches this pattern")
        grouped.append([_resolved(name, config) for name in names])
    return grouped


def _resolved(entry: str, config: DataConfig) -> Input:
    if entry.startswith(HF_PREFIX) or is_saved_dataset(Path(entry)):
        dataset = load_split(entry, config.split, "data.split")
        dataset.require_columns(config.text_field, setting="data.text_field")
        return dataset
    return _checked_file(Path(entry))


def _checked_file(path: Path) -> Path:
    if path.is_dir():
        raise InputError(
            f"{path}: is a directory, but not a dataset written by datasets' save_to_disk "
            "(no state.json or dataset_dict.json); list its files instead"
        )
    require_file(path)
    if input_kind(path) is None:
        raise InputError(f"{path}: unsupported file type (expected one of {', '.join(TEXT_SUFFIXES)}, optionally .gz)")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: file is empty")
    if input_kind(path) != "parquet":
        try:
            with _open_binary(path) as handle:
                head = handle.read(8192)
        except (OSError, EOFError) as error:  # EOFError: a .gz cut off before 8 KiB of text
            raise InputError(f"{path}: cannot read: {error}") from None
        if not head:
            raise InputError(f"{path}: file is empty")
        if b"\x00" in head:
            raise InputError(f"{path}: looks like a binary file (NUL bytes), not text")
    return path


def input_kind(path: Path) -> str | None:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    for suffix in TEXT_SUFFIXES:
        if name.endswith(suffix):
            return suffix[1:]
    return None


def _open_binary(path: Path):
    try:
        return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")
    except OSError as error:
        raise InputError(f"{path}: cannot open: {error.strerror or error}") from None


# A run of characters a tokenizer reads as one word: neither whitespace nor a script written without
# spaces (CJK ideographs, kana, hangul), whose characters the BERT pre-tokenizer splits one by one.
_WORD_RUN = re.compile(r"[^\s\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]+")


def longest_word_run(line: str) -> int:
    """The length of the longest run of ``line`` that no whitespace splits (0 for a line of CJK text)."""
    return max((match.end() - match.start() for match in _WORD_RUN.finditer(line)), default=0)


UP_TO_LAST_WHITESPACE = re.compile(r".*\s", re.DOTALL)


def split_long_line(line: str, limit: int) -> list[str]:
    """Split ``line`` into pieces of at most ``limit`` characters, at the last whitespace where there is one."""
    pieces = []
    while len(line) > limit:
        last = UP_TO_LAST_WHITESPACE.match(line, limit // 2, limit + 1)  # a space, a tab, an ideographic space …
        cut = last.end() - 1 if last is not None and last.end() > 1 else limit
        pieces.append(line[:cut])
        line = line[cut:].lstrip()
    pieces.append(line)
    return pieces


LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # half a UTF-16 pair, which JSON can escape but no UTF-8 holds


class CorpusReader:
    """Yields ``(document_index, sentence)`` for every sentence of every input, in order.

    Units: in .txt files every non-blank line is a sentence (or paragraph) and a blank line ends a
    document; in .jsonl / .parquet every record, and in a dataset every row, is a document whose text
    field is split into lines the same way. Each input starts a new document. ``stats`` counts what was
    skipped or split.
    """

    def __init__(self, inputs: list[Input], config: DataConfig):
        self.inputs = inputs
        self.config = config
        self.stats: Counter[str] = Counter()
        # The document index each input starts at, appended as the input is opened (an empty input shares the
        # next one's): the sentences of input i are those of documents in [first_documents[i], first_documents[i + 1]).
        self.first_documents: list[int] = []

    def __iter__(self) -> Iterator[tuple[int, str]]:
        readers = {"txt": self._txt, "jsonl": self._jsonl, "parquet": self._parquet, "dataset": self._dataset}
        limit = self.config.max_line_chars
        document = 0
        self.first_documents = []
        for source in self.inputs:
            self.first_documents.append(document)
            kind = "dataset" if isinstance(source, DatasetSplit) else input_kind(source)
            started = False
            for line, new_document in readers[kind](source):
                if new_document and started:
                    document += 1
                    started = False
                line = line.strip()
                if not line:
                    if kind == "txt" and started:  # a blank line ends a document
                        document += 1
                        started = False
                    continue
                started = True
                if len(line) <= limit:  # nearly every line: one sentence, no pieces to make
                    self.stats["sentences"] += 1
                    yield document, line
                    continue
                pieces = split_long_line(line, limit)
                self.stats["lines_split"] += len(pieces) > 1
                for piece in pieces:
                    self.stats["sentences"] += 1
                    yield document, piece
            if started:
                document += 1

    def _bad(self, where: str, problem: str) -> None:
        if self.config.on_bad_line == "error":
            raise InputError(f"{where}: {problem} (set data.on_bad_line=skip to skip such lines and count them)")
        self.stats["bad_lines_skipped"] += 1

    def _decoded_lines(self, path: Path) -> Iterator[tuple[int, str]]:
        with _open_binary(path) as handle:
            try:
                for lineno, line in numbered_lines(handle):  # a byte-order mark (common in Gutenberg files) dropped
                    if isinstance(line, UnicodeDecodeError):
                        self._bad(f"{path}:{lineno}", undecodable(line))
                    elif (
                        len(line) > self.config.max_line_chars
                        and (run := longest_word_run(line)) > self.config.max_line_chars
                    ):
                        # Cut into pieces, it would become a few [UNK]s: no text a careful user wants trained on.
                        self._bad(
                            f"{path}:{lineno}",
                            f"{run} characters without whitespace (more than data.max_line_chars="
                            f"{self.config.max_line_chars}): no words a tokenizer can split (encoded or binary data?)",
                        )
                    else:
                        yield lineno, line
            except (OSError, EOFError) as error:  # e.g. a truncated .gz file
                raise InputError(f"{path}: cannot read: {error}") from None

    def _txt(self, path: Path) -> Iterator[tuple[str, bool]]:
        for _, line in self._decoded_lines(path):
            yield line, False

    def _jsonl(self, path: Path) -> Iterator[tuple[str, bool]]:
        field = self.config.text_field
        for lineno, line in self._decoded_lines(path):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                self._bad(f"{path}:{lineno}", f"invalid JSON: {error.msg} at column {error.colno}")
                continue
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                self._bad(
                    f"{path}:{lineno}", f"record has no string field '{field}' (has: {keys}); set data.text_field"
                )
                continue
            if LONE_SURROGATE.search(record[field]):  # a JSON \ud800 escape: no UTF-8 text, no tokenizer takes it
                self._bad(f"{path}:{lineno}", f"field '{field}' holds a lone surrogate (\\ud800-\\udfff), not text")
                continue
            yield from _record_lines(record[field])

    def _parquet(self, path: Path) -> Iterator[tuple[str, bool]]:
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
        except Exception as error:  # pyarrow raises several types for corrupt files
            raise InputError(f"{path}: not a readable parquet file: {error}") from None
        field = self.config.text_field
        if field not in parquet.schema_arrow.names:
            raise InputError(
                f"{path}: no column '{field}' (has: {', '.join(parquet.schema_arrow.names)}); set data.text_field"
            )
        row = 0
        for batch in parquet.iter_batches(columns=[field], batch_size=4096):
            for text in batch.column(0).to_pylist():
                row += 1
                if not isinstance(text, str):
                    self._bad(f"{path}:{row}", f"row has no text in column '{field}'")
                    continue
                yield from _record_lines(text)

    def _dataset(self, source: DatasetSplit) -> Iterator[tuple[str, bool]]:
        field = self.config.text_field
        row = 0
        for batch in source.dataset.select_columns([field]).iter(batch_size=DATASET_BATCH_ROWS):
            for text in batch[field]:
                row += 1
                if not isinstance(text, str):
                    self._bad(f"{source} row {row}", f"no text in column '{field}'")
                    continue
                yield from _record_lines(text)


DATASET_BATCH_ROWS = 4096  # rows of a dataset in memory at once


def _record_lines(text: str) -> Iterator[tuple[str, bool]]:
    """A record is one document: its first line opens it, the rest follow (blank lines are dropped)."""
    first = True
    for line in text.split("\n"):
        if line.strip():
            yield line, first
            first = False
