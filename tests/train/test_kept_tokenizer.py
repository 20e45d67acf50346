"""Every run keeps what it needs to be exported and resumed: its tokenizer outlives the prepared corpus."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers import EMBEDDED_CORPUS, TINY_RUN
from spanlm.cli import main
from spanlm.config import from_dict, save_config
from spanlm.data.shards import read_meta
from spanlm.data.tokenizer import load_tokenizer, tokenizer_fingerprint
from spanlm.pretrain.recipe import Recipe
from spanlm.train import checkpoint as ckpt

TINY_MODEL = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


def tiny_recipe(tmp_path: Path, name: str, prepared: Path, output_dir: Path, **tokenizer) -> Path:
    recipe = from_dict(
        Recipe,
        {
            "data": {
                "inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")],
                "prepared_dir": str(prepared),
                "max_len": 32,
            },
            "tokenizer": {"vocab_size": 400, **tokenizer},
            "model": TINY_MODEL,
            "objective": {"name": "mlm"},
            "train": {
                "output_dir": str(output_dir),
                "max_steps": 2,
                "save_every": 2,
                "batch_size": 4,
                "num_workers": 0,
                "eval_every": 0,
                "eval_blocks": 2,
                "log_every": 1,
                "warmup_steps": 1,
            },
            "logging": {"report_to": [], "progress": False},
        },
    )
    path = tmp_path / f"{name}.yaml"
    save_config(recipe, path)
    return path


def fingerprint_of(run: Path) -> str:
    return torch.load(ckpt.latest_checkpoint(run) / "trainer_state.pt", weights_only=True)["tokenizer_fingerprint"]


@pytest.mark.slow
def test_a_run_is_exported_and_resumed_after_its_corpus_was_prepared_again(tmp_path, capsys):
    prepared, run = tmp_path / "prepared", tmp_path / "run"
    recipe = tiny_recipe(tmp_path, "first", prepared, run)
    assert main(["pretrain", str(recipe)]) == 0
    trained_on = read_meta(prepared)["tokenizer_fingerprint"]
    kept = run / "tokenizers" / trained_on
    assert fingerprint_of(run) == trained_on
    assert tokenizer_fingerprint(load_tokenizer(kept / "tokenizer")) == trained_on

    # The corpus is prepared again, on purpose, with another tokenizer.
    assert main(["prepare", str(recipe), "tokenizer.vocab_size=300", "--force"]) == 0
    assert read_meta(prepared)["tokenizer_fingerprint"] != trained_on
    capsys.readouterr()

    # Export still works, from the run's own copy of its tokenizer.
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert tokenizer_fingerprint(load_tokenizer(tmp_path / "hf")) == trained_on

    # Resume against the changed corpus stays refused, saying how to go on ...
    assert main(["pretrain", str(recipe), "train.max_steps=4", "--resume", "auto"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("spanlm pretrain: error:") and f"tokenizer.path={kept / 'tokenizer'}" in error
    # ... and doing what it says resumes the run.
    assert (
        main(
            [
                "pretrain",
                str(recipe),
                "train.max_steps=4",
                f"tokenizer.path={kept / 'tokenizer'}",
                f"data.prepared_dir={tmp_path / 'prepared-again'}",
                "--resume",
                "auto",
            ]
        )
        == 0
    )
    assert ckpt.step_of(ckpt.latest_checkpoint(run)) == 4 and fingerprint_of(run) == trained_on
    assert sorted(p.name for p in (run / "tokenizers").iterdir()) == [trained_on]  # once per run


@pytest.mark.slow
def test_a_checkpoint_from_before_runs_kept_their_tokenizer_exports_as_before(tmp_path, capsys):
    prepared, run = tmp_path / "prepared", tmp_path / "run"
    assert main(["pretrain", str(tiny_recipe(tmp_path, "first", prepared, run))]) == 0
    shutil.rmtree(run / "tokenizers")
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert main(["prepare", str(tmp_path / "first.yaml"), "tokenizer.vocab_size=300", "--force"]) == 0
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 2
    assert "trained on the ids of tokenizer" in capsys.readouterr().err


@pytest.mark.slow
def test_an_objective_that_needs_the_token_arrays_says_so(tmp_path):
    from spanlm.errors import InputError
    from spanlm.pretrain.kept_tokenizer import KeptTokenizer

    prepared, run = tmp_path / "prepared", tmp_path / "run"
    assert main(["pretrain", str(tiny_recipe(tmp_path, "first", prepared, run))]) == 0
    kept = KeptTokenizer(run / "tokenizers" / read_meta(prepared)["tokenizer_fingerprint"])
    assert kept.vocab_size == read_meta(prepared)["vocab_size"] and len(kept.token_counts) == kept.vocab_size
    with pytest.raises(InputError, match=r"needs the token arrays .* tokenizer.path=.*/tokenizer$"):
        kept.ids
    assert (
        json.loads((kept.directory / "meta.json").read_text())["tokenizer_fingerprint"]
        == kept.meta["tokenizer_fingerprint"]
    )


@pytest.mark.slow
def test_prepare_replaces_a_tokenizer_only_with_force_and_names_the_runs_trained_on_it(tmp_path, capsys):
    prepared, run = tmp_path / "prepared", tmp_path / "run"
    recipe = tiny_recipe(tmp_path, "first", prepared, run)
    assert main(["pretrain", str(recipe)]) == 0  # pretraining records the run in the prepared directory
    before = read_meta(prepared)
    capsys.readouterr()

    assert main(["prepare", str(recipe), "tokenizer.vocab_size=300"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(
        f"spanlm prepare: error: {prepared}: holds tokenizer {before['tokenizer_fingerprint']} "
        f"(runs trained on it: {run.resolve()}); preparing it with these inputs and settings would replace it"
    )
    assert f"tokenizer.path={prepared / 'tokenizer'}" in error and "--force" in error
    assert read_meta(prepared) == before  # nothing touched
    # the advice as given works: another directory with the kept tokenizer (here, it would hold its own input)
    keep = ["data.max_line_chars=50", f"tokenizer.path={prepared / 'tokenizer'}"]
    assert main(["prepare", str(recipe), *keep]) == 2
    assert main(["prepare", str(recipe), *keep, f"data.prepared_dir={tmp_path / 'other'}"]) == 0
    assert read_meta(tmp_path / "other")["tokenizer_fingerprint"] == before["tokenizer_fingerprint"]
    capsys.readouterr()

    assert main(["prepare", str(recipe), "tokenizer.vocab_size=300", "--force"]) == 0
    replaced = capsys.readouterr().err
    assert f"replacing tokenizer {before['tokenizer_fingerprint']} by" in replaced and str(run.resolve()) in replaced
    assert read_meta(prepared)["vocab_size"] != before["vocab_size"]
    # The new tokenizer's corpus has no run yet; the same tokenizer prepared again keeps its runs.
    assert not (prepared / "runs.txt").exists()


def test_a_rebuild_that_keeps_the_tokenizer_needs_no_force_and_keeps_its_runs(tmp_path):
    from spanlm.data.prepare import dependent_runs, prepare, record_run

    source = tmp_path / "source.txt"
    shutil.copy(EMBEDDED_CORPUS / "alice_in_wonderland.txt", source)
    recipe = from_dict(
        Recipe,
        {
            "data": {"inputs": [str(source)], "prepared_dir": str(tmp_path / "prepared")},
            "tokenizer": {"vocab_size": 400},
        },
    )
    first = prepare(recipe, log=lambda *_: None)
    (tmp_path / "run").mkdir()
    record_run(first, tmp_path / "run")
    record_run(first, tmp_path / "run")  # once
    recipe.tokenizer.path = str(tmp_path / "kept")
    shutil.copytree(first / "tokenizer", recipe.tokenizer.path)
    with open(source, "a", encoding="utf-8") as handle:
        handle.write("One more line.\n")
    again = prepare(recipe, log=lambda *_: None)
    assert read_meta(again)["n_sentences"] > 0 and dependent_runs(again) == [str((tmp_path / "run").resolve())]


def test_default_prepared_directories_are_keyed_by_their_tokenizer(tmp_path):
    from helpers import REPO
    from spanlm.pretrain.recipe import load_recipe

    default = load_recipe(REPO / "configs/pretrain/spanbert.yaml").data.prepared_dir
    assert default == "runs/prepared/english-wordpiece-8000"
    assert load_recipe(REPO / "configs/prepare/english.yaml").data.prepared_dir == default  # prepared once, shared
    assert (
        load_recipe(
            REPO / "configs/pretrain/spanbert.yaml", ["tokenizer.kind=bpe", "tokenizer.lowercase=false"]
        ).data.prepared_dir
        == "runs/prepared/english-bpe-8000-cased"
    )
    tokenizer = tmp_path / "bert-base-uncased"
    tokenizer.mkdir()
    (tokenizer / "vocab.txt").write_text("[PAD]\n[UNK]\n", encoding="utf-8")
    loaded = load_recipe(REPO / "configs/pretrain/spanbert.yaml", [f"tokenizer.path={tokenizer}"]).data.prepared_dir
    assert loaded.startswith("runs/prepared/english-bert-base-uncased-") and loaded != default
    (tokenizer / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n", encoding="utf-8")  # another tokenizer, same path
    assert (
        load_recipe(REPO / "configs/pretrain/spanbert.yaml", [f"tokenizer.path={tokenizer}"]).data.prepared_dir
        != loaded
    )
    explicit = load_recipe(
        REPO / "configs/pretrain/spanbert.yaml", ["data.prepared_dir=runs/mine", "tokenizer.vocab_size=300"]
    )
    assert explicit.data.prepared_dir == "runs/mine"  # a directory named outright is used as named


@pytest.mark.slow
def test_the_readme_commands_in_sequence_leave_every_run_exportable_and_resumable(tmp_path, monkeypatch):
    """The issue's scenario: a default recipe, continued pretraining with tokenizer.path=…, the default
    recipe again with another objective — afterwards each earlier run still exports and resumes."""
    from helpers import REPO

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(REPO / "data")
    runs = {
        "spanbert": ["configs/pretrain/spanbert.yaml", *TINY_RUN, "data.max_len=64", "train.output_dir=runs/spanbert"],
        "continued": [
            "configs/pretrain/spanbert.yaml",
            *TINY_RUN,
            "data.max_len=64",
            "model.path=runs/export/spanbert",
            "model.family=bert",
            "tokenizer.path=runs/export/spanbert",
            "train.output_dir=runs/continued",
        ],
        "mlm": ["configs/pretrain/mlm.yaml", *TINY_RUN, "data.max_len=64", "train.output_dir=runs/mlm"],
    }
    for name, command in runs.items():
        command[0] = str(REPO / command[0])
        assert main(["pretrain", *command]) == 0, name
        if name == "spanbert":
            assert main(["export", "runs/spanbert", "--out", "runs/export/spanbert"]) == 0
    for name, command in runs.items():
        assert main(["export", f"runs/{name}", "--out", f"runs/export/{name}-again"]) == 0, name
        assert main(["pretrain", *command, "train.max_steps=3", "--resume", "auto"]) == 0, name
        assert ckpt.step_of(ckpt.latest_checkpoint(Path(f"runs/{name}"))) == 3
    # The default recipes share one corpus, the continued run has its own.
    assert sorted(p.name for p in Path("runs/prepared").iterdir()) == sorted(
        ["english-wordpiece-2000", Path(load_prepared_dir(runs["continued"])).name]
    )


def load_prepared_dir(command: list[str]) -> str:
    from spanlm.pretrain.recipe import load_recipe

    return load_recipe(command[0], command[1:]).data.prepared_dir


@pytest.mark.slow
def test_a_macbert_run_keeps_its_similar_word_table_and_exports_after_a_forced_prepare(tmp_path):
    prepared, run = tmp_path / "prepared", tmp_path / "run"
    recipe = tiny_recipe(tmp_path, "macbert", prepared, run)
    macbert = [
        "objective.name=macbert",
        "masking.scheme=ngram",
        "data.similar_words=word2vec",
        "data.similar_words_min_count=2",
    ]
    assert main(["pretrain", str(recipe), *macbert]) == 0
    kept = run / "tokenizers" / read_meta(prepared)["tokenizer_fingerprint"]
    assert (kept / "similar_words.npz").read_bytes() == (prepared / "similar_words.npz").read_bytes()
    assert main(["prepare", str(recipe), "tokenizer.vocab_size=300", "--force"]) == 0  # no similar-word table now
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
