"""On a GPU (``pytest -m gpu``; skipped without CUDA): per objective one bf16 training step, a save → resume
round trip that matches the uninterrupted run, and export; NER, QA and cls one fine-tuning step each.

The round trip matches to a tolerance, not bit for bit: CUDA's embedding and index_add backward passes
add with atomics, in an order that may differ between runs. ``SPANLM_GPU_TESTS_DEVICE=cpu`` runs the
same tests on the CPU: a dry run of this file's own code where no GPU is at hand (``make gpu-check``
does not set it).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import EMBEDDED_INPUTS, REPO, write_wnut_recipe
from spanlm.config import load_config
from spanlm.pretrain.export import export_checkpoint
from spanlm.pretrain.recipe import load_recipe
from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from spanlm.train.metrics import read_metrics

DEVICE = os.environ.get("SPANLM_GPU_TESTS_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MAX_LEN = 32
QUIET = {"log": lambda *_: None}
# (configs/pretrain recipe, its overrides): every objective, ELECTRA with each sharing and the SBO generator
CASES = {
    "mlm": ("mlm", []),
    "wwm": ("wwm", []),
    "spanbert": ("spanbert", []),
    "macbert": ("macbert", ["data.similar_words_min_count=2"]),
    "electra-es": ("electra", []),
    "electra-gdes": ("deberta_v3_gdes", []),
    "electra-sbo-generator": ("electra", ["objective.electra.generator_head=sbo", "masking.scheme=span"]),
    "charbert": ("charbert", [f"masking.noise.max_len={MAX_LEN}", "objective.charbert.char_embedding_size=32"]),
}


def recipe(name: str, prepared: Path, output_dir: Path, overrides: list[str], **train):
    """A shipped pretraining recipe shrunk to a tiny model, on ``DEVICE`` in bf16."""
    return load_recipe(
        REPO / "configs" / "pretrain" / f"{name}.yaml",
        [
            f"data.inputs={json.dumps(EMBEDDED_INPUTS)}",
            f"data.prepared_dir={prepared}",
            f"data.max_len={MAX_LEN}",
            "tokenizer.vocab_size=2000",
            "model.hidden_size=64",
            "model.num_heads=2",
            "model.intermediate_size=128",
            "model.num_layers=2",
            f"model.max_position_embeddings={MAX_LEN}",
            f"train.output_dir={output_dir}",
            "train.max_steps=2",
            "train.save_every=1",
            "train.keep_last=2",
            "train.batch_size=4",
            "train.num_workers=0",
            "train.eval_blocks=4",
            "train.eval_every=0",
            "train.log_every=1",
            "train.warmup_steps=1",
            f"train.device={DEVICE}",
            "train.precision=bf16",
            "logging.report_to=[]",
            "logging.progress=false",
            *overrides,
            *(f"train.{key}={value}" for key, value in train.items()),
        ],
    )


def train_losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run) if r["kind"] == "train"}


@pytest.mark.parametrize(
    "name, overrides",
    # the flash kernel's path (packed), CharBERT's recurrent layers inside the graph (a GPU's cuDNN GRU); ModernBERT
    # and the others compile once in the bench's cli-* arms
    [("spanbert", []), ("charbert", CASES["charbert"][1])],
)
@pytest.mark.skipif(DEVICE == "cpu", reason="on the CPU: tests/train/test_device_agnostic.py's compiled runs")
def test_a_compiled_run_compiles_once_and_says_so(name, overrides, embedded_prepared, tmp_path, monkeypatch):
    """train.compile on the device: eight steps of batches of changing lengths (the packed stream's width, its
    longest segment: the flash kernel's host int; the number of targets) and an evaluation compile nothing after
    the first step (dynamo's graph capture, with its aot_eager backend: the inductor's code generation is the
    bench's), and the run's records say so: ``recompiles`` 0, ``first_step_s``, ``mfu`` and ``data_wait``."""
    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: compile(function, backend="aot_eager", **kwargs))
    torch._dynamo.reset()
    run = tmp_path / "run"
    pretrain(
        recipe(name, embedded_prepared, run, overrides, compile="true", max_steps=8, eval_every=4, log_every=4),
        **QUIET,
    )
    records = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert [r["step"] for r in records] == [4, 8]
    assert [r["recompiles"] for r in records] == [0, 0] and records[0]["first_step_s"] > 0
    assert all(0 < r["mfu"] < 1 and 0 <= r["data_wait"] < 1 for r in records)


@pytest.mark.parametrize("case", list(CASES))
def test_one_bf16_step_a_matching_resume_and_export(case, embedded_prepared, tmp_path):
    name, overrides = CASES[case]
    if name == "macbert":  # its similar-word table is trained with gensim, an optional dependency
        pytest.importorskip("gensim", reason="MacBERT's similar words need gensim (pip install 'spanlm[gensim]')")
    prepared = (
        tmp_path / "prepared" if name == "macbert" else embedded_prepared
    )  # macbert keeps its similar words there
    pretrain(recipe(name, prepared, tmp_path / "full", overrides), **QUIET)
    pretrain(
        recipe(name, prepared, tmp_path / "resumed", overrides),
        resume=str(ckpt.step_dir(tmp_path / "full", 1)),
        **QUIET,
    )
    full, resumed = train_losses(tmp_path / "full"), train_losses(tmp_path / "resumed")
    assert sorted(full) == [1, 2] and sorted(resumed) == [2] and all(math.isfinite(v) for v in full.values())
    assert resumed[2] == pytest.approx(full[2], rel=1e-3)
    a = load_file(str(ckpt.step_dir(tmp_path / "full", 2) / "model.safetensors"))
    b = load_file(str(ckpt.step_dir(tmp_path / "resumed", 2) / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4, msg=key)
    exported = export_checkpoint(ckpt.step_dir(tmp_path / "full", 2), tmp_path / "export")
    assert (exported / "config.json").is_file() or (exported / "config.yaml").is_file()


def test_ner_one_step(tiny_encoder_dir, tmp_path):
    from spanlm.ner.config import NerRecipe
    from spanlm.ner.task import train_ner

    path = write_wnut_recipe(tiny_encoder_dir, tmp_path / "run", steps=1)
    run, _ = train_ner(
        load_config(path, [f"train.device={DEVICE}", "train.precision=bf16", "train.eval_every=0"], cls=NerRecipe),
        **QUIET,
    )
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == [1]
    assert all(math.isfinite(r["loss"]) for r in read_metrics(run) if r["kind"] == "train")


def one_bf16_step(output_dir: Path, batch_size: int) -> dict:
    """The train and logging sections of a fine-tuning recipe that trains one bf16 step on DEVICE."""
    return {
        "train": {
            "output_dir": str(output_dir),
            "max_steps": 1,
            "batch_size": batch_size,
            "warmup_steps": 0,
            "eval_every": 0,
            "save_every": 1000,
            "log_every": 1,
            "num_workers": 0,
            "device": DEVICE,
            "precision": "bf16",
        },
        "logging": {"report_to": [], "progress": False},
    }


def test_qa_one_step(tiny_encoder_dir, tmp_path):
    from spanlm.config import from_dict
    from spanlm.qa.config import QARecipe
    from spanlm.qa.task import train_qa

    data = REPO / "tests" / "fixtures" / "qa" / "squad_v2_sample.json"
    recipe = from_dict(
        QARecipe,
        {
            "seed": 0,
            "model": {"path": str(tiny_encoder_dir)},
            "data": {"train": str(data), "dev": str(data), "max_length": 128, "doc_stride": 64, "max_query_length": 32},
            **one_bf16_step(tmp_path / "run", batch_size=4),
        },
    )
    run, _ = train_qa(recipe, **QUIET)
    records = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert [r["step"] for r in records] == [1] and math.isfinite(records[0]["loss"])


def test_cls_one_step(tiny_encoder_dir, tmp_path):
    from spanlm.cls.config import ClsRecipe
    from spanlm.cls.task import train_cls
    from spanlm.config import from_dict

    sst2 = REPO / "data" / "cls" / "sst2"
    recipe = from_dict(
        ClsRecipe,
        {
            "seed": 0,
            "model": {"path": str(tiny_encoder_dir)},
            "data": {"train": str(sst2 / "dev.tsv"), "dev": str(sst2 / "dev.tsv"), "task": "sst2", "max_length": 64},
            **one_bf16_step(tmp_path / "run", batch_size=8),
        },
    )
    run, result = train_cls(recipe, **QUIET)
    records = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert [r["step"] for r in records] == [1] and math.isfinite(records[0]["loss"])
    assert 0 <= result["accuracy"] <= 100
