"""MLM, whole-word MLM, SpanBERT and MacBERT end to end: learning, export, continued pretraining."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import EMBEDDED_CORPUS
from spanlm.config import from_dict
from spanlm.data.blocks import BlockDataset, collate_blocks
from spanlm.data.prepare import prepare
from spanlm.data.shards import PreparedCorpus
from spanlm.errors import ConfigError, InputError
from spanlm.objectives import build_objective
from spanlm.pretrain.recipe import Recipe

OBJECTIVES = {"mlm": "mlm", "wwm": "wwm", "spanbert": "span", "macbert": "ngram"}
TINY_MODEL = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 64,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("objectives") / "prepared"
    recipe = tiny_recipe(out, "mlm", Path("unused"))
    return prepare(recipe, log=lambda *_: None)


def tiny_recipe(prepared: Path, objective: str, output_dir: Path, **model) -> Recipe:
    return from_dict(
        Recipe,
        {
            "data": {
                "inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")],
                "prepared_dir": str(prepared),
                "max_len": 48,
                "similar_words": "word2vec",
                "similar_words_min_count": 2,
            },
            "tokenizer": {"vocab_size": 600},
            "model": {**TINY_MODEL, **model},
            "masking": {"scheme": OBJECTIVES.get(objective, "mlm")},
            "objective": {"name": objective},
            "train": {
                "output_dir": str(output_dir),
                "max_steps": 6,
                "batch_size": 4,
                "num_workers": 0,
                "eval_every": 0,
                "eval_blocks": 4,
                "log_every": 2,
                "warmup_steps": 1,
            },
            "logging": {"report_to": [], "progress": False},
        },
    )


def fixed_batch(objective, prepared: Path, n_blocks: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    corpus = PreparedCorpus(prepared)
    blocks = BlockDataset(corpus, 48)
    batch = collate_blocks([blocks[i] for i in range(n_blocks)], corpus.special_ids["pad"])
    return objective.masker(batch, np.random.default_rng(seed)).to_torch()


@pytest.mark.parametrize("name", list(OBJECTIVES))
@pytest.mark.slow
def test_each_objective_overfits_one_batch(prepared, tmp_path, name):
    torch.manual_seed(0)
    objective = build_objective(tiny_recipe(prepared, name, tmp_path), PreparedCorpus(prepared))
    batch = fixed_batch(objective, prepared, n_blocks=2)
    optimizer = torch.optim.AdamW(objective.parameters(), lr=3e-3)
    first = None
    for step in range(300):
        output = objective(batch)
        first = first if first is not None else float(output["loss"].detach())
        optimizer.zero_grad()
        output["loss"].backward()
        optimizer.step()
        if float(output["loss"].detach()) < 0.5:
            break
    final = float(output["loss"].detach())
    assert final < 0.5 < first, (name, step, final)
    if name == "spanbert":
        assert float(output["sbo_loss"]) < 0.5 and int(output["n_sbo"]) > 0


def test_objective_and_masking_scheme_must_agree(prepared, tmp_path):
    recipe = tiny_recipe(prepared, "spanbert", tmp_path)
    recipe.masking.scheme = "mlm"
    with pytest.raises(ConfigError, match="spanbert.*needs masking.scheme span"):
        build_objective(recipe, PreparedCorpus(prepared))
    recipe.objective.name = "nonsense"
    with pytest.raises(ConfigError, match="unknown objective 'nonsense'"):
        build_objective(recipe, PreparedCorpus(prepared))


def test_an_objective_added_as_one_module_is_built_and_checked_by_the_registry(prepared, tmp_path):
    # tests/toy_objective.py is one module with a registered builder, nothing else: the registry builds it
    # from a recipe and refuses, for it too, a masking scheme it did not declare.
    from toy_objective import Toy, toy_recipe

    recipe = toy_recipe(prepared, tmp_path / "toy")
    assert isinstance(build_objective(recipe, PreparedCorpus(prepared)), Toy)
    recipe.masking.scheme = "span"
    with pytest.raises(
        ConfigError, match=r"objective 'toy' needs masking.scheme mlm \(its own token masker\), not 'span'"
    ):
        build_objective(recipe, PreparedCorpus(prepared))


@pytest.mark.parametrize("name", ["spanbert", "mlm"])
def test_continued_pretraining_starts_from_the_exported_weights(prepared, tmp_path, name):
    """Export → model.path: the rebuilt objective (backbone and heads) gives the same loss on a batch."""
    corpus = PreparedCorpus(prepared)
    torch.manual_seed(0)
    objective = build_objective(tiny_recipe(prepared, name, tmp_path), corpus).eval()
    with torch.no_grad():  # move away from the initialisation so equality is not a coincidence of seeds
        for parameter in objective.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    objective.export(tmp_path / "export", corpus.tokenizer)
    torch.manual_seed(123)  # a different init: only loading can make the losses equal
    reloaded = build_objective(tiny_recipe(prepared, name, tmp_path, path=str(tmp_path / "export")), corpus).eval()
    batch = fixed_batch(objective, prepared)
    with torch.no_grad():
        expected, got = objective(batch)["loss"], reloaded(batch)["loss"]
    assert torch.allclose(expected, got, atol=1e-5), (float(expected), float(got))


def test_vocabulary_mismatch_is_a_clear_error(prepared, tmp_path):
    small = tmp_path / "small"
    small_prepared = prepare(
        from_dict(
            Recipe,
            {
                "data": {"inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")], "prepared_dir": str(small)},
                "tokenizer": {"vocab_size": 200},
            },
        ),
        log=lambda *_: None,
    )
    corpus = PreparedCorpus(small_prepared)
    build_objective(tiny_recipe(small_prepared, "mlm", tmp_path), corpus).backbone.save_pretrained(
        str(tmp_path / "ckpt")
    )
    with pytest.raises(InputError, match="vocab"):
        build_objective(tiny_recipe(prepared, "mlm", tmp_path, path=str(tmp_path / "ckpt")), PreparedCorpus(prepared))


@pytest.mark.slow
def test_export_loads_in_transformers_with_the_same_hidden_states(prepared, tmp_path, capsys):
    """pretrain → `spanlm export` → AutoModel / AutoTokenizer give the trained backbone's hidden states."""
    import json

    from transformers import AutoModel, AutoTokenizer

    from spanlm.cli import main
    from spanlm.config import save_config
    from spanlm.train.checkpoint import latest_checkpoint, load_objective_weights

    recipe = tiny_recipe(prepared, "spanbert", tmp_path / "run")
    save_config(recipe, tmp_path / "recipe.yaml")
    assert main(["pretrain", str(tmp_path / "recipe.yaml")]) == 0
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["exported"] == str(tmp_path / "hf")

    trained = build_objective(recipe, PreparedCorpus(prepared)).eval()
    load_objective_weights(trained, latest_checkpoint(tmp_path / "run") / "model.safetensors")
    model = AutoModel.from_pretrained(str(tmp_path / "hf")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    encoded = tokenizer(["Alice was beginning to get very tired.", "The Queen!"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = trained.backbone(**encoded).last_hidden_state
        got = model(**encoded).last_hidden_state
    assert torch.allclose(expected, got, atol=1e-5)
    assert (tmp_path / "hf" / "heads.safetensors").is_file() and (tmp_path / "hf" / "config.yaml").is_file()
    # truncation=True stops at what the model numbers, as with a hub checkpoint (no index error on long text).
    positions = model.config.max_position_embeddings
    assert tokenizer.model_max_length == positions
    long = tokenizer("Alice " * (2 * positions), truncation=True, return_tensors="pt")
    assert long["input_ids"].shape[1] == positions
    with torch.no_grad():
        model(**long)
    # The usual modes (not mkdtemp's 0700): an export is meant to be shared.
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "hf").stat().st_mode & 0o777 == 0o777 & ~umask
    assert (tmp_path / "hf" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_export_names_a_missing_or_unfinished_checkpoint(tmp_path, capsys):
    from spanlm.cli import main

    assert main(["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "hf")]) != 0
    assert "nowhere: no such checkpoint or run directory" in capsys.readouterr().err
    (tmp_path / "run" / "checkpoints" / "step-0000001").mkdir(parents=True)  # cut off before its marker
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) != 0
    assert "not a complete checkpoint nor a run directory with one" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
