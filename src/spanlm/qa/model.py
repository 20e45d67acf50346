"""The QA model: an encoder and a start/end span head, and the files its exported directory holds.

``spanlm qa train`` exports ``<run>/model/``: the encoder (a Hugging Face directory), ``qa_head.safetensors``,
``recipe.yaml`` and ``qa.json`` (the tuned no-answer threshold); :class:`spanlm.qa.predict.QAModel` loads
it back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from spanlm.errors import InputError
from spanlm.finetune.model import EncoderTask
from spanlm.qa.data import load_json
from spanlm.qa.head import SpanHead, span_loss

HEAD_FILE, RECIPE_FILE, SETTINGS_FILE = "qa_head.safetensors", "recipe.yaml", "qa.json"


class QAObjective(EncoderTask):
    """Encoder + start/end head. ``forward`` returns the losses when the batch has targets
    (training, held-out loss) and the masked logits otherwise (prediction)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder
        self.head_file = HEAD_FILE
        model_config = getattr(getattr(encoder, "model", None), "config", None)
        self.head = SpanHead(encoder.hidden_size, getattr(model_config, "initializer_range", 0.02))

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = self.encoder(batch)  # (B, L, H); CharBERT's encoder returns both channels concatenated
        start, end = self.head(hidden, batch["context_mask"])
        if "start_positions" not in batch:
            return {"start_logits": start, "end_logits": end}
        loss, start_loss, end_loss = span_loss(start, end, batch["start_positions"], batch["end_positions"])
        return {"loss": loss, "start_loss": start_loss, "end_loss": end_loss}


def read_threshold(path: Path) -> float:
    """The tuned no-answer threshold of an exported model's settings file."""
    settings = load_json(path)
    threshold = settings.get("no_answer_threshold") if isinstance(settings, dict) else None
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise InputError(f"{path}: 'no_answer_threshold' must be a finite number, got {json.dumps(threshold)}")
    return float(threshold)
