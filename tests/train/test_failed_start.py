"""A run that is refused or fails before its first step touches nothing of its inputs: the prepared corpus it shares
with other runs gets the run's line in runs.txt, and a refreshed fingerprint, only from a run that starts."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from helpers import EMBEDDED_CORPUS
from spanlm.data.prepare import dependent_runs
from spanlm.errors import SpanlmError
from spanlm.pretrain.run import pretrain
from toy_objective import toy_recipe

QUIET = {"log": lambda *_: None}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (new ones too) by its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


@pytest.fixture
def corpus(prepared, tmp_path) -> Path:
    """A copy of the session's prepared corpus, its input beside it (so a test may touch it)."""
    copy = tmp_path / "prepared"
    shutil.copytree(prepared, copy)
    (copy / "runs.txt").unlink(missing_ok=True)
    return copy


def recipe(corpus: Path, run: Path, **train):
    """Two steps of the toy objective on ``corpus``, its input a copy beside it."""
    made = toy_recipe(corpus, run, **{"max_steps": 2, "save_every": 1, **train})
    made.data.inputs = [str(corpus.parent / "alice.txt")]
    if not Path(made.data.inputs[0]).exists():
        shutil.copy2(EMBEDDED_CORPUS / "alice_in_wonderland.txt", made.data.inputs[0])
    return made


def test_a_run_that_starts_is_recorded_in_its_corpus(corpus, tmp_path):
    run = pretrain(recipe(corpus, tmp_path / "run"), **QUIET)
    assert dependent_runs(corpus) == [str(run.resolve())]


def test_a_corpus_whose_ids_are_cut_short_is_refused_and_left_as_it_was(corpus, tmp_path):
    recipe_ = recipe(corpus, tmp_path / "run")
    pretrain(recipe_, **QUIET)  # its meta.json now fingerprints the copied input
    shutil.rmtree(tmp_path / "run")
    (corpus / "runs.txt").unlink()
    ids = corpus / "ids.npy"
    ids.write_bytes(ids.read_bytes()[: ids.stat().st_size // 2])
    before = snapshot(corpus)
    with pytest.raises(SpanlmError, match="ids.npy"):
        pretrain(recipe(corpus, tmp_path / "run"), **QUIET)
    assert snapshot(corpus) == before  # no runs.txt line for a run that never trained


def test_a_refused_resume_leaves_the_corpus_as_it_was(corpus, tmp_path):
    run = pretrain(recipe(corpus, tmp_path / "run"), **QUIET)
    (corpus / "runs.txt").unlink()
    before = snapshot(corpus)
    with pytest.raises(SpanlmError, match="changed settings"):  # refused once its checkpoint is read
        pretrain(recipe(corpus, run, max_steps=3, lr=0.5), resume="auto", **QUIET)
    assert snapshot(corpus) == before  # no runs.txt line for a run that was refused


def test_a_touched_input_is_refingerprinted_by_the_run_that_starts_not_by_one_that_fails(corpus, tmp_path):
    run = pretrain(recipe(corpus, tmp_path / "run"), **QUIET)
    os.utime(recipe(corpus, run).data.inputs[0], (1_000_000_000, 1_000_000_000))  # the same bytes: a stale fingerprint
    before = snapshot(corpus)
    with pytest.raises(SpanlmError, match="changed settings"):  # prepared (reused as it is), then refused
        pretrain(recipe(corpus, run, max_steps=3, lr=0.5), resume="auto", **QUIET)
    assert snapshot(corpus) == before
    pretrain(recipe(corpus, tmp_path / "other"), **QUIET)
    after = snapshot(corpus)
    assert after["meta.json"] != before["meta.json"] and after["ids.npy"] == before["ids.npy"]
    assert str((tmp_path / "other").resolve()) in dependent_runs(corpus)


def test_a_run_resumed_from_its_own_config_yaml_reads_it_in_its_directory(prepared, tmp_path, capsys):
    """The one exception: `spanlm pretrain RUN/config.yaml --resume auto` (what the run recorded, compared with the
    checkpoint's by the resume check); the same file starting a new run into RUN is refused."""
    from spanlm.cli import main

    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=1), **QUIET)
    assert main(["pretrain", str(run / "config.yaml"), "train.max_steps=2", "--resume", "auto"]) == 0
    capsys.readouterr()
    assert main(["pretrain", str(run / "config.yaml"), "train.max_steps=2"]) == 2
    assert "train.output_dir holds the input" in capsys.readouterr().err
