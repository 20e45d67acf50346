"""The NER model: an encoder and a GlobalPointer head, and the files its exported directory holds.

``spanlm ner train`` exports ``<run>/model/``: the encoder (a Hugging Face directory ``AutoModel``
loads), ``ner_head.safetensors``, ``labels.json`` (the type ids' labels) and ``recipe.yaml``;
:class:`spanlm.ner.predict.NerModel` loads it back.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from spanlm.errors import InputError, read_text
from spanlm.finetune.model import EncoderTask
from spanlm.heads.global_pointer import GlobalPointer
from spanlm.heads.zlpr import global_pointer_loss
from spanlm.ner.config import NerConfig

HEAD_FILE, LABELS_FILE, RECIPE_FILE = "ner_head.safetensors", "labels.json", "recipe.yaml"


class NerObjective(EncoderTask):
    """Encoder + GlobalPointer. ``forward`` returns the ZLPR loss when the batch has ``entity_spans``
    (training, held-out loss) and the logits (B, types, L, L) otherwise (prediction)."""

    def __init__(self, encoder, n_types: int, config: NerConfig):
        super().__init__()
        self.encoder = encoder
        self.head_file = HEAD_FILE
        self.head = GlobalPointer(encoder.hidden_size, n_types, config.head)
        self.loss_config = config.loss

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = self.encoder(batch)  # (B, L, H)
        logits = self.head(hidden, batch["token_mask"])  # (B, T, L, L); special tokens and padding masked
        if "entity_spans" not in batch:
            return {"logits": logits}
        return {"loss": global_pointer_loss(logits, batch["entity_spans"], self.loss_config)}


def read_labels(path: Path) -> list[str]:
    """The type ids' labels of an exported model: a JSON list of distinct names."""
    try:
        labels = json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}") from None
    if not (isinstance(labels, list) and labels and all(isinstance(label, str) for label in labels)):
        raise InputError(f"{path}: must be a non-empty JSON list of label names, got {json.dumps(labels)[:80]}")
    if len(set(labels)) != len(labels):
        raise InputError(f"{path}: names a label twice")
    return labels
