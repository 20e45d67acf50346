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

A directory counts as prepared only when its meta.json exists; it is written last, inside a temporary
directory that is renamed into place, so nothing half-written ever looks complete.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
from pathlib import Path

import numpy as np

from spanlm.errors import InputError

FORMAT_VERSION = 1  # of the arrays on disk (a change of what they hold alone does not force a rebuild)
ARRAYS = ("ids", "word_starts", "sentence_offsets", "document_offsets", "token_counts")


def ids_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def read_meta(directory: str | Path) -> dict | None:
    """The metadata of a complete prepared directory, or None when there is none."""
    path = Path(directory) / "meta.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def fsync_tree(directory: Path) -> None:
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
    fsync_directory(directory)


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (a rename into it, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_directory(tmp: Path, final: Path) -> None:
    """Atomically put ``tmp`` in place of ``final`` (an old ``final`` is removed only afterwards)."""
    _usual_modes(tmp)
    fsync_tree(tmp)
    old = None
    if final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        final.rename(old)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# How libraries that wrap the OSError say it: safetensors "(os error 28)", numpy's short write.
_OUT_OF_SPACE_TEXT = re.compile(r"No space left on device|Disk quota exceeded|File too large|\d+ requested and \d+ written")


def out_of_space(error: BaseException) -> str | None:
    """Why, when ``error`` or what led to it is the file system refusing more bytes (a full disk, a quota,
    a file-size limit); else None. The chain is searched because libraries wrap the OSError (torch.save
    raises a RuntimeError in whose context it is; safetensors and numpy raise their own types)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in OUT_OF_SPACE:
            return os.strerror(seen.errno)
        if (match := _OUT_OF_SPACE_TEXT.search(str(seen))) is not None:
            return match.group(0)
        seen = seen.__cause__ or seen.__context__
    return None


@contextlib.contextmanager
def full_disk_is_an_input_error(target: Path, kept: str):
    """Turn running out of space while writing ``target`` into a one-line InputError saying what is ``kept``."""
    try:
        yield
    except Exception as error:
        reason = out_of_space(error)
        if reason is None:
            raise
        raise InputError(f"{target}: could not be written ({reason}); {kept}") from None


def write_text_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or what it held before (a full disk leaves it as it was)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    kept = f"the previous {path} is intact" if path.exists() else "nothing was written"
    try:
        with full_disk_is_an_input_error(path, kept):
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _usual_modes(root: Path) -> None:
    """The modes a plain mkdir / open would have given (0755 / 0644 under the usual umask): a temporary
    directory from ``mkdtemp`` is 0700, and a prepared corpus or an export is meant to be shared."""
    umask = os.umask(0)
    os.umask(umask)
    for directory, _, files in os.walk(root):
        inherited = os.stat(directory).st_mode & stat.S_ISGID  # a group-shared parent's setgid, as mkdir keeps it
        os.chmod(directory, (0o777 & ~umask) | inherited)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o666 & ~umask)


class PreparedCorpus:
    """Read side of a prepared directory: the arrays as read-only memmaps, the tokenizer on demand."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        meta = read_meta(self.directory)
        if meta is None:
            raise InputError(f"{self.directory}: not a prepared corpus (no meta.json); run `spanlm prepare` first")
        if meta.get("format_version") != FORMAT_VERSION:
            raise InputError(f"{self.directory}: prepared with format version {meta.get('format_version')}, "
                             f"this spanlm reads {FORMAT_VERSION}; run `spanlm prepare` again")
        self.meta = meta
        arrays = {}
        for name in ARRAYS:
            try:
                arrays[name] = np.load(self.directory / f"{name}.npy", mmap_mode="r")
            except (OSError, ValueError) as error:
                raise InputError(f"{self.directory / (name + '.npy')}: unreadable ({error}); run `spanlm prepare` again") from None
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
            from spanlm.data.tokenizer import load_tokenizer, tokenizer_fingerprint

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
        return np.asarray(self.ids[self.sentence_offsets[index]:self.sentence_offsets[index + 1]])

    def document_token_range(self, index: int) -> tuple[int, int]:
        first, last = self.document_offsets[index], self.document_offsets[index + 1]
        return int(self.sentence_offsets[first]), int(self.sentence_offsets[last])
