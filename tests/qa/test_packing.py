"""Packed QA windows (one stream per batch, spanlm.data.packing; question and context segments kept) give the padded
windows' loss, gradients and best spans."""

from __future__ import annotations

import numpy as np
import torch

from helpers import forbid_deriving_segment_bounds
from spanlm.models.encoder import load_encoder
from spanlm.models.hf_model import EncoderConfig
from spanlm.models.modeling_charbert import segment_bounds
from spanlm.qa.data import read_squad
from spanlm.qa.model import QAObjective
from spanlm.qa.predict import window_spans
from spanlm.qa.windows import make_windows

MAX_LENGTH = 64


def loss_and_gradients(objective, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    objective.zero_grad(set_to_none=True)
    loss = objective(batch)["loss"]
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in objective.named_parameters() if p.grad is not None}


def test_packed_windows_train_and_predict_as_padded_ones(qa_encoder_dir, qa_fixtures, monkeypatch):
    examples, _ = read_squad(qa_fixtures / "squad_v2_sample.json")
    torch.manual_seed(0)
    objective = QAObjective(load_encoder(EncoderConfig(path=str(qa_encoder_dir), dropout=0.0)))
    windows = make_windows(objective.encoder.tokenizer, examples, MAX_LENGTH, 16, 16)
    indices = np.arange(len(windows))
    padded = windows.batch(indices)
    windows.packed = True
    packed = windows.batch(indices)
    assert packed["input_ids"].shape == (1, padded["attention_mask"].sum())  # one stream, no padding
    assert (
        packed["token_type_ids"].sum() == padded["token_type_ids"].sum() > 0
    )  # context segments moved with their tokens
    # The batch carries the segments the model would derive from its positions; it never has to.
    assert torch.equal(packed["cu_seq_lens"], segment_bounds(packed["position_ids"], packed["attention_mask"]))
    forbid_deriving_segment_bounds(monkeypatch)
    padded_loss, padded_grads = loss_and_gradients(objective, padded)
    packed_loss, packed_grads = loss_and_gradients(objective, packed)
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-5, atol=1e-6)
    for name, grad in padded_grads.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-3, atol=max(1e-3 * scale, 1e-6))

    objective.eval()
    with torch.no_grad():
        packed_spans = window_spans(objective, windows, 30, 4, torch.device("cpu"))
        windows.packed = False
        padded_spans = window_spans(objective, windows, 30, 4, torch.device("cpu"))
    for packed_part, padded_part in zip(packed_spans, padded_spans):
        np.testing.assert_allclose(packed_part, padded_part, rtol=1e-4, atol=1e-5)
