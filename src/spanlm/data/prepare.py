"""`spanlm prepare`: raw text → tokenizer + memmappable token shards (see :mod:`spanlm.data.shards`).

Steps: resolve and validate the inputs (files, and `datasets` splits: their Arrow files count as
the inputs' files); reuse the output when the inputs (path, size, mtime) and settings are unchanged,
or when only the inputs' paths or times changed but not their bytes; otherwise
train or load the tokenizer, read the corpus into a `datasets` Arrow table, tokenize it with
``map(batched=True, num_proc=N)``, and write the arrays into a temporary directory that is renamed
into place when complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from spanlm.data.corpus import CorpusReader, Input, resolve_inputs
from spanlm.data.hf_datasets import DatasetSplit, file_sha256
from spanlm.data.shards import FORMAT_VERSION, ids_dtype, out_of_space, read_meta, replace_directory
from spanlm.data.similar_words import build_similar_words
from spanlm.data.tokenizer import load_tokenizer, save_tokenizer, tokenizer_fingerprint, train_tokenizer
from spanlm.data.words import encode_sentences
from spanlm.errors import InputError

MAP_BATCH_SIZE = 1000


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
    for irrelevant in ("prepared_dir", "num_proc", "max_len", "inputs", "split", "packing", "tokens_per_batch"):  # batching, not content
        data.pop(irrelevant)
    tokenizer = dataclasses.asdict(recipe.tokenizer)
    if recipe.tokenizer.path:  # a loaded tokenizer: its files decide the ids
        tokenizer["path"] = None if by_content else tokenizer["path"]
        tokenizer["files"] = [[p.name, *identity(p)] for p in sorted(Path(recipe.tokenizer.path).glob("*")) if p.is_file()]
    stamp = [identity(source) for source in inputs]
    if recipe.data.similar_words_file and Path(recipe.data.similar_words_file).is_file():  # its content decides the table
        data["similar_words_file_stamp"] = identity(Path(recipe.data.similar_words_file))
        data["similar_words_file"] = None if by_content else data["similar_words_file"]
    blob = json.dumps({"v": FORMAT_VERSION, "data": data, "tokenizer": tokenizer, "files": stamp}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _make_tmp_dir(final: Path) -> Path:
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as error:
        raise InputError(f"{final}: cannot write the output directory: {error.strerror or error}") from None


def prepare(recipe, *, force: bool = False, log=print, keep_tokenizer: str | None = None,
            kept_copy: Path | None = None) -> Path:
    """Prepare ``recipe.data.inputs`` into ``recipe.data.prepared_dir``; returns that directory.

    A directory whose tokenizer would change is replaced only with ``force`` (see _replacing_tokenizer).
    ``keep_tokenizer``: the tokenizer fingerprint a checkpoint about to be resumed was trained with;
    ``kept_copy``: that run's copy of it, when it keeps one. When the directory holds that tokenizer but
    must be rebuilt with a newly trained one, nothing is touched and the error says how to keep the
    tokenizer (the checkpoint could not resume otherwise).
    """
    from spanlm.config import save_config

    config = recipe.data
    inputs = resolve_inputs(config)
    final = Path(config.prepared_dir)
    fingerprint = input_fingerprint(recipe, inputs)
    existing = read_meta(final)
    if existing and not force and existing.get("fingerprint") == fingerprint:
        log(f"{final}: up to date with its inputs, reusing it")
        return final
    # Hashed before anything is read: a file that changes while it is being prepared is not recorded
    # as the bytes that were prepared.
    content_fingerprint = input_fingerprint(recipe, inputs, by_content=True)
    # Times or paths changed (a copy, a touch, a checkout): the same bytes need no new tokenizer —
    # a tokenizer trained again may differ (tokens, numbering), and checkpoints would not resume.
    if existing and not force and existing.get("content_fingerprint") == content_fingerprint:
        existing["fingerprint"] = fingerprint
        _write_json_atomically(final / "meta.json", existing)
        log(f"{final}: its inputs moved or were touched but hold the same bytes, reusing it")
        return final
    if keep_tokenizer is not None and existing and existing.get("tokenizer_fingerprint") == keep_tokenizer \
            and not recipe.tokenizer.path:
        raise InputError(f"{final}: its inputs or settings changed since the checkpoint being resumed was trained on it; "
                         "preparing it again would train a new tokenizer and the checkpoint could not resume. To train "
                         f"on the changed inputs with the checkpoint's tokenizer, set tokenizer.path={final / 'tokenizer'}; "
                         "or restore the inputs, or start a new run")
    if final.exists() and not final.is_dir():
        raise InputError(f"{final}: exists and is not a directory")
    tmp = _make_tmp_dir(final)
    kept = f"the previous {final} is intact" if existing else "nothing was written"
    try:
        if recipe.tokenizer.path:
            tokenizer = load_tokenizer(recipe.tokenizer.path)
        else:
            log(f"training a {recipe.tokenizer.kind} tokenizer (vocab {recipe.tokenizer.vocab_size}) on {len(inputs)} input(s)")
            tokenizer = train_tokenizer((text for _, text in CorpusReader(inputs, config)), recipe.tokenizer)
        new_tokenizer = tokenizer_fingerprint(tokenizer)
        if existing and existing.get("tokenizer_fingerprint") != new_tokenizer:
            resuming = (keep_tokenizer, kept_copy) if keep_tokenizer is not None and keep_tokenizer != new_tokenizer else None
            _replacing_tokenizer(final, existing["tokenizer_fingerprint"], new_tokenizer, force, log, resuming)
        save_tokenizer(tokenizer, tmp / "tokenizer")
        if existing and existing.get("tokenizer_fingerprint") == new_tokenizer and (final / RUNS_FILE).is_file():
            shutil.copy2(final / RUNS_FILE, tmp / RUNS_FILE)  # the same ids: the runs still depend on it
        reader = CorpusReader(inputs, config)
        table = _tokenize(reader, tokenizer, config, tmp / "cache")
        meta = _write_arrays(table, tokenizer, tmp)
        meta.update(build_similar_words(tmp, tokenizer, config, log=log))
        shutil.rmtree(tmp / "cache", ignore_errors=True)
        meta.update(
            format_version=FORMAT_VERSION,
            fingerprint=fingerprint,
            content_fingerprint=content_fingerprint,
            tokenizer_fingerprint=new_tokenizer,
            words=config.words,
            inputs=[str(source) for source in inputs],
            stats=dict(reader.stats),
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
        log(f"{path}: cannot record the run {run} ({error.strerror or error}); replacing this corpus's tokenizer will not name it")


def dependent_runs(prepared_dir: str | Path) -> list[str]:
    """The recorded runs trained on ``prepared_dir`` that still exist."""
    path = Path(prepared_dir) / RUNS_FILE
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
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
        raise InputError(f"{final}: holds tokenizer {old} and preparing it again would replace it by tokenizer {new}, but "
                         f"the checkpoint being resumed was trained on tokenizer {fingerprint}: to continue it, prepare "
                         f"with {keep} (into another data.prepared_dir, or here with --force; {trained})")
    if not force:
        raise InputError(f"{final}: holds tokenizer {old} ({trained}); preparing it with these inputs and settings would "
                         f"replace it by tokenizer {new}. Keep its tokenizer with tokenizer.path={final / 'tokenizer'}, "
                         "prepare into another data.prepared_dir, or replace it with `spanlm prepare RECIPE --force`")
    log(f"{final}: replacing tokenizer {old} by {new} (--force); {trained}"
        + (" — each keeps its own copy under tokenizers/ to be exported, and resumes with "
           "tokenizer.path=<run>/tokenizers/<fingerprint>/tokenizer" if runs else ""))


def _write_json_atomically(path: Path, value: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


READ_BATCH_SIZE = 10_000


def _read_corpus(reader: CorpusReader, path: Path):
    """Corpus → a memory-mapped `datasets.Dataset` of (document, text) rows, one per sentence.

    Rows are written as Arrow record batches (the IPC stream format `datasets` itself uses), so the
    corpus never has to fit in memory and no per-row Python dict is built.
    """
    import datasets
    import pyarrow as pa

    schema = pa.schema([("document", pa.int64()), ("text", pa.string())])
    documents, texts = [], []
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        def flush():
            writer.write_batch(pa.record_batch([pa.array(documents, pa.int64()), pa.array(texts, pa.string())], schema=schema))
            documents.clear()
            texts.clear()

        for document, text in reader:
            documents.append(document)
            texts.append(text)
            if len(texts) == READ_BATCH_SIZE:
                flush()
        if texts:
            flush()
    if reader.stats["sentences"] == 0:
        raise InputError(f"{', '.join(map(str, reader.inputs))}: no text found (every line is blank or was skipped)")
    return datasets.Dataset.from_file(str(path))


def _tokenize(reader: CorpusReader, tokenizer, config, cache_dir: Path):
    """Corpus → Arrow table with one row per sentence: document index, token ids, word-start flags."""
    import pyarrow as pa

    def encode(batch: pa.Table) -> pa.Table:
        ids, word_starts, lengths = encode_sentences(tokenizer, batch.column("text").to_pylist(), config.words)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), type=pa.int64())
        return pa.table({
            "document": batch.column("document"),
            "ids": pa.LargeListArray.from_arrays(offsets, pa.array(ids.astype(np.uint32))),
            "word_starts": pa.LargeListArray.from_arrays(offsets, pa.array(word_starts)),
        })

    dataset = _read_corpus(reader, cache_dir / "corpus.arrow")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true" if config.num_proc == 1 else "false")
    tokenized = dataset.with_format("arrow").map(
        encode, batched=True, batch_size=MAP_BATCH_SIZE, num_proc=config.num_proc if config.num_proc > 1 else None,
        remove_columns=["text"], cache_file_name=str(cache_dir / "tokenized.arrow"), desc="tokenizing",
        new_fingerprint=hashlib.sha256(str(cache_dir).encode()).hexdigest()[:16],
    )
    return tokenized.data.table if hasattr(tokenized.data, "table") else tokenized.data


def _write_arrays(table, tokenizer, out: Path) -> dict:
    """Flatten the per-sentence Arrow lists into the .npy arrays; returns the counts for meta.json."""
    import pyarrow.compute as pc

    vocab_size = len(tokenizer)
    lengths = pc.list_value_length(table.column("ids")).to_numpy(zero_copy_only=False).astype(np.int64)
    documents = table.column("document").to_numpy()
    keep = lengths > 0  # a line of only unknown/removed characters tokenizes to nothing: not a sentence
    lengths, documents = lengths[keep], documents[keep]
    n_tokens = int(lengths.sum())
    if n_tokens == 0:
        raise InputError("the corpus tokenizes to no tokens at all")
    sentence_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    document_starts = np.flatnonzero(np.concatenate([[True], documents[1:] != documents[:-1]]))
    document_offsets = np.concatenate([document_starts, [len(lengths)]]).astype(np.int64)

    dtype = ids_dtype(vocab_size)
    ids = np.lib.format.open_memmap(out / "ids.npy", mode="w+", dtype=dtype, shape=(n_tokens,))
    word_starts = np.lib.format.open_memmap(out / "word_starts.npy", mode="w+", dtype=np.bool_, shape=(n_tokens,))
    token_counts = np.zeros(vocab_size, dtype=np.int64)
    position = 0
    for id_chunk, start_chunk in zip(table.column("ids").chunks, table.column("word_starts").chunks):
        chunk_ids = id_chunk.flatten().to_numpy()
        chunk_starts = start_chunk.flatten().to_numpy(zero_copy_only=False)
        ids[position:position + len(chunk_ids)] = chunk_ids
        word_starts[position:position + len(chunk_ids)] = chunk_starts
        token_counts += np.bincount(chunk_ids, minlength=vocab_size)[:vocab_size]
        position += len(chunk_ids)
    ids.flush()
    word_starts.flush()
    del ids, word_starts
    np.save(out / "sentence_offsets.npy", sentence_offsets)
    np.save(out / "document_offsets.npy", document_offsets)
    np.save(out / "token_counts.npy", token_counts)
    special = {role: getattr(tokenizer, f"{role}_token_id") for role in ("pad", "unk", "cls", "sep", "mask")}
    return {
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "n_tokens": n_tokens,
        "n_words": int(np.load(out / "word_starts.npy", mmap_mode="r").sum()),
        "n_sentences": int(len(lengths)),
        "n_documents": int(len(document_offsets) - 1),
        "special_ids": special,
        "all_special_ids": sorted(int(i) for i in tokenizer.all_special_ids),
    }
