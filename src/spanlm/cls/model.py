"""The classification model: an encoder and its family's sequence-classification head, and the directory it exports.

``spanlm cls train`` exports ``<run>/model/``. For an encoder that is a stock transformers model (BERT, RoBERTa,
ELECTRA, DeBERTa-V2/V3, ModernBERT, EuroBERT) that directory is the family's ``*ForSequenceClassification``
checkpoint — config.json with ``id2label`` / ``label2id`` and ``problem_type``, the head in the stock class's names
in model.safetensors — so ``AutoModelForSequenceClassification`` and ``pipeline("text-classification")`` load it;
beside it ``recipe.yaml`` and ``cls.json`` (the labels and problem), which :class:`spanlm.cls.predict.ClsModel`
reads. A CharBERT encoder exports its own directory with the head in ``cls_head.safetensors`` (its modeling file
has no sequence-classification class: spanlm loads it).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from spanlm.cls.head import build_head, classification_config
from spanlm.errors import InputError
from spanlm.files import check_safetensors, read_metadata
from spanlm.finetune.model import TOKENIZER_FINGERPRINT_FILE, EncoderTask

HEAD_FILE, RECIPE_FILE, SETTINGS_FILE = "cls_head.safetensors", "recipe.yaml", "cls.json"
WEIGHTS_FILE = "model.safetensors"


class ClsObjective(EncoderTask):
    """Encoder + classification head. ``labels`` None: regression (one output, mean squared error), else
    cross-entropy over the labels. ``forward`` returns the loss when the batch has ``labels`` and the logits
    otherwise."""

    def __init__(self, encoder, labels: list[str] | None, pooling: str = "cls"):
        super().__init__()
        self.encoder = encoder
        self.labels = labels
        self.pooling = pooling
        self.head_file = HEAD_FILE
        self.head = build_head(encoder, labels, pooling)

    @property
    def stock(self) -> bool:
        """Whether the export is the family's transformers ``*ForSequenceClassification``."""
        return self.head.stock

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = self.encoder(batch)  # (B, L, H); one sequence per row, packed or not
        logits = self.head(hidden, batch["sequence_mask"])  # (B, labels)
        if "labels" not in batch:
            return {"logits": logits}
        if self.labels is None:
            return {"loss": F.mse_loss(logits.float().squeeze(-1), batch["labels"].float())}
        return {"loss": F.cross_entropy(logits.float(), batch["labels"])}

    def export(self, directory: Path, tokenizer=None) -> None:
        if not self.stock:
            super().export(directory, tokenizer)
            return
        from transformers import AutoModelForSequenceClassification

        from spanlm.data.tokenizer import save_tokenizer, tokenizer_fingerprint

        encoder_model = self.encoder.model
        config = classification_config(encoder_model.config, self.labels, self.pooling)
        config.architectures = None
        stock = AutoModelForSequenceClassification.from_config(config)
        prefix = stock.base_model_prefix
        state = {f"{prefix}.{k}": v for k, v in encoder_model.state_dict().items()}
        names = self.head.export_names()
        state.update({names[k]: v for k, v in self.head.state_dict().items()})
        # Into the stock class first: a name that is not the stock class's fails here, not in the user's hands.
        missing, unexpected = stock.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise RuntimeError(f"the head does not fit {type(stock).__name__}: {missing[:3]} {unexpected[:3]}")
        stock.save_pretrained(str(directory))
        save_tokenizer(self.encoder.tokenizer, directory)
        (directory / TOKENIZER_FINGERPRINT_FILE).write_text(
            tokenizer_fingerprint(self.encoder.tokenizer) + "\n", encoding="utf-8"
        )


def head_state(directory: Path, objective: ClsObjective) -> dict[str, torch.Tensor]:
    """The head's weights of an exported model: from the stock names in model.safetensors, or spanlm's head file."""
    from safetensors.torch import load_file

    if not objective.stock:
        path = directory / HEAD_FILE
        check_safetensors(path)
        return load_file(str(path))
    path = directory / WEIGHTS_FILE
    check_safetensors(path)
    stored = load_file(str(path))
    state = {}
    for name, stock_name in objective.head.export_names().items():
        if stock_name not in stored:
            raise InputError(f"{path}: no '{stock_name}': not a sequence-classification model's weights")
        state[name] = stored[stock_name]
    return state


def write_settings(directory: Path, labels: list[str] | None, stock: bool, pooling: str) -> None:
    settings = {
        "problem": "regression" if labels is None else "classification",
        "labels": labels,
        "stock": stock,
        "pooling": pooling,
    }
    (directory / SETTINGS_FILE).write_text(json.dumps(settings, ensure_ascii=False) + "\n", encoding="utf-8")


def read_settings(path: Path) -> tuple[list[str] | None, str]:
    """The label order of an exported model (None: regression) and its head's pooling (a model exported before
    ``cls.pooling`` read [CLS])."""
    settings = read_metadata(path, "restore the cls.json exported with the model")
    problem, labels, pooling = settings.get("problem"), settings.get("labels"), settings.get("pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise InputError(f"{path}: 'pooling' must be cls or mean, got {pooling!r}")
    if problem == "regression" and labels is None:
        return None, pooling
    if problem != "classification" or not (
        isinstance(labels, list) and labels and all(isinstance(label, str) for label in labels)
    ):
        raise InputError(f"{path}: 'problem' must be classification (with a list of 'labels') or regression")
    return labels, pooling
