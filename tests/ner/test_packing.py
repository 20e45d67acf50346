"""Packed NER windows (one stream per batch, spanlm.data.packing) give the padded windows' loss, gradients and
predictions, with a BERT and a CharBERT encoder; a packed fine-tuning run trains and records its choice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from helpers import forbid_deriving_segment_bounds, tiny_charbert_export
from spanlm.config import load_config
from spanlm.models.encoder import load_encoder
from spanlm.models.hf_model import EncoderConfig
from spanlm.models.modeling_charbert import segment_bounds
from spanlm.ner.config import NerConfig, NerRecipe
from spanlm.ner.data import NerDocument, read_documents
from spanlm.ner.model import NerObjective
from spanlm.ner.predict import window_spans
from spanlm.ner.task import train_ner
from spanlm.ner.windows import make_windows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ner"

MAX_LEN = 24


@pytest.fixture(scope="module")
def charbert_dir(embedded_prepared, tmp_path_factory):
    """A tiny CharBERT export (its fine-tuning encoder reads both channels)."""
    return tiny_charbert_export(embedded_prepared, tmp_path_factory.mktemp("charbert"))


def wnut_documents() -> tuple[list[NerDocument], list[str]]:
    recipe = load_config(None, [f"data.train={FIXTURES / 'wnut_train_mini.conll'}", "data.format=conll"], cls=NerRecipe)
    documents = read_documents(FIXTURES / "wnut_train_mini.conll", recipe.data)[0][:24]
    return documents, sorted({e.label for d in documents for e in d.entities})


def objective_and_windows(encoder_dir):
    documents, labels = wnut_documents()
    torch.manual_seed(0)
    encoder = load_encoder(EncoderConfig(path=str(encoder_dir), dropout=0.0))
    objective = NerObjective(encoder, len(labels), NerConfig())
    featurizer = encoder.featurizer() if hasattr(encoder, "featurizer") else None
    windows, _ = make_windows(encoder.tokenizer, documents, labels, MAX_LEN, 8, featurizer)
    return objective, windows


def loss_and_gradients(objective, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    objective.zero_grad(set_to_none=True)
    loss = objective(batch)["loss"]
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in objective.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("encoder", ["bert", "charbert"])
def test_packed_windows_train_and_predict_as_padded_ones(tiny_encoder_dir, charbert_dir, encoder, monkeypatch):
    objective, windows = objective_and_windows(tiny_encoder_dir if encoder == "bert" else charbert_dir)
    indices = np.arange(len(windows))[:16]
    padded = windows.batch(indices)
    windows.packed = True
    packed = windows.batch(indices)
    gap = getattr(windows.featurizer, "packing_gap", 0)  # CharBERT's one pad between windows
    assert packed["input_ids"].shape == (1, padded["attention_mask"].sum() + gap * (len(indices) - 1))  # one stream
    # The batch carries the segments the model would derive from its positions; it never has to.
    bounds = segment_bounds(packed["position_ids"], packed["attention_mask"])
    assert torch.equal(packed["cu_seq_lens"], bounds) and len(bounds) == len(indices) * (1 + gap) + 1 - gap
    assert packed["max_seq_len"] == int((bounds[1:] - bounds[:-1]).max()) and type(packed["max_seq_len"]) is int
    forbid_deriving_segment_bounds(monkeypatch)
    padded_loss, padded_grads = loss_and_gradients(objective, padded)
    packed_loss, packed_grads = loss_and_gradients(objective, packed)
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-5, atol=1e-6)
    assert packed_grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-3, atol=max(1e-3 * scale, 1e-6))

    objective.eval()
    with torch.no_grad():
        found_packed = window_spans(objective, windows, np.arange(len(windows)), -5.0, 8, torch.device("cpu"))
        windows.packed = False
        found_padded = window_spans(objective, windows, np.arange(len(windows)), -5.0, 8, torch.device("cpu"))
    assert len(found_padded.score) > 0  # a low threshold: the untrained head finds spans to compare
    for field in ("document", "type", "start", "end"):
        assert (getattr(found_packed, field) == getattr(found_padded, field)).all(), field
    np.testing.assert_allclose(found_packed.score, found_padded.score, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_packed_run_with_a_token_budget_trains_and_records_its_choice(tiny_encoder_dir, tmp_path, monkeypatch):
    forbid_deriving_segment_bounds(monkeypatch)  # training, evaluation and prediction read the bounds they carry
    train = FIXTURES / "wnut_train_mini.conll"
    recipe = load_config(
        None,
        [
            f"model.path={tiny_encoder_dir}",
            f"data.train={train}",
            f"data.dev={FIXTURES / 'wnut_dev_mini.conll'}",
            "data.format=conll",
            f"data.max_len={MAX_LEN}",
            "data.stride=8",
            f"data.tokens_per_batch={4 * MAX_LEN}",
            f"train.output_dir={tmp_path / 'run'}",
            "train.max_steps=3",
            "train.eval_every=3",
            "train.num_workers=0",
            "train.device=cpu",
            "logging.report_to=[]",
            "logging.progress=false",
        ],
        cls=NerRecipe,
    )
    run_dir, result = train_ner(recipe, log=lambda *_: None)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))["data"]
    assert saved["packing"] is True and saved["tokens_per_batch"] == 4 * MAX_LEN
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["loss"]) for r in records if r["kind"] == "train") and result is not None
    assert any(r["kind"] == "eval" and "f1" in r for r in records)  # the held-out loss and the dev predictions
