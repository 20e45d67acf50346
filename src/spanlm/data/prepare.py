"""`spanlm prepare`: raw text → tokenizer + memmappable token shards (see :mod:`spanlm.data.shards`).

Steps: resolve and validate the inputs (files, and `datasets` splits: their Arrow files count as
the inputs' files); reuse the output when the inputs (path, size, mtime) and settings are unchanged,
or when only the inputs' paths or times changed but not their bytes; otherwise
train or load the tokenizer, then stream the corpus once: batches of sentences are tokenized in
``data.num_proc`` worker processes and appended to the arrays of a temporary directory that is renamed
into place when complete (the temporary disk is the output itself).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from spanlm.config import save_config
from spanlm.data.block_index import write_block_index
from spanlm.data.corpus import CorpusReader, Input, inputs_by_entry
from spanlm.data.hf_datasets import DatasetSplit, file_sha256
from spanlm.data.shards import (
    FORMAT_VERSION,
    REBUILD,
    NpyAppender,
    block_index_file,
    ids_dtype,
    read_meta,
    shard_directory,
)
from spanlm.data.similar_words import build_similar_words
from spanlm.data.tokenizer import load_tokenizer, save_tokenizer, tokenizer_fingerprint, train_tokenizer
from spanlm.data.words import encode_sentences
from spanlm.errors import ConfigError, InputError
from spanlm.files import (
    out_of_space,
    read_metadata,
    refuse_to_overwrite_inputs,
    replace_directory,
    temporary_sibling,
)


def input_fingerprint(recipe, inputs: list[Input], by_content: bool = False) -> str:
    """Hash of everything that decides the shards' content (not where they go or how fast they are made).

    Files count by (path, size, modification time) — cheap, checked on every run — or, ``by_content``,
    by the SHA-256 of their bytes, which survives a copy, a move or a fresh git checkout. A dataset
    split counts by its Arrow files the same way, with its split and row count
    (:meth:`DatasetSplit.identity`).
    """

    def identity(source: Input) -> list:
        if isinstance(source, DatasetSplit):
            return source.identity(by_content)
        if by_content:  # the bytes, and the suffixes that decide how they are read (.txt / .jsonl, .gz)
            return ["".join(source.suffixes[-2:]).lower(), file_sha256(source)]
        return [str(source.resolve()), source.stat().st_size, source.stat().st_mtime_ns]

    data = dataclasses.asdict(recipe.data)
    # data.split decides only which split a dataset input reads, and that split is in its identity.
    # packing / tokens_per_batch decide batching, the held_out_* keys which blocks are scored: not content.
    for irrelevant in (
        "prepared_dir",
        "prepared_shards",
        "num_proc",
        "max_len",
        "inputs",
        "split",
        "packing",
        "tokens_per_batch",
        "order_seed",
        "shard_weights",
        "input_weights",
        "held_out_max_len",
        "held_out_shards",
    ):
        data.pop(irrelevant)
    tokenizer = dataclasses.asdict(recipe.tokenizer)
    if recipe.tokenizer.path:  # a loaded tokenizer: its files decide the ids
        tokenizer["path"] = None if by_content else tokenizer["path"]
        tokenizer["files"] = [
            [p.name, *identity(p)] for p in sorted(Path(recipe.tokenizer.path).glob("*")) if p.is_file()
        ]
    stamp = [identity(source) for source in inputs]
    if (
        recipe.data.similar_words_file and Path(recipe.data.similar_words_file).is_file()
    ):  # its content decides the table
        data["similar_words_file_stamp"] = identity(Path(recipe.data.similar_words_file))
        data["similar_words_file"] = None if by_content else data["similar_words_file"]
    blob = json.dumps({"v": FORMAT_VERSION, "data": data, "tokenizer": tokenizer, "files": stamp}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def shard_inputs(inputs: list[Input], index: int, count: int, tokenizer_given: bool) -> list[Input]:
    """Shard ``index`` of ``count``: the index-th of ``count`` consecutive, equally numerous runs of the inputs
    (in the order ``data.inputs`` lists and globs them), so the shards in order are the whole corpus in order."""
    if not 0 <= index < count:
        raise ConfigError(
            f"--shard {index}/{count}: the shard number must be at least 0 and below the number of shards"
        )
    if not tokenizer_given:
        raise ConfigError(
            f"--shard {index}/{count}: the shards of one corpus must share one tokenizer: set tokenizer.path "
            "(train it once with `spanlm prepare RECIPE` on a sample of the inputs and give its tokenizer/)"
        )
    part = inputs[index * len(inputs) // count : (index + 1) * len(inputs) // count]
    if not part:
        raise ConfigError(
            f"--shard {index}/{count}: {len(inputs)} input(s) leave shard {index} without any; "
            f"use at most {len(inputs)} shards or split the inputs into more files"
        )
    return part


def _make_tmp_dir(final: Path) -> Path:
    try:
        return temporary_sibling(final)
    except OSError as error:
        raise InputError(f"{final}: cannot write the output directory: {error.strerror or error}") from None


def prepare(
    recipe,
    *,
    force: bool = False,
    log=print,
    keep_tokenizer: str | None = None,
    kept_copy: Path | None = None,
    shard: tuple[int, int] | None = None,
    deferred: list[Callable[[], None]] | None = None,
) -> Path:
    """Prepare ``recipe.data.inputs`` into ``recipe.data.prepared_dir``; returns that directory.

    ``deferred``: a run's list of what it writes into the directory once it is known to start; a directory
    reused as it is (its inputs moved or touched, the same bytes) then has its recorded fingerprint refreshed
    by the run that starts, never by one that is refused or fails (a pretraining run passes it).

    ``shard=(i, n)``: prepare only the i-th of n consecutive parts of the inputs, into
    ``prepared_dir/shard-0000i-of-0000n`` (see :func:`shard_inputs`); the tokenizer must be given (tokenizer.path).

    A directory whose tokenizer would change is replaced only with ``force`` (see _replacing_tokenizer).
    ``keep_tokenizer``: the tokenizer fingerprint a checkpoint about to be resumed was trained with;
    ``kept_copy``: that run's copy of it, when it keeps one. When the directory holds that tokenizer but
    must be rebuilt with a newly trained one, nothing is touched and the error says how to keep the
    tokenizer (the checkpoint could not resume otherwise).
    """

    config = recipe.data
    grouped = inputs_by_entry(config)
    inputs = [source for sources in grouped for source in sources]
    final = Path(config.prepared_dir)
    if shard is not None:
        inputs = shard_inputs(inputs, *shard, tokenizer_given=bool(recipe.tokenizer.path))
        final = shard_directory(final, *shard)
    # Replaced whole at the end: an input inside it would be read, then deleted with the old directory.
    refuse_to_overwrite_inputs(final, _input_files(inputs), "data.prepared_dir", replaces_directory=True)
    fingerprint = input_fingerprint(recipe, inputs)
    existing = _existing_meta(final, force, log)
    if existing and not force and existing.get("fingerprint") == fingerprint:
        log(f"{final}: up to date with its inputs, reusing it")
        return final
    # Hashed before anything is read: a file that changes while it is being prepared is not recorded
    # as the bytes that were prepared.
    content_fingerprint = input_fingerprint(recipe, inputs, by_content=True)
    # Times or paths changed (a copy, a touch, a checkout): the same bytes need no new tokenizer —
    # a tokenizer trained again may differ (tokens, numbering), and checkpoints would not resume.
    if existing and not force and existing.get("content_fingerprint") == content_fingerprint:
        refreshed = {**existing, "fingerprint": fingerprint}

        def refresh() -> None:
            _write_json_atomically(final / "meta.json", refreshed)

        refresh() if deferred is None else deferred.append(refresh)
        log(f"{final}: its inputs moved or were touched but hold the same bytes, reusing it")
        return final
    if (
        keep_tokenizer is not None
        and existing
        and existing.get("tokenizer_fingerprint") == keep_tokenizer
        and not recipe.tokenizer.path
    ):
        raise InputError(
            f"{final}: its inputs or settings changed since the checkpoint being resumed was trained on it; "
            "preparing it again would train a new tokenizer and the checkpoint could not resume. To train "
            f"on the changed inputs with the checkpoint's tokenizer, set tokenizer.path={final / 'tokenizer'}; "
            "or restore the inputs, or start a new run"
        )
    if final.exists() and not final.is_dir():
        raise InputError(f"{final}: exists and is not a directory")
    tmp = _make_tmp_dir(final)
    kept = f"the previous {final} is intact" if existing else "nothing was written"
    try:
        if recipe.tokenizer.path:
            tokenizer = load_tokenizer(recipe.tokenizer.path)
        else:
            log(
                f"training a {recipe.tokenizer.kind} tokenizer (vocab {recipe.tokenizer.vocab_size}) on "
                f"{len(inputs)} input(s)"
            )
            tokenizer = train_tokenizer((text for _, text in CorpusReader(inputs, config)), recipe.tokenizer)
        new_tokenizer = tokenizer_fingerprint(tokenizer)
        if existing and existing.get("tokenizer_fingerprint") != new_tokenizer:
            resuming = (
                (keep_tokenizer, kept_copy) if keep_tokenizer is not None and keep_tokenizer != new_tokenizer else None
            )
            _replacing_tokenizer(final, existing["tokenizer_fingerprint"], new_tokenizer, force, log, resuming)
        save_tokenizer(tokenizer, tmp / "tokenizer")
        if existing and existing.get("tokenizer_fingerprint") == new_tokenizer and (final / RUNS_FILE).is_file():
            shutil.copy2(final / RUNS_FILE, tmp / RUNS_FILE)  # the same ids: the runs still depend on it
        reader = CorpusReader(inputs, config)
        meta = _write_arrays(reader, tokenizer, config, tmp)
        write_block_index(tmp, config.max_len, tmp / block_index_file(config.max_len))
        meta.update(build_similar_words(tmp, tokenizer, config, log=log))
        meta.update(
            format_version=FORMAT_VERSION,
            fingerprint=fingerprint,
            content_fingerprint=content_fingerprint,
            tokenizer_fingerprint=new_tokenizer,
            words=config.words,
            inputs=[str(source) for source in inputs],
            # the entry of data.inputs each input came from (data.input_weights weigh entries); a shard holds a part
            input_entries=None if shard is not None else [i for i, sources in enumerate(grouped) for _ in sources],
            stats=dict(reader.stats),
            shard=list(shard) if shard is not None else None,
        )
        save_config(recipe, tmp / "config.yaml")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        replace_directory(tmp, final)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if (reason := out_of_space(error)) is not None:  # a full disk: one line, the corpus there is kept
            raise InputError(f"{final}: could not be written ({reason}); {kept}") from None
        raise
    return final


def _input_files(inputs: list[Input]) -> list[Path]:
    """The files ``inputs`` are read from: a text file itself, a dataset split's Arrow files."""
    return [
        path
        for source in inputs
        for path in (
            [source] if isinstance(source, Path) else [Path(e["filename"]) for e in source.dataset.cache_files]
        )
    ]


def _existing_meta(final: Path, force: bool, log) -> dict | None:
    """The metadata of the prepared directory about to be reused or rebuilt (None: there is none).

    A damaged meta.json, or a tokenizer without one (a copy cut short, a meta.json deleted), cannot be checked
    against the inputs or the new tokenizer: refused unless ``force``, never rebuilt as if there were nothing.
    """
    try:
        existing = read_meta(final)
    except InputError:
        if not force:
            raise
        log(f"{final / 'meta.json'}: damaged; rebuilding {final} (--force), with a new tokenizer unless tokenizer.path")
        return None
    if existing is None and not force and (final / "tokenizer").exists():
        raise InputError(f"{final}: holds a tokenizer but no meta.json; {REBUILD}")
    if existing is None and final.is_dir() and any(final.iterdir()) and not (final / "tokenizer").exists():
        # a run's directory, shards, someone's files: preparing swaps the directory whole, and they would go with it
        raise InputError(
            f"{final}: not a prepared corpus (no meta.json) and not empty; preparing would replace it with "
            "everything in it: choose another data.prepared_dir"
        )
    return existing


RUNS_FILE = "runs.txt"  # the run directories pretrained on this corpus, one a line (see record_run)


def record_run(prepared_dir: str | Path, run_dir: str | Path, log=print) -> None:
    """Note in the prepared directory that ``run_dir`` trains on its token ids, so that replacing its
    tokenizer can name the runs that depend on it."""
    path = Path(prepared_dir) / RUNS_FILE
    run = str(Path(run_dir).resolve())
    if run in dependent_runs(prepared_dir):
        return
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(run + "\n")
    except OSError as error:  # a read-only shared corpus: training goes on, the record is what is lost
        log(
            f"{path}: cannot record the run {run} ({error.strerror or error}); replacing this corpus's tokenizer "
            "will not name it"
        )


def dependent_runs(prepared_dir: str | Path) -> list[str]:
    """The recorded runs trained on ``prepared_dir`` that still exist."""
    path = Path(prepared_dir) / RUNS_FILE
    text = read_metadata(path, "it lists the runs trained on this corpus, one a line: repair or delete it", str)
    lines = (text or "").splitlines()
    return [line for line in dict.fromkeys(lines) if line and Path(line).is_dir()]


def _replacing_tokenizer(final: Path, old: str, new: str, force: bool, log, resuming: tuple | None) -> None:
    """Preparing ``final`` again would change its tokenizer: refused unless ``force``, and said either way.

    Why: runs trained on the directory read its token ids; a new tokenizer (even one trained again on
    the same settings: the trainers do not reproduce a vocabulary) gives those ids other meanings.
    """
    runs = dependent_runs(final)
    trained = f"runs trained on it: {', '.join(runs)}" if runs else "no recorded run trained on it"
    if resuming is not None and not force:  # the checkpoint could read neither tokenizer: say how to prepare its own
        fingerprint, copy = resuming
        keep = f"tokenizer.path={copy / 'tokenizer'}" if copy is not None else "the corpus it was trained on"
        raise InputError(
            f"{final}: holds tokenizer {old} and preparing it again would replace it by tokenizer {new}, but "
            f"the checkpoint being resumed was trained on tokenizer {fingerprint}: to continue it, prepare "
            f"with {keep} (into another data.prepared_dir, or here with --force; {trained})"
        )
    if not force:
        raise InputError(
            f"{final}: holds tokenizer {old} ({trained}); preparing it with these inputs and settings would "
            f"replace it by tokenizer {new}. Prepare into another data.prepared_dir (with tokenizer.path="
            f"{final / 'tokenizer'} to keep its tokenizer: a corpus never holds its own input), or replace it with "
            "`spanlm prepare RECIPE --force`"
        )
    log(
        f"{final}: replacing tokenizer {old} by {new} (--force); {trained}"
        + (
            " — each keeps its own copy under tokenizers/ to be exported, and resumes with "
            "tokenizer.path=<run>/tokenizers/<fingerprint>/tokenizer"
            if runs
            else ""
        )
    )


def _write_json_atomically(path: Path, value: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


ENCODE_BATCH_SENTENCES = 1000  # sentences a process tokenizes at once
# Worker processes pay for their start-up (importing tokenizers, loading the tokenizer, jieba's
# dictionary) only on a corpus of more batches than this; a smaller one is tokenized in this process.
PARALLEL_AFTER_BATCHES = 4


def _sentence_batches(reader: CorpusReader):
    """``(document indices, texts)`` of consecutive sentences, ``ENCODE_BATCH_SENTENCES`` at a time."""
    documents, texts = [], []
    for document, text in reader:
        documents.append(document)
        texts.append(text)
        if len(texts) == ENCODE_BATCH_SENTENCES:
            yield np.array(documents, dtype=np.int64), texts
            documents, texts = [], []
    if texts:
        yield np.array(documents, dtype=np.int64), texts


_worker_state: dict = {}


def _start_worker(backend_file: str, words: str, dtype: str) -> None:
    # The worker loads the main process's backend itself, serialized, rather than the tokenizer directory
    # through transformers: the same tokenizer by construction, and a worker that starts without importing
    # transformers (and torch with it), the main cost of a worker's start.
    from tokenizers import Tokenizer

    _worker_state.update(tokenizer=Tokenizer.from_file(backend_file), words=words, dtype=np.dtype(dtype))


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids, word_starts, lengths = encode_sentences(_worker_state["tokenizer"], texts, _worker_state["words"])
    return ids.astype(_worker_state["dtype"]), word_starts, lengths


def _encoded_batches(reader: CorpusReader, tokenizer, config, processes: int):
    """``(document indices, (ids, word_starts, lengths))`` per batch of sentences, in corpus order.

    With several processes the reader stays here (its errors and document numbering are sequential)
    and each batch is tokenized — jieba included — in one of ``processes`` workers, at most two
    batches per worker in flight, so memory does not grow with the corpus.
    """
    import collections
    import itertools
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    batches = _sentence_batches(reader)
    first = list(itertools.islice(batches, PARALLEL_AFTER_BATCHES + 1))
    if processes == 1 or len(first) <= PARALLEL_AFTER_BATCHES:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # one process: the tokenizer's own threads
        for documents, texts in itertools.chain(first, batches):
            yield documents, encode_sentences(tokenizer, texts, config.words)
        return
    # Workers are spawned, not forked: a fork would copy this process's tokenizer thread pool state.
    # An executor rather than a Pool: a worker that dies (killed for memory) fails the prepare instead
    # of leaving it waiting forever.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism
    # The backend goes to the workers as a file, not as an initializer argument: spawn writes a worker's
    # arguments down a pipe while it still holds the pipe's other end, so a worker that dies before reading
    # them (a script without a __main__ guard re-runs its prepare there) would block a write larger than
    # the pipe's buffer forever, where a small one lets the executor see the dead worker and fail.
    with tempfile.TemporaryDirectory(prefix="spanlm-prepare-") as shared:
        backend_file = Path(shared) / "tokenizer.json"
        backend_file.write_text(tokenizer.backend_tokenizer.to_str(), encoding="utf-8")
        workers = ProcessPoolExecutor(
            processes,
            multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(str(backend_file), config.words, ids_dtype(len(tokenizer)).name),
        )
        pending = collections.deque()
        try:
            for documents, texts in itertools.chain(first, batches):
                pending.append((documents, workers.submit(_encode_in_worker, texts)))
                if len(pending) == 2 * processes:
                    documents, result = pending.popleft()
                    yield documents, result.result()
            while pending:
                documents, result = pending.popleft()
                yield documents, result.result()
        finally:
            workers.shutdown(cancel_futures=True)


def _write_arrays(reader: CorpusReader, tokenizer, config, out: Path) -> dict:
    """Tokenize the corpus straight into the .npy arrays of ``out``, one batch of sentences at a time;
    returns the counts for meta.json.

    Every array is appended to as batches arrive (their headers say the length when they are closed),
    so neither the corpus nor its offsets are ever held whole, and nothing but the output is written.
    """
    vocab_size = len(tokenizer)
    dtype = ids_dtype(vocab_size)
    arrays = {
        "ids": NpyAppender(out / "ids.npy", dtype),
        "word_starts": NpyAppender(out / "word_starts.npy", np.bool_),
        "sentence_offsets": NpyAppender(out / "sentence_offsets.npy", np.int64),
        "document_offsets": NpyAppender(out / "document_offsets.npy", np.int64),
    }
    token_counts = np.zeros(vocab_size, dtype=np.int64)
    n_tokens = n_sentences = n_words = 0
    last_document = -1
    input_token_starts: list[int] = []  # the token each input's text starts at (data.input_weights)
    try:
        arrays["sentence_offsets"].append(np.zeros(1))
        for documents, (ids, word_starts, lengths) in _encoded_batches(reader, tokenizer, config, config.processes()):
            keep = lengths > 0  # a line of only unknown/removed characters tokenizes to nothing: not a sentence
            lengths, documents = lengths[keep], documents[keep]
            if not len(lengths):
                continue
            new_document = np.concatenate([[documents[0] != last_document], documents[1:] != documents[:-1]])
            # each input that starts in this batch starts at its first sentence's first token
            source = np.searchsorted(reader.first_documents, documents, side="right") - 1
            sentence_starts = n_tokens + np.cumsum(lengths) - lengths
            while len(input_token_starts) <= source[-1]:
                first = np.searchsorted(source, len(input_token_starts))
                input_token_starts.append(int(sentence_starts[first]))
            arrays["document_offsets"].append(n_sentences + np.flatnonzero(new_document))
            arrays["sentence_offsets"].append(n_tokens + np.cumsum(lengths))
            arrays["ids"].append(ids)
            arrays["word_starts"].append(word_starts)
            token_counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
            n_tokens, n_sentences, n_words = (
                n_tokens + len(ids),
                n_sentences + len(lengths),
                n_words + int(word_starts.sum()),
            )
            last_document = documents[-1]
        arrays["document_offsets"].append(np.array([n_sentences]))
    except BaseException:
        for array in arrays.values():
            array.discard()
        raise
    for array in arrays.values():
        array.close()
    if reader.stats["sentences"] == 0:
        raise InputError(f"{', '.join(map(str, reader.inputs))}: no text found (every line is blank or was skipped)")
    if n_tokens == 0:
        raise InputError("the corpus tokenizes to no tokens at all")
    np.save(out / "token_counts.npy", token_counts)
    special = {role: getattr(tokenizer, f"{role}_token_id") for role in ("pad", "unk", "cls", "sep", "mask")}
    return {
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "n_tokens": n_tokens,
        "n_words": n_words,
        "n_sentences": n_sentences,
        "n_documents": int(arrays["document_offsets"].rows - 1),
        "input_token_starts": input_token_starts + [n_tokens] * (len(reader.inputs) - len(input_token_starts)),
        "special_ids": special,
        "all_special_ids": sorted(int(i) for i in tokenizer.all_special_ids),
    }
