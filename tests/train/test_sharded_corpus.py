"""Pretraining on a corpus prepared in shards: the same blocks as one directory, exact resume, a missing shard named."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
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


def test_preview_reads_the_shards_as_pretraining_does(tmp_path, capsys):
    """`spanlm preview` of a recipe with data.prepared_shards shows the shards' blocks: it prepares nothing (it
    trained a tokenizer and prepared data.prepared_dir instead)."""
    from spanlm.masking.preview import preview

    whole, recipe = sharded_recipe(tmp_path, tmp_path / "run")
    recipe.data.prepared_dir = str(tmp_path / "never")
    recipe.data.inputs = []
    lines = []
    sharded = preview(recipe, n=1, stats_blocks=8, log=lines.append)
    assert not (tmp_path / "never").exists() and not any("tokenizer" in line for line in lines)
    assert sharded == preview(whole, n=1, stats_blocks=8, log=lines.append)  # the same blocks as one directory


def test_mixed_blocks_give_each_shard_its_weights_share_and_reach_every_block_over_epochs():
    """Two shards of 49 training blocks each (blocks 5 and 60 held out) weighted 3 : 1: an epoch of 98 positions holds
    74 of the first and 24 of the second; the second's window moves on each epoch, so every one of its blocks is
    drawn within three epochs."""
    from spanlm.pretrain.batches import MixedBlocks, TrainingBlocks

    training = TrainingBlocks(100, np.array([5, 60]))
    mixed = MixedBlocks(training, np.array([0, 50]), [3.0, 1.0])
    assert len(mixed) == 98 and mixed.counts.tolist() == [74, 24]
    epochs = [mixed.at(epoch, np.arange(98)) for epoch in range(3)]
    for blocks in epochs:
        assert (blocks < 50).sum() == 74 and (blocks >= 50).sum() == 24 and not set(blocks) & {5, 60}
    second = set().union(*(set(blocks[blocks >= 50].tolist()) for blocks in epochs))
    assert second == set(range(50, 100)) - {60}  # all 49 of its blocks by the third epoch
    assert np.array_equal(mixed.at(1, np.arange(98)), epochs[1])  # a pure function of (epoch, position)


def test_a_mixture_trains_each_shard_by_its_weight(tmp_path):
    """data.shard_weights: the blocks one epoch of the loader draws come from the shards in the weights' ratio."""
    from spanlm.pretrain.run import pretraining_setup
    from spanlm.train.dist import init_distributed

    _, recipe = sharded_recipe(tmp_path, tmp_path / "run", max_steps=2)
    recipe.data.shard_weights = [1.0, 3.0]
    setup = pretraining_setup(recipe, init_distributed("cpu"), **QUIET)
    sampler = setup.loader.sampler
    blocks = np.concatenate([key[2] for key in itertools.takewhile(lambda key: key[0] == 0, iter(sampler))])
    mixed = sampler.blocks
    assert len(blocks) == len(mixed) - len(mixed) % sampler.batch_size
    boundary = mixed.training[mixed.first[1]]  # the second shard's first training block
    share = (blocks >= boundary).mean()
    assert share == pytest.approx(0.75, abs=0.05)


def test_a_mixture_resumes_its_draws(tmp_path):
    """The mixture's draws are a function of the position: a sampler restored from a state draws the next batches the
    uninterrupted one draws."""
    from spanlm.pretrain.run import pretraining_setup
    from spanlm.train.dist import init_distributed

    _, recipe = sharded_recipe(tmp_path, tmp_path / "run", max_steps=2)
    recipe.data.shard_weights = [1.0, 3.0]
    first = pretraining_setup(recipe, init_distributed("cpu"), **QUIET).loader.sampler
    keys = iter(first)
    for _ in range(3):
        next(keys)
    state, following = first.state_dict(), [next(keys) for _ in range(2)]
    again = pretraining_setup(recipe, init_distributed("cpu"), **QUIET).loader.sampler
    again.load_state_dict(state)
    restored = iter(again)
    assert all(
        np.array_equal(a[2], b[2]) and a[:2] == b[:2] for a, b in zip(following, [next(restored) for _ in range(2)])
    )


def test_a_decay_phase_adds_a_source_by_weight(tmp_path):
    """mmBERT's curriculum: the first phase trains on one source, the decay phase adds a second (each prepared on its
    own with one tokenizer) with a weight; the decay phase draws from both."""
    from spanlm.errors import ConfigError
    from spanlm.pretrain.phases import PhaseConfig, plan
    from spanlm.pretrain.run import pretraining_setup
    from spanlm.train.dist import init_distributed

    tokenizer = prepare(toy_recipe(tmp_path / "whole", tmp_path / "x"), **QUIET) / "tokenizer"
    sources = []
    for book in BOOKS:
        source = toy_recipe(tmp_path / Path(book).stem, tmp_path / "run", max_steps=4, save_every=2)
        source.data.inputs, source.tokenizer.path = [book], str(tokenizer)
        sources.append(str(prepare(source, **QUIET)))
    recipe = source
    recipe.data.prepared_shards, recipe.train.schedule = sources[:1], "wsd"
    recipe.phases = [
        PhaseConfig("pretrain", 2),
        PhaseConfig("decay", 2, set={"data.prepared_shards": sources, "data.shard_weights": [1.0, 3.0]}, decay=True),
    ]
    first, decay = (phase.recipe for phase in plan(recipe))
    assert first.data.shard_weights == [] and decay.data.shard_weights == [1.0, 3.0]
    mixed = pretraining_setup(decay, init_distributed("cpu"), **QUIET).loader.sampler.blocks
    assert mixed.counts[1] == pytest.approx(3 * mixed.counts[0], rel=0.05)
    run = pretrain(recipe, **QUIET)
    assert (run / "phase-pretrain").is_dir() and (run / "phase-decay").is_dir()
    decay.data.shard_weights = [1.0]  # one weight for two sources: refused naming both counts
    with pytest.raises(ConfigError, match="1 weights for the 2 shards"):
        pretraining_setup(decay, init_distributed("cpu"), **QUIET)


def weighed_inputs_recipe(tmp_path, weights):
    """The toy recipe over the two books as two entries of data.inputs, prepared as one corpus, weighed."""
    recipe = toy_recipe(tmp_path / "prepared", tmp_path / "run", max_steps=2)
    recipe.data.inputs, recipe.data.input_weights = BOOKS, weights
    return recipe


def test_input_weights_mix_the_inputs_of_one_prepared_corpus(tmp_path):
    """data.input_weights: the inputs of one `spanlm prepare` drawn by weight, each starting where prepare recorded
    it (the second book's first token is the first book's token count, prepared alone with the same tokenizer); a
    weight of 0 keeps an input out; changing the weights prepares nothing again."""
    from spanlm.pretrain.run import pretraining_setup
    from spanlm.train.dist import init_distributed

    recipe = weighed_inputs_recipe(tmp_path, [1.0, 3.0])
    directory = prepare(recipe, **QUIET)
    alone = toy_recipe(tmp_path / "first-alone", tmp_path / "x")
    alone.data.inputs, alone.tokenizer.path = BOOKS[:1], str(directory / "tokenizer")
    first_alone = prepare(alone, **QUIET)
    from spanlm.data.shards import PreparedCorpus

    meta, meta_alone = PreparedCorpus(directory).meta, PreparedCorpus(first_alone).meta
    assert meta["input_token_starts"] == [0, meta_alone["n_tokens"]] and meta["input_entries"] == [0, 1]

    def drawn(weights):
        recipe.data.input_weights = weights
        sampler = pretraining_setup(recipe, init_distributed("cpu"), **QUIET).loader.sampler
        blocks = np.concatenate([key[2] for key in itertools.takewhile(lambda key: key[0] == 0, iter(sampler))])
        return blocks, sampler.blocks.training[sampler.blocks.first[1]]  # the second book's first training block

    mtime = (directory / "ids.npy").stat().st_mtime_ns
    blocks, boundary = drawn([1.0, 3.0])
    assert (blocks >= boundary).mean() == pytest.approx(0.75, abs=0.05)
    blocks, boundary = drawn([1.0, 0.0])
    assert len(blocks) and (blocks < boundary).all()
    assert (directory / "ids.npy").stat().st_mtime_ns == mtime  # the corpus was reused, not prepared again


def test_a_decay_phase_weighs_in_an_input_kept_out_before(tmp_path):
    """mmBERT's decay adds its low-resource languages: the second book weighed 0 until the decay phase weighs it 1,
    from the one prepared corpus; the run trains through both phases."""
    from spanlm.pretrain.phases import PhaseConfig, plan

    recipe = weighed_inputs_recipe(tmp_path, [1.0, 0.0])
    recipe.train.schedule, recipe.train.save_every = "wsd", 2
    recipe.phases = [
        PhaseConfig("pretrain", 2),
        PhaseConfig("decay", 2, set={"data.input_weights": [1.0, 1.0]}, decay=True),
    ]
    first, decay = (phase.recipe for phase in plan(recipe))
    assert first.data.input_weights == [1.0, 0.0] and decay.data.input_weights == [1.0, 1.0]
    run = pretrain(recipe, **QUIET)
    assert (run / "phase-pretrain").is_dir() and (run / "phase-decay").is_dir()


def test_input_weights_are_checked_against_the_prepared_inputs(tmp_path):
    from spanlm.data.corpus import DataConfig
    from spanlm.errors import ConfigError, InputError
    from spanlm.pretrain.run import pretraining_setup
    from spanlm.train.dist import init_distributed

    with pytest.raises(ValueError, match="1 weights for the 2 entries of inputs"):
        DataConfig(inputs=BOOKS, input_weights=[1.0])
    with pytest.raises(ValueError, match="input_weights must be numbers ≥ 0, one of them positive"):
        DataConfig(inputs=BOOKS, input_weights=[0.0, 0.0])
    with pytest.raises(ValueError, match="a corpus read from data.prepared_shards is weighed by shard_weights"):
        DataConfig(inputs=BOOKS, input_weights=[1.0, 1.0], prepared_shards=["x"])
    recipe = weighed_inputs_recipe(tmp_path, [1.0, 3.0])
    directory = prepare(recipe, **QUIET)
    recipe.data.input_weights = [1.0, 2.0, 3.0]  # set after the check, as a phase's keys are
    with pytest.raises(ConfigError, match="3 weights for the 2 entries of data.inputs"):
        pretraining_setup(recipe, init_distributed("cpu"), **QUIET)
    import json

    meta = json.loads((directory / "meta.json").read_text())
    del meta["input_token_starts"]  # a corpus prepared by an older spanlm
    (directory / "meta.json").write_text(json.dumps(meta))
    recipe.data.input_weights = [1.0, 3.0]
    with pytest.raises(InputError, match="prepared before spanlm recorded where each input starts"):
        pretraining_setup(recipe, init_distributed("cpu"), **QUIET)
