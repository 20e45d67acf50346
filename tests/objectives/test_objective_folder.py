"""An objective added as one folder (tests/toy_span/: a span scheme with its own batch arrays, and its model),
editing no file outside it: its recipe section is typed, it trains packed and padded, resumes exactly, previews,
and masks for transformers' Trainer as a collator."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import toy_span  # registers the scheme and the objective
import yaml
from safetensors.torch import load_file
from torch import nn
from toy_span.masker import ToySpanConfig
from toy_span.objective import ToySpanObjectiveConfig

from helpers import EMBEDDED_CORPUS
from spanlm.cli import main
from spanlm.collators import IGNORE_INDEX, MaskingCollator, tokenize_words
from spanlm.config import from_dict, to_dict
from spanlm.data.blocks import BlockDataset, collate_blocks
from spanlm.data.packing import pack_masked
from spanlm.data.prepare import prepare
from spanlm.data.shards import PreparedCorpus
from spanlm.data.tokenizer import TokenizerConfig, train_tokenizer
from spanlm.errors import ConfigError
from spanlm.masking.base import MaskingConfig
from spanlm.objectives import build_objective
from spanlm.pretrain.recipe import Recipe
from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from toy_objective import losses

QUIET = {"log": lambda *_: None}
TEXT = EMBEDDED_CORPUS / "alice_in_wonderland.txt"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("folder") / "prepared"
    data = {"data": {"inputs": [str(TEXT)], "prepared_dir": str(out)}, "tokenizer": {"vocab_size": 500}}
    return prepare(from_dict(Recipe, data), log=lambda *_: None)


def recipe_data(prepared: Path, output_dir: Path, packing: bool = True, **train) -> dict:
    return {
        "seed": 0,
        "data": {"inputs": [str(TEXT)], "prepared_dir": str(prepared), "max_len": 32, "packing": packing},
        "tokenizer": {"vocab_size": 500},
        "masking": {"scheme": toy_span.NAME, toy_span.NAME: {"length": 2}},
        "objective": {"name": toy_span.NAME, toy_span.NAME: {"boundary_weight": 0.5}},
        "train": {
            "output_dir": str(output_dir),
            "max_steps": 4,
            "batch_size": 8,
            "lr": 1e-2,
            "warmup_steps": 1,
            "log_every": 1,
            "eval_every": 0,
            "save_every": 2,
            "num_workers": 0,
            "eval_blocks": 8,
            **train,
        },
        "logging": {"report_to": [], "progress": False},
    }


def test_its_recipe_section_is_read_by_its_own_dataclass(prepared, tmp_path):
    data = recipe_data(prepared, tmp_path)
    recipe = from_dict(Recipe, data)
    assert recipe.masking.section() == ToySpanConfig(length=2)
    saved = to_dict(recipe)["masking"]
    assert saved[toy_span.NAME] == {"rate": 0.15, "length": 2} and "sections" not in saved
    assert recipe.objective.section() == ToySpanObjectiveConfig(boundary_weight=0.5)
    assert to_dict(recipe)["objective"][toy_span.NAME] == {"boundary_weight": 0.5}
    assert from_dict(Recipe, to_dict(recipe)) == recipe
    with pytest.raises(ConfigError, match=r"^unknown config key 'objective.toy_span.weight' \(allowed: "):
        from_dict(Recipe, {**data, "objective": {"name": toy_span.NAME, toy_span.NAME: {"weight": 1.0}}})
    data["masking"][toy_span.NAME] = {"lenght": 2}
    with pytest.raises(ConfigError, match=r"^unknown config key 'masking.toy_span.lenght' \(allowed: "):
        from_dict(Recipe, data)
    data["masking"][toy_span.NAME] = {"length": 0}
    with pytest.raises(ConfigError, match="config section 'masking.toy_span': length must be at least 1"):
        from_dict(Recipe, data)
    with pytest.raises(ConfigError, match=r"masking.scheme must be one of .*'toy_span', got 'toy_spam'"):
        from_dict(Recipe, {"masking": {"scheme": "toy_spam"}})


def test_a_packed_batch_gives_the_padded_batch_losses(prepared, tmp_path):
    recipe = from_dict(Recipe, recipe_data(prepared, tmp_path))
    corpus = PreparedCorpus(prepared)
    torch.manual_seed(0)
    objective = build_objective(recipe, corpus).eval()
    blocks = BlockDataset(corpus, 32)
    batch = collate_blocks([blocks[i] for i in range(0, 160, 10)], corpus.special_ids["pad"])
    masked = objective.masker(batch, np.random.default_rng(0))
    packed = pack_masked(masked, corpus.special_ids["pad"])
    assert len(masked.boundary_index) > 0 and masked.packing()["boundary_index"] == "flat"
    ids, packed_ids = masked.input_ids.reshape(-1), packed.input_ids.reshape(-1)
    assert (packed_ids[packed.boundary_index] == ids[masked.boundary_index]).all()  # remapped, same tokens
    assert (ids[masked.boundary_index + 1] == objective.masker.vocabulary.mask_id).all()  # before a masked run
    with torch.no_grad():
        padded_out = objective(masked.to_torch(objective.batch_fields))
        packed_out = objective(packed.to_torch(objective.batch_fields))
    for key in ("loss", "mlm_loss", "boundary_loss"):
        torch.testing.assert_close(packed_out[key], padded_out[key])
    torch.testing.assert_close(padded_out["loss"], padded_out["mlm_loss"] + 0.5 * padded_out["boundary_loss"])


@pytest.mark.parametrize("packing", [True, False])
def test_it_trains_packed_and_padded_and_resumes_exactly(prepared, tmp_path, packing):
    full = pretrain(from_dict(Recipe, recipe_data(prepared, tmp_path / "full", packing)), **QUIET)
    saved = yaml.safe_load((full / "config.yaml").read_text(encoding="utf-8"))
    assert saved["data"]["packing"] is packing and saved["masking"][toy_span.NAME]["length"] == 2
    first = losses(full)
    assert len(first) == 4 and all(math.isfinite(loss) for loss in first.values())
    # Resumed with a DataLoader worker (the first run had none): the worker unpickles the folder's masker.
    resumed = pretrain(
        from_dict(Recipe, recipe_data(prepared, tmp_path / "resumed", packing, num_workers=1)),
        resume=str(ckpt.step_dir(full, 2)),
        **QUIET,
    )
    assert {s: v for s, v in first.items() if s > 2} == losses(resumed)
    final_full = load_file(str(ckpt.step_dir(full, 4) / "model.safetensors"))
    final_resumed = load_file(str(ckpt.step_dir(resumed, 4) / "model.safetensors"))
    assert final_full.keys() == final_resumed.keys()
    assert all(torch.equal(final_full[k], final_resumed[k]) for k in final_full)


def test_it_previews(prepared, tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_data(prepared, tmp_path / "run")), encoding="utf-8")
    assert main(["preview", str(path), "--n", "2", "--stats-blocks", "32", "--jsonl", str(tmp_path / "b.jsonl")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("legend: [M:x]") and out[0].endswith(" · x| the boundary before a run")
    shown = "\n".join(out[1:-1])
    assert "[M:" in shown and "|" in shown  # targets, and the boundaries its masker marks
    stats = yaml.safe_load(out[-1])
    assert stats["scheme"] == toy_span.NAME and stats["boundaries_per_block"] > 0
    assert stats["mean_span_tokens"] == 2.0
    first = yaml.safe_load((tmp_path / "b.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert len(first["boundary_index"]) == len(first["boundary_labels"]) > 0


class TinyMaskedLM(nn.Module):
    """A stand-in for a ``*ForMaskedLM`` that also reads the toy scheme's boundary targets."""

    def __init__(self, vocab_size: int, hidden: int = 16):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.decoder = nn.Linear(hidden, vocab_size)

    def forward(self, input_ids, attention_mask=None, labels=None, boundary_index=None, boundary_labels=None):
        logits = self.decoder(self.embedding(input_ids)).flatten(0, 1)  # (B·L, V)
        mlm = nn.functional.cross_entropy(logits, labels.flatten(), ignore_index=IGNORE_INDEX)
        boundary = nn.functional.cross_entropy(logits[boundary_index], boundary_labels)
        return {"loss": mlm + boundary}


def test_it_masks_for_transformers_trainer(tmp_path):
    import datasets
    from transformers import Trainer, TrainingArguments

    lines = [line for line in TEXT.read_text(encoding="utf-8").splitlines() if len(line.split()) > 4][:64]
    tokenizer = train_tokenizer(lines, TokenizerConfig(vocab_size=500))
    features = datasets.Dataset.from_dict({"text": lines}).map(
        tokenize_words(tokenizer, max_length=48), batched=True, remove_columns=["text"]
    )
    masking = MaskingConfig(sections={toy_span.NAME: ToySpanConfig(rate=0.3, length=2)})
    collator = MaskingCollator(tokenizer, toy_span.NAME, masking=masking, seed=0)
    rows = [features[i] for i in range(8)]
    batch = collator(rows)
    original = torch.from_numpy(collator.block_batch(rows).input_ids).flatten()
    targets = (batch["labels"] != IGNORE_INDEX).flatten()
    assert torch.equal(batch["labels"].flatten()[targets], original[targets])
    assert len(batch["boundary_index"]) > 0 and torch.equal(
        original[batch["boundary_index"] + 1], batch["boundary_labels"]
    )

    torch.manual_seed(0)
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=3,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        remove_unused_columns=False,  # the collator reads word_ids, which the model does not take
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=TinyMaskedLM(len(tokenizer)), args=arguments, train_dataset=features, data_collator=collator
    )
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert trainer.state.global_step == 3 and len(logged) == 3 and all(math.isfinite(loss) for loss in logged)


def test_the_shared_data_path_names_no_scheme_array():
    """Packing, the collator, preview and the loaders read a batch's declarations: none names a scheme's own array
    (SpanBERT's SBO, CharBERT's NLM or char inputs) in its code (docstrings may describe them)."""
    import ast

    import spanlm

    root = Path(spanlm.__file__).parent
    for module in ("data/packing.py", "collators.py", "masking/preview.py", "masking/base.py", "pretrain/batches.py"):
        tree = ast.parse((root / module).read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        names = [
            node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else node.value
            for node in ast.walk(tree)
            if isinstance(node, (ast.Attribute, ast.Name))
            or (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings)
        ]
        named = sorted({name for name in names if name.startswith(("sbo_", "nlm_", "char_", "sample_seed"))})
        assert not named, f"{module} names {named}"
