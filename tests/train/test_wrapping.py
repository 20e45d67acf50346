"""How the loop wraps the objective: per-layer activation checkpointing and FSDP2's precision policy
(DDP's and FSDP2's runs under torchrun: tests/train/test_distributed.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

import toy_objective
from spanlm.errors import ConfigError
from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from spanlm.train.objective import Objective
from spanlm.train.parallel import checkpoint_layers, fsdp_precision
from toy_objective import losses, toy_recipe


def _toy_batch(generator: torch.Generator) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(5, 100, (4, 16), generator=generator)
    target_index = torch.arange(0, 64, 3)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "target_index": target_index,
        "target_labels": input_ids.flatten()[target_index],
    }


def test_checkpointed_layers_run_twice_and_give_the_same_gradients():
    torch.manual_seed(0)
    plain = toy_objective.Toy(vocab_size=100, mask_id=4)
    checkpointed = copy.deepcopy(plain)
    checkpoint_layers(checkpointed)
    assert [n for n, _ in checkpointed.named_parameters()] == [n for n, _ in plain.named_parameters()]
    calls = []
    checkpointed.layers[0][0].register_forward_hook(lambda *_: calls.append(1))
    batch = _toy_batch(torch.Generator().manual_seed(1))
    for model in (plain, checkpointed):
        torch.manual_seed(2)  # the same dropout draws
        model(batch)["loss"].backward()
    assert len(calls) == 2  # the forward, and its recomputation in the backward pass
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        assert torch.equal(a.grad, b.grad), name


def test_a_run_with_activation_checkpointing_trains_the_same_weights(prepared, tmp_path):
    quiet = {"log": lambda *_: None}
    pretrain(toy_recipe(prepared, tmp_path / "plain", max_steps=3), **quiet)
    pretrain(toy_recipe(prepared, tmp_path / "checkpointed", max_steps=3, activation_checkpointing=True), **quiet)
    assert losses(tmp_path / "plain") == losses(tmp_path / "checkpointed")
    a, b = (load_file(str(ckpt.step_dir(tmp_path / run, 3) / "model.safetensors")) for run in ("plain", "checkpointed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_objective_without_layers_cannot_be_checkpointed():
    class Layerless(Objective):
        def forward(self, batch):
            return {}

    with pytest.raises(ConfigError, match="train.activation_checkpointing: objective Layerless names no layers"):
        checkpoint_layers(Layerless())


def test_fsdp_gathers_bf16_and_reduces_fp32_under_bf16():
    bf16, fp32 = fsdp_precision("bf16"), fsdp_precision("fp32")
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert (fp32.param_dtype, fp32.reduce_dtype) == (None, None)  # the parameters' own dtype throughout
