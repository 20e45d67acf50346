"""Pretraining on a corpus prepared in shards: the same blocks as one directory, exact resume, a missing shard named."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from helpers import EMBEDDED_CORPUS
from spanlm.cli import main
from spanlm.config import save_config
from spanlm.data.prepare import prepare
from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from toy_objective import losses, toy_recipe

pytestmark = pytest.mark.slow  # training runs and resumes

QUIET = {"log": lambda *_: None}
BOOKS = [str(EMBEDDED_CORPUS / name) for name in ("alice_in_wonderland.txt", "frankenstein.txt")]


def sharded_recipe(tmp_path, output_dir, **train):
    """The toy recipe over the two books, prepared as two shards with one tokenizer."""
    whole = toy_recipe(tmp_path / "whole", output_dir, **train)
    whole.data.inputs = BOOKS
    tokenizer = prepare(whole, **QUIET) / "tokenizer"
    recipe = toy_recipe(tmp_path / "shards", output_dir, **train)
    recipe.data.inputs, recipe.tokenizer.path = BOOKS, str(tokenizer)
    for index in range(2):
        prepare(recipe, shard=(index, 2), **QUIET)
    recipe.data.prepared_shards = [str(tmp_path / "shards" / "shard-*")]
    return whole, recipe


def test_a_sharded_corpus_trains_like_one_directory_and_resumes_exactly(tmp_path):
    n = 3
    whole, recipe = sharded_recipe(tmp_path, tmp_path / "full", max_steps=2 * n, save_every=n)
    full = pretrain(recipe, **QUIET)
    whole.train.output_dir = str(tmp_path / "one-directory")
    assert losses(pretrain(whole, **QUIET)) == losses(full)  # the same blocks, order and masks
    recipe.train.output_dir = str(tmp_path / "resumed")
    resumed = pretrain(recipe, resume=str(ckpt.step_dir(full, n)), **QUIET)
    assert {s: v for s, v in losses(full).items() if s > n} == losses(resumed)
    final_full = load_file(str(ckpt.step_dir(full, 2 * n) / "model.safetensors"))
    final_resumed = load_file(str(ckpt.step_dir(resumed, 2 * n) / "model.safetensors"))
    assert all(torch.equal(final_full[k], final_resumed[k]) for k in final_full)


def test_resuming_with_a_shard_missing_names_it(tmp_path, capsys):
    _, recipe = sharded_recipe(tmp_path, tmp_path / "run", max_steps=2, save_every=2)
    run = pretrain(recipe, **QUIET)
    shutil.rmtree(tmp_path / "shards" / "shard-00001-of-00002")
    save_config(recipe, tmp_path / "recipe.yaml")
    assert main(["pretrain", str(tmp_path / "recipe.yaml"), "train.max_steps=4", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("spanlm pretrain: error:")]
    assert len(errors) == 1 and "shard-00001-of-00002: shard 1/2 is missing" in errors[0] and "Traceback" not in err
    assert [p.name for p in (run / "checkpoints").iterdir()] == [ckpt.step_dir(run, 2).name]
