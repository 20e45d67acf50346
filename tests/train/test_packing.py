"""Packed batches and token budgets in training: batches stay a pure function of their key, resume is bit-exact,
the resolved choice is recorded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from spanlm.data.blocks import BlockDataset
from spanlm.data.shards import PreparedCorpus
from spanlm.errors import ConfigError
from spanlm.pretrain.batches import BlockLengths, split_blocks
from spanlm.pretrain.recipe import Recipe
from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from spanlm.train.loader import BatchKeySampler
from toy_objective import losses, toy_recipe

QUIET = {"log": lambda *_: None}


def mlm_recipe(prepared: Path, output_dir: Path, data: dict | None = None, **train) -> Recipe:
    """A tiny BERT MLM (with dropout, so the RNG state matters) on the training tests' corpus."""
    model = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 32}
    settings = {"max_steps": 4, "batch_size": 8, "lr": 1e-3, "warmup_steps": 1, **train}
    return toy_recipe(prepared, output_dir, data, model, objective="mlm", **settings)


def saved_data_settings(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))["data"]


@pytest.mark.parametrize("accel", ["auto", "off"])  # the fused varlen attention, or SDPA per block
@pytest.mark.slow
def test_packed_resume_is_bit_exact_with_a_token_budget(prepared, tmp_path, accel):
    data = {"packing": True, "tokens_per_batch": 200}
    full = pretrain(mlm_recipe(prepared, tmp_path / "full", data, max_steps=6, save_every=3, accel=accel), **QUIET)
    resumed = pretrain(
        mlm_recipe(prepared, tmp_path / "resumed", data, max_steps=6, save_every=3, num_workers=1, accel=accel),
        resume=str(ckpt.step_dir(full, 3)),
        **QUIET,
    )
    assert {s: v for s, v in losses(full).items() if s > 3} == losses(resumed)
    final_full = load_file(str(ckpt.step_dir(full, 6) / "model.safetensors"))
    final_resumed = load_file(str(ckpt.step_dir(resumed, 6) / "model.safetensors"))
    assert all(torch.equal(final_full[k], final_resumed[k]) for k in final_full)
    assert saved_data_settings(full)["packing"] is True and saved_data_settings(full)["tokens_per_batch"] == 200


def test_auto_packing_is_resolved_and_recorded(prepared, tmp_path):
    run = pretrain(mlm_recipe(prepared, tmp_path / "run", max_steps=1), **QUIET)
    assert saved_data_settings(run)["packing"] is True  # packing measured faster on CPU (BENCHMARKS.md)
    # an objective that reads one block per row is given padded batches under auto, and refused under on
    toy = pretrain(toy_recipe(prepared, tmp_path / "toy", max_steps=1), **QUIET)
    assert saved_data_settings(toy)["packing"] is False
    with pytest.raises(ConfigError, match="data.packing: objective Toy reads one block per row only"):
        recipe = toy_recipe(prepared, tmp_path / "toy_on", max_steps=1)
        recipe.data.packing = True
        pretrain(recipe, **QUIET)


def test_a_resume_with_other_packing_is_refused(prepared, tmp_path):
    pretrain(mlm_recipe(prepared, tmp_path / "run", {"packing": True}, max_steps=2, save_every=2), **QUIET)
    with pytest.raises(Exception, match="data.packing: True → False"):
        pretrain(mlm_recipe(prepared, tmp_path / "run", {"packing": False}, max_steps=3), resume="auto", **QUIET)


@pytest.mark.parametrize("world_size", [1, 3])
def test_token_batches_stay_within_budget_and_every_rank_takes_as_many(prepared, world_size):
    blocks = BlockDataset(PreparedCorpus(prepared), 32)
    train, _ = split_blocks(len(blocks), 8, 0)
    lengths = BlockLengths(blocks)
    samplers = [
        BatchKeySampler(train, 8, seed=0, rank=rank, world_size=world_size, lengths=lengths, tokens_per_batch=100)
        for rank in range(world_size)
    ]
    for epoch in range(2):
        counts = {s.batches_per_epoch(epoch) for s in samplers}
        assert len(counts) == 1 and counts.pop() > 5
    keys = [[key for _, key in zip(range(2 * samplers[0].batches_per_epoch(0) + 3), iter(s))] for s in samplers]
    seen = set()
    for rank_keys in keys:
        for epoch, batch, indices in rank_keys:
            tokens = int(lengths[indices].sum())
            assert 100 - 32 < tokens <= 100  # greedy: the next block (at most 32 tokens) would overflow
            if epoch == 0:
                assert not seen & set(indices.tolist())  # ranks and batches never share a block within an epoch
                seen |= set(indices.tolist())
    # a pure function of the position: a sampler restored mid-epoch yields the same keys
    restored = BatchKeySampler(train, 8, seed=0, rank=0, world_size=world_size, lengths=lengths, tokens_per_batch=100)
    restored.load_state_dict({"epoch": 1, "batch": 2})
    expected = [k for k in keys[0] if (k[0], k[1]) >= (1, 2)][:3]
    got = [key for _, key in zip(range(3), iter(restored))]
    assert [(e, b, i.tolist()) for e, b, i in got] == [(e, b, i.tolist()) for e, b, i in expected]


def test_a_budget_below_the_longest_block_is_refused(prepared):
    blocks = BlockDataset(PreparedCorpus(prepared), 32)
    lengths = BlockLengths(blocks)
    with pytest.raises(ConfigError, match="tokens_per_batch 20 is less than the longest block"):
        BatchKeySampler(np.arange(len(blocks)), 8, seed=0, rank=0, world_size=1, lengths=lengths, tokens_per_batch=20)


@pytest.mark.parametrize(
    "value, message",
    [(20, "tokens_per_batch must be 0 \\(off\\) or at least max_len \\(32\\), got 20"), ("yes", "data.packing")],
)
def test_bad_packing_settings_are_one_line_config_errors(prepared, tmp_path, value, message):
    key = "tokens_per_batch" if isinstance(value, int) else "packing"
    with pytest.raises(ConfigError, match=message):
        mlm_recipe(prepared, tmp_path, {key: value})


def test_packing_true_runs_a_deberta_padded_under_compile_and_says_so(prepared, tmp_path):
    """DeBERTa-V2's packed stream is padded again inside the step; torch.compile's inductor fails on that layout on
    CUDA (a GPU run of bench/train_step_gpu.py), so under train.compile the run takes padded batches."""
    from spanlm.pretrain.run import pretraining_setup
    from spanlm.train.dist import DistEnv

    model = {"family": "deberta-v2", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    lines = []
    for compiled, packed in ((False, True), (True, False)):
        recipe = mlm_recipe(prepared, tmp_path / f"run-{compiled}", {"packing": True}, compile=compiled)
        recipe.model = dataclasses.replace(recipe.model, **model)
        pretraining_setup(recipe, DistEnv(), log=lines.append)
        assert recipe.data.packing is packed  # what config.yaml records
    said = [line for line in lines if "data.packing" in line]
    assert len(said) == 1 and "deberta-v2" in said[0] and "train.compile" in said[0]
