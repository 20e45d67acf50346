"""`spanlm prepare`: shards decode back to the input, are reused or rebuilt correctly, never half-written."""

import json
import os

import numpy as np
import pytest

from helpers import EMBEDDED_CORPUS, ENGLISH, make_recipe
from spanlm.cli import main
from spanlm.data.corpus import CorpusReader, DataConfig, resolve_inputs
from spanlm.data.prepare import prepare
from spanlm.data.shards import ARRAYS, PreparedCorpus, ids_dtype, read_meta
from spanlm.errors import InputError

QUIET = {"log": lambda *_: None}


def fixed_tokenizer(tmp_path) -> str:
    """A tokenizer directory to load (tokenizer.path): rebuilding with it keeps the same ids."""
    return str(prepare(make_recipe(tmp_path / "tokenizer-source", {"a.txt": ENGLISH}), **QUIET) / "tokenizer")


def sentences_of(recipe):
    return list(CorpusReader(resolve_inputs(recipe.data), recipe.data))


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_shards_decode_back_to_the_normalised_input(tmp_path, kind):
    recipe = make_recipe(
        tmp_path,
        {"a.txt": ENGLISH, "b.jsonl": json.dumps({"text": "Second file here."}) + "\n"},
        tokenizer={"kind": kind},
    )
    corpus = PreparedCorpus(prepare(recipe, **QUIET))
    tokenizer = corpus.tokenizer
    units = sentences_of(recipe)
    assert corpus.meta["n_sentences"] == len(units)
    assert corpus.n_documents == len({d for d, _ in units}) == 3
    normalizer = tokenizer.backend_tokenizer.normalizer
    for index, (_, text) in enumerate(units):
        decoded = tokenizer.decode(corpus.sentence(index).tolist())
        expected = normalizer.normalize_str(text)
        if kind == "bpe":  # byte-level BPE is lossless
            assert decoded == expected
        else:  # WordPiece / Metaspace decoding may move whitespace around punctuation
            assert decoded.split() == expected.split() or "".join(decoded.split()) == "".join(expected.split())
    assert corpus.token_counts.sum() == corpus.meta["n_tokens"]
    assert np.array_equal(corpus.token_counts, np.bincount(corpus.ids, minlength=corpus.vocab_size))
    assert corpus.ids.dtype == np.uint16 and corpus.word_starts.dtype == np.bool_
    assert corpus.meta["n_words"] == corpus.word_starts.sum()


def test_documents_and_sentences_line_up(tmp_path):
    recipe = make_recipe(tmp_path, {"a.txt": "one two\nthree\n\nfour\n"})
    corpus = PreparedCorpus(prepare(recipe, **QUIET))
    assert corpus.document_offsets.tolist() == [0, 2, 3]
    assert corpus.sentence_offsets[0] == 0 and corpus.sentence_offsets[-1] == len(corpus.ids)
    assert all(corpus.word_starts[corpus.sentence_offsets[:-1]])  # every sentence opens with a word


def test_reuse_and_invalidation(tmp_path):
    recipe = make_recipe(tmp_path, {"a.txt": ENGLISH})
    messages = []
    out = prepare(recipe, log=messages.append)
    first = read_meta(out)
    prepare(recipe, log=messages.append)
    assert "reusing" in messages[-1] and read_meta(out) == first

    path = tmp_path / "in" / "a.txt"
    # Touched (or copied, or checked out again): the same bytes are reused, not prepared again — a
    # tokenizer trained again would number its vocabulary differently and checkpoints could not resume.
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    prepare(recipe, log=messages.append)
    assert "same bytes, reusing it" in messages[-1]
    touched = read_meta(out)
    assert touched["fingerprint"] != first["fingerprint"] and {**touched, "fingerprint": None} == {
        **first,
        "fingerprint": None,
    }
    prepare(recipe, log=messages.append)
    assert "up to date" in messages[-1]  # the new times were recorded: the cheap check suffices again

    # Changed bytes train a new tokenizer, whose replacing the old one must be asked for (--force).
    path.write_text(ENGLISH + "A brand new line.\n", encoding="utf-8")
    second = read_meta(prepare(recipe, force=True, **QUIET))
    assert second["fingerprint"] != first["fingerprint"] and second["n_sentences"] == first["n_sentences"] + 1

    recipe.tokenizer.vocab_size = 250
    third = read_meta(prepare(recipe, force=True, **QUIET))
    assert third["fingerprint"] != second["fingerprint"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_loading_an_existing_tokenizer_gives_the_same_ids(tmp_path):
    first = PreparedCorpus(prepare(make_recipe(tmp_path / "1", {"a.txt": ENGLISH}), **QUIET))
    recipe = make_recipe(tmp_path / "2", {"a.txt": ENGLISH}, tokenizer={"path": str(first.directory / "tokenizer")})
    second = PreparedCorpus(prepare(recipe, **QUIET))
    assert np.array_equal(first.ids, second.ids) and np.array_equal(first.word_starts, second.word_starts)
    assert first.meta["tokenizer_fingerprint"] == second.meta["tokenizer_fingerprint"]


def test_a_failed_rebuild_keeps_the_old_output_and_leaves_nothing_half_written(tmp_path):
    recipe = make_recipe(tmp_path, {"a.txt": ENGLISH})
    out = prepare(recipe, **QUIET)
    before = read_meta(out)
    (tmp_path / "in" / "a.txt").write_bytes(ENGLISH.encode() + b"bad \xff byte\n")
    with pytest.raises(InputError, match=r"a\.txt:7: invalid UTF-8"):
        prepare(recipe, **QUIET)
    assert read_meta(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "prepared"]

    fresh = make_recipe(tmp_path / "new", {"bad.txt": b"ok\n\xff\n"})
    with pytest.raises(InputError):
        prepare(fresh, **QUIET)
    assert not (tmp_path / "new" / "prepared").exists()
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["in"]


def test_skipped_lines_are_counted(tmp_path):
    recipe = make_recipe(
        tmp_path, {"a.txt": b"good line\nbad \xff line\nanother good line\n"}, data={"on_bad_line": "skip"}
    )
    meta = read_meta(prepare(recipe, **QUIET))
    assert meta["stats"]["bad_lines_skipped"] == 1 and meta["n_sentences"] == 2


def test_unwritable_output_directory(tmp_path):
    recipe = make_recipe(tmp_path, {"a.txt": ENGLISH})
    (tmp_path / "file").write_text("x")
    recipe.data.prepared_dir = str(tmp_path / "file" / "prepared")
    with pytest.raises(InputError, match="cannot write the output directory"):
        prepare(recipe, **QUIET)


def test_text_that_tokenizes_to_nothing(tmp_path):
    recipe = make_recipe(tmp_path, {"a.txt": "\n   \n\t\n"})
    with pytest.raises(InputError, match="no text found"):
        prepare(recipe, **QUIET)


def test_wide_vocabularies_use_uint32():
    assert ids_dtype(65536) == np.uint16 and ids_dtype(65537) == np.uint32


def test_prepared_corpus_rejects_incomplete_or_foreign_directories(tmp_path):
    with pytest.raises(InputError, match="not a prepared corpus"):
        PreparedCorpus(tmp_path)
    out = prepare(make_recipe(tmp_path, {"a.txt": ENGLISH}), **QUIET)
    os.remove(out / "ids.npy")
    with pytest.raises(InputError, match="ids.npy: unreadable"):
        PreparedCorpus(out)


def test_tokenizer_mismatch_is_detected(tmp_path):
    out = prepare(make_recipe(tmp_path / "a", {"a.txt": ENGLISH}), **QUIET)
    other = prepare(make_recipe(tmp_path / "b", {"a.txt": ENGLISH}, tokenizer={"kind": "bpe"}), **QUIET)
    corpus = PreparedCorpus(out)
    import shutil

    shutil.rmtree(out / "tokenizer")
    shutil.copytree(other / "tokenizer", out / "tokenizer")
    with pytest.raises(InputError, match="does not match the tokenizer the shards were made with"):
        corpus.tokenizer


def test_cli_prepare_prints_statistics_and_writes_the_config(tmp_path, capsys):
    recipe_path = tmp_path / "recipe.yaml"
    (tmp_path / "a.txt").write_text(ENGLISH, encoding="utf-8")
    recipe_path.write_text(f"data:\n  inputs: [{tmp_path / 'a.txt'}]\ntokenizer:\n  vocab_size: 300\n")
    assert main(["prepare", str(recipe_path), f"data.prepared_dir={tmp_path / 'out'}", "data.max_len=64"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n_sentences"] == 5 and summary["n_documents"] == 2 and summary["n_tokens"] > summary["n_sentences"]
    assert "max_len: 64" in (tmp_path / "out" / "config.yaml").read_text()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["data.inputs=[{tmp}/missing.txt]"], "missing.txt: no such file"),
        (["data.max_lenn=3"], "unknown config key 'data.max_lenn'"),
        (["data.inputs=[{tmp}/bad.txt]"], "bad.txt:2: invalid UTF-8"),
    ],
)
def test_cli_errors_are_one_line_with_exit_code_2(tmp_path, capsys, args, fragment):
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xc3\x28\n")
    (tmp_path / "r.yaml").write_text(f"data:\n  prepared_dir: {tmp_path / 'out'}\n")
    assert main(["prepare", str(tmp_path / "r.yaml")] + [a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert fragment in err[-1] and err[-1].startswith("spanlm prepare: error:") and "Traceback" not in "".join(err)


def test_bad_input_found_while_tokenizing_is_reported_plainly(tmp_path):
    """With a loaded tokenizer the first full read happens while tokenizing; nothing may hide the error."""
    first = prepare(make_recipe(tmp_path / "1", {"a.txt": ENGLISH}), **QUIET)
    recipe = make_recipe(tmp_path / "2", {"a.txt": b"fine\nbro\xffken\n"}, tokenizer={"path": str(first / "tokenizer")})
    with pytest.raises(InputError, match=r"a\.txt:2: invalid UTF-8"):
        prepare(recipe, **QUIET)


def test_same_bytes_under_another_suffix_are_prepared_again(tmp_path):
    # .txt and .jsonl read the same bytes differently: the suffix is part of what the content decides.
    record = json.dumps({"text": "The cat sat on the mat."}) + "\n"
    recipe = make_recipe(tmp_path, {"a.txt": record * 20}, tokenizer={"path": fixed_tokenizer(tmp_path)})
    first = PreparedCorpus(prepare(recipe, **QUIET))
    (tmp_path / "in" / "a.txt").rename(tmp_path / "in" / "a.jsonl")
    recipe.data.inputs = [str(tmp_path / "in" / "a.jsonl")]
    second = PreparedCorpus(prepare(recipe, **QUIET))
    assert second.meta["n_tokens"] < first.meta["n_tokens"]  # the JSON syntax is no longer text
    assert "{" not in second.tokenizer.decode(second.sentence(0).tolist())


def test_an_input_changed_while_it_is_prepared_is_not_taken_for_the_prepared_bytes(tmp_path, monkeypatch):
    import spanlm.data.prepare as prepare_module

    # A loaded tokenizer: the rebuild keeps it, so it needs no --force.
    recipe = make_recipe(tmp_path, {"a.txt": ENGLISH}, tokenizer={"path": fixed_tokenizer(tmp_path)})
    path = tmp_path / "in" / "a.txt"
    original = prepare_module._write_arrays

    def tokenize_then_edit(*args, **kwargs):  # the file changes after it was read
        counts = original(*args, **kwargs)
        path.write_text(ENGLISH + "Written while preparing.\n", encoding="utf-8")
        return counts

    monkeypatch.setattr(prepare_module, "_write_arrays", tokenize_then_edit)
    first = read_meta(prepare(recipe, **QUIET))
    monkeypatch.setattr(prepare_module, "_write_arrays", original)
    second = read_meta(prepare(recipe, **QUIET))
    assert second["n_sentences"] == first["n_sentences"] + 1  # rebuilt, not reused


def prepared_arrays(directory) -> dict:
    return {name: np.load(directory / f"{name}.npy") for name in ARRAYS}


@pytest.mark.parametrize("words", ["none", "jieba"])
@pytest.mark.slow
def test_worker_processes_write_the_same_arrays(tmp_path, monkeypatch, words):
    import spanlm.data.prepare as prepare_module

    text = (EMBEDDED_CORPUS / ("hongloumeng_ch1-5.txt" if words == "jieba" else "alice_in_wonderland.txt")).read_text(
        encoding="utf-8"
    )
    monkeypatch.setattr(prepare_module, "ENCODE_BATCH_SENTENCES", 20)  # many small batches: the workers take turns
    tokenizer = fixed_tokenizer(tmp_path)
    one, two = (
        make_recipe(
            tmp_path / str(n), {"a.txt": text}, data={"num_proc": n, "words": words}, tokenizer={"path": tokenizer}
        )
        for n in (1, 2)
    )
    first, second = prepare(one, **QUIET), prepare(two, **QUIET)
    first_arrays, second_arrays = prepared_arrays(first), prepared_arrays(second)
    assert len(first_arrays["sentence_offsets"]) > (prepare_module.PARALLEL_AFTER_BATCHES + 1) * 20
    for name in ARRAYS:
        assert np.array_equal(first_arrays[name], second_arrays[name]), name
    assert {k: v for k, v in read_meta(first).items() if "fingerprint" not in k and k != "inputs"} == {
        k: v for k, v in read_meta(second).items() if "fingerprint" not in k and k != "inputs"
    }


def test_worker_processes_are_used(tmp_path, monkeypatch):
    import spanlm.data.prepare as prepare_module

    monkeypatch.setattr(prepare_module, "ENCODE_BATCH_SENTENCES", 40)
    used = []
    original = prepare_module._encoded_batches

    def counting(reader, tokenizer, config, processes):
        import multiprocessing

        for batch in original(reader, tokenizer, config, processes):
            used.append(len(multiprocessing.active_children()))
            yield batch

    monkeypatch.setattr(prepare_module, "_encoded_batches", counting)
    text = (EMBEDDED_CORPUS / "alice_in_wonderland.txt").read_text(encoding="utf-8")
    prepare(make_recipe(tmp_path / "many", {"a.txt": text}, data={"num_proc": 2}), **QUIET)
    assert max(used) == 2
    used.clear()
    prepare(make_recipe(tmp_path / "few", {"a.txt": ENGLISH}, data={"num_proc": 2}), **QUIET)  # one batch: no workers
    assert max(used) == 0


def test_a_worker_starts_without_transformers_and_encodes_as_the_main_process(tmp_path):
    """A worker rebuilds the main process's backend from its JSON: importing transformers (and torch with
    it) would cost each worker more than a batch of tokenizing."""
    import subprocess
    import sys

    from spanlm.data.tokenizer import load_tokenizer
    from spanlm.data.words import encode_sentences

    tokenizer = load_tokenizer(fixed_tokenizer(tmp_path))
    (tmp_path / "backend.json").write_text(tokenizer.backend_tokenizer.to_str(), encoding="utf-8")
    texts = ENGLISH.splitlines()[:5] + ["a literal [MASK] and <s> are text"]
    script = (
        "import json, sys\n"
        "from spanlm.data.prepare import _encode_in_worker, _start_worker\n"
        f"_start_worker({str(tmp_path / 'backend.json')!r}, 'none', 'int64')\n"
        f"encoded = _encode_in_worker({texts!r})\n"
        "print(json.dumps({'arrays': [a.tolist() for a in encoded], "
        "'imported': sorted({'torch', 'transformers'} & set(sys.modules))}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    worker = json.loads(done.stdout)
    assert worker["imported"] == []
    assert worker["arrays"] == [a.tolist() for a in encode_sentences(tokenizer, texts, "none")]


@pytest.mark.slow
def test_a_worker_that_dies_starting_fails_the_prepare_instead_of_hanging(tmp_path):
    """A script without a ``__main__`` guard runs its prepare again in each spawned worker, which then
    dies before it reads what the main process sends it; a tokenizer larger than a pipe's buffer must not
    leave the main process blocked on that write."""
    import subprocess
    import sys

    holmes = (EMBEDDED_CORPUS / "adventures_of_sherlock_holmes.txt").read_text(encoding="utf-8")
    big_vocab = make_recipe(tmp_path / "big-vocab", {"a.txt": holmes}, tokenizer={"vocab_size": 6000})
    tokenizer = prepare(big_vocab, **QUIET) / "tokenizer"
    assert (tokenizer / "tokenizer.json").stat().st_size > 1 << 17  # twice a pipe's default buffer
    recipe = {
        "data": {
            "inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")],
            "prepared_dir": str(tmp_path / "prepared"),
            "num_proc": 2,
        },
        "tokenizer": {"path": str(tokenizer)},
    }
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import spanlm.data.prepare as prepare_module\n"
        "from spanlm.config import from_dict\n"
        "from spanlm.pretrain.recipe import Recipe\n"
        "prepare_module.ENCODE_BATCH_SENTENCES = 20\n"
        f"prepare_module.prepare(from_dict(Recipe, {recipe!r}))\n",
        encoding="utf-8",
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert not (tmp_path / "prepared").exists()


def test_num_proc_defaults_to_every_core():
    assert DataConfig().num_proc is None and DataConfig().processes() == len(os.sched_getaffinity(0))
    assert DataConfig(num_proc=3).processes() == 3


def test_temporary_disk_is_the_output(tmp_path, monkeypatch):
    """While the arrays are written, the temporary directory holds nothing but (the beginning of) the output."""
    import spanlm.data.prepare as prepare_module

    seen = []
    original = prepare_module.build_similar_words

    def look(directory, *args, **kwargs):
        seen.extend(sorted(p.name for p in directory.iterdir()))
        return original(directory, *args, **kwargs)

    monkeypatch.setattr(prepare_module, "build_similar_words", look)
    out = prepare(make_recipe(tmp_path, {"a.txt": ENGLISH}), **QUIET)
    assert seen == sorted([f"{name}.npy" for name in ARRAYS] + ["block_index-128.npy", "tokenizer"])
    assert sorted(p.name for p in out.iterdir()) == sorted(seen + ["config.yaml", "meta.json"])


def tree_bytes(directory) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "damage",
    [b'{"format_version": 3, "fingerprint": "ab', b"\xff\xfe not utf-8", b"[1, 2]", None],
    ids=["cut-short", "not-utf8", "not-a-mapping", "deleted"],
)
def test_a_damaged_meta_json_is_named_and_the_tokenizer_kept_without_force(tmp_path, damage):
    """Damage is never read as "no corpus here": that would rebuild the directory with a new tokenizer."""
    recipe = make_recipe(tmp_path, {"a.txt": ENGLISH})
    out = prepare(recipe, **QUIET)
    if damage is None:
        (out / "meta.json").unlink()
    else:
        (out / "meta.json").write_bytes(damage)
    before = tree_bytes(out)
    with pytest.raises(InputError, match=r"meta\.json.*--force") as error:
        prepare(recipe, **QUIET)
    assert "\n" not in str(error.value) and tree_bytes(out) == before
    messages = []
    assert read_meta(prepare(recipe, force=True, log=messages.append))["n_sentences"] > 0
    if damage is not None:
        assert any("meta.json: damaged; rebuilding" in m for m in messages)


def test_a_tokenizer_json_that_is_json_but_not_a_tokenizer_says_so(tmp_path):
    from spanlm.data.tokenizer import load_tokenizer

    tokenizer = prepare(make_recipe(tmp_path, {"a.txt": ENGLISH}), **QUIET) / "tokenizer"
    (tokenizer / "tokenizer.json").write_text('{"version": "1.0"}', encoding="utf-8")
    with pytest.raises(InputError, match=r"tokenizer\.json: JSON but not a tokenizer \(no model or added_tokens"):
        load_tokenizer(tokenizer)
    (tokenizer / "tokenizer_config.json").write_text("{", encoding="utf-8")
    with pytest.raises(InputError, match=r"tokenizer_config\.json: damaged \(not valid JSON"):
        load_tokenizer(tokenizer)


def test_a_damaged_runs_txt_is_named(tmp_path):
    from spanlm.data.prepare import RUNS_FILE, dependent_runs

    out = prepare(make_recipe(tmp_path, {"a.txt": ENGLISH}), **QUIET)
    (out / RUNS_FILE).write_bytes(b"/a/run\n\xff\n")
    with pytest.raises(InputError, match=r"runs\.txt: damaged \(not UTF-8"):
        dependent_runs(out)
