"""The tokenizer a run was trained on, kept in the run directory so it outlives the prepared corpus.

Why: a prepared directory can be prepared again (``--force``, changed inputs) with another tokenizer,
and the WordPiece / Unigram trainers do not reproduce a vocabulary. A run's checkpoints name the
tokenizer they were trained on by its fingerprint; its copy lives once per run, content-addressed::

    <output_dir>/tokenizers/<fingerprint>/
        tokenizer/           the fast tokenizer, as in the prepared directory
        meta.json            the prepared corpus's metadata (vocabulary size, special ids, fingerprint)
        token_counts.npy     corpus frequency of every id (the unigram masking and CharBERT's characters)
        similar_words.npz    MacBERT's similar-word table, when the corpus has one

It is written before the first checkpoint that names it, so every COMPLETE checkpoint has it.
``spanlm export`` builds the model from it; a resume against a corpus of another tokenizer is refused
with the way to prepare one from it (``tokenizer.path=<that copy>/tokenizer``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from spanlm.data.shards import PreparedCorpus, read_meta
from spanlm.data.similar_words import TABLE_FILE
from spanlm.data.tokenizer import save_tokenizer
from spanlm.errors import InputError
from spanlm.files import read_metadata, write_directory

KEPT_ROOT = "tokenizers"


def kept_tokenizer_dir(run_dir: Path, fingerprint: str) -> Path:
    return Path(run_dir) / KEPT_ROOT / fingerprint


def checkpoint_tokenizer_dir(checkpoint: Path, fingerprint: str | None) -> Path | None:
    """The kept copy of the tokenizer a checkpoint (``<run>/checkpoints/step-N``) names, or None
    (a checkpoint written before runs kept their tokenizer)."""
    if fingerprint is None:
        return None
    kept = kept_tokenizer_dir(Path(checkpoint).parent.parent, fingerprint)
    return kept if (kept / "meta.json").is_file() else None


def check_same_tokenizer(path: Path, trainer_state: dict, fingerprint: str | None, recipe) -> None:
    """Refuse a checkpoint whose token ids came from another tokenizer than the data's now.

    Why: ``pretrain`` prepares the corpus again when its inputs or settings change (or with
    ``--force``), which trains a new tokenizer — and the WordPiece / Unigram trainers of `tokenizers`
    do not reproduce their vocabulary (tokens, numbering) from run to run. The weights would silently
    read other tokens.
    """
    saved = trainer_state.get("tokenizer_fingerprint")
    if saved is None or fingerprint is None or saved == fingerprint:
        return

    where = getattr(getattr(recipe, "data", None), "prepared_dir", "the data")
    kept = checkpoint_tokenizer_dir(path, saved)
    how = (
        f"to continue it, prepare a corpus with its tokenizer: tokenizer.path={kept / 'tokenizer'}"
        if kept is not None
        else "restore the corpus it was trained on, or start a new run"
    )
    raise InputError(
        f"{path} was trained on the ids of tokenizer {saved}, but {where} now holds tokenizer {fingerprint} "
        f"(the corpus was prepared again: its inputs or settings changed, or --force). Its weights would read "
        f"other tokens: {how}"
    )


def keep_tokenizer(corpus: PreparedCorpus, run_dir: Path) -> Path:
    """Copy ``corpus``'s tokenizer (and what building a model needs besides the token arrays) into the run.

    ``corpus.tokenizer`` must have been loaded when training started: the copy is of the tokenizer the
    weights are trained on, even if the prepared directory is replaced meanwhile. Written once per run.
    """

    fingerprint = corpus.meta["tokenizer_fingerprint"]
    target = kept_tokenizer_dir(run_dir, fingerprint)
    if (target / "meta.json").is_file():
        return target
    tokenizer, meta, token_counts = corpus.tokenizer, dict(corpus.meta), np.asarray(corpus.token_counts)

    def fill(directory: Path) -> None:
        save_tokenizer(tokenizer, directory / "tokenizer")
        np.save(directory / "token_counts.npy", token_counts)
        table = corpus.directory / TABLE_FILE
        # The table is read from disk: only while the directory still holds this tokenizer's corpus.
        if table.is_file() and (read_meta(corpus.directory) or {}).get("tokenizer_fingerprint") == fingerprint:
            shutil.copy2(table, directory / TABLE_FILE)
        (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    return write_directory(target, fill)


COPY_DAMAGED = (
    "the run's copy of its tokenizer is damaged: restore it from a backup, or use the corpus it was trained on"
)


class KeptTokenizer(PreparedCorpus):
    """A kept tokenizer read as a prepared corpus without its token arrays: enough to build a model
    (vocabulary size, special ids, token frequencies, tokenizer), not to train one."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.meta = read_metadata(self.directory / "meta.json", COPY_DAMAGED)
        if self.meta is None:
            raise InputError(f"{self.directory}: the run's copy of its tokenizer has no meta.json; {COPY_DAMAGED}")
        try:
            self.token_counts = np.load(self.directory / "token_counts.npy", mmap_mode="r")
        except (OSError, ValueError) as error:
            raise InputError(f"{self.directory}: the run's copy of its tokenizer is unreadable ({error})") from None
        self._tokenizer = None

    def _no_token_arrays(self):
        raise InputError(
            f"{self.directory}: this objective needs the token arrays of the corpus the run was trained on, "
            f"not only its tokenizer; prepare that corpus again with tokenizer.path={self.directory / 'tokenizer'}"
        )

    ids = word_starts = sentence_offsets = document_offsets = property(_no_token_arrays)
