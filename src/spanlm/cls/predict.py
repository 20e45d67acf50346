"""Predictions of a classification model and :class:`ClsModel`, the exported model/ directory loaded back.

``cls eval`` and ``cls predict`` load ``<run>/model/`` through :func:`spanlm.finetune.task.load_task_model`: the
encoder from the directory (a ``*ForSequenceClassification`` checkpoint is also its encoder's), the head's weights
from their stock names, the labels from cls.json.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from spanlm.cls.config import ClsRecipe
from spanlm.cls.data import Example
from spanlm.cls.features import Features, make_features
from spanlm.cls.model import RECIPE_FILE, SETTINGS_FILE, ClsObjective, head_state, read_settings
from spanlm.errors import InputError
from spanlm.finetune.batches import to_device
from spanlm.finetune.task import encoder_featurizer, load_task_model
from spanlm.models.encoder import load_encoder
from spanlm.models.hf_model import EncoderConfig
from spanlm.models.packed import resolve_packing


@torch.no_grad()
def predict_logits(model: torch.nn.Module, features: Features, batch_size: int, device: torch.device) -> np.ndarray:
    """(N, outputs) float32 logits of every example, in order (batches of similar length: less padding)."""
    order = np.argsort(features.attention_mask.sum(1), kind="stable")
    was_training = model.training
    model.eval()
    parts = []
    try:
        for first in range(0, len(order), batch_size):
            batch = to_device(features.batch(order[first : first + batch_size], targets=False), device)
            parts.append(model(batch)["logits"].float().cpu().numpy())
    finally:
        model.train(was_training)
    logits = np.empty((len(order), parts[0].shape[1]), dtype=np.float32)
    logits[order] = np.concatenate(parts)
    return logits


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


class ClsModel:
    """An exported classification model: encoder + head + labels + the recipe it was trained with."""

    def __init__(self, directory: str | Path, device: str = "auto"):
        directory = Path(directory)

        def build(directory: Path, recipe: ClsRecipe) -> ClsObjective:
            self.labels, pooling = read_settings(directory / SETTINGS_FILE)
            return ClsObjective(load_encoder(EncoderConfig(path=str(directory))), self.labels, pooling)

        loaded = load_task_model(
            directory, "cls", (RECIPE_FILE, SETTINGS_FILE), RECIPE_FILE, ClsRecipe, build, device, head_state
        )
        self.recipe, self.objective, self.device = loaded.recipe, loaded.objective, loaded.device
        self.tokenizer = loaded.tokenizer
        self.featurizer = encoder_featurizer(self.objective.encoder)

    def features(self, examples: list[Example]) -> Features:
        bare = [Example(e.text, e.text_pair, None, e.where) for e in examples]
        features = make_features(self.tokenizer, bare, self.recipe.data.max_length, self.labels, self.featurizer)
        # The recipe records data.packing as given; "auto" outside the trainer (no speed backend to decide) pads.
        features.packed = resolve_packing(self.recipe.data.packing, self.objective, packs_by_default=False)
        return features

    def logits(self, examples: list[Example], batch_size: int = 32) -> np.ndarray:
        paired = self.paired
        for example in examples:
            if paired != (example.text_pair is not None):
                raise InputError(
                    f"{example.where}: the model was trained on "
                    + ("sentence pairs: a text_pair is missing" if paired else "single sentences: it has a text_pair")
                )
        return predict_logits(self.objective, self.features(examples), batch_size, self.device)

    @property
    def paired(self) -> bool:
        """Whether the model classifies sentence pairs (its recipe's task or text_pair_field)."""
        from spanlm.cls.data import layout_of

        layout = layout_of(self.recipe.data)
        return (layout.pair is not None) if layout is not None else self.recipe.data.text_pair_field is not None

    def records(self, logits: np.ndarray) -> list[dict]:
        """One ``cls predict`` line per example: the label and its probability, or the regression value."""
        if self.labels is None:
            return [{"score": float(value)} for value in logits[:, 0]]
        probabilities = softmax(logits)
        best = probabilities.argmax(1)
        return [{"label": self.labels[i], "score": float(p[i])} for i, p in zip(best, probabilities)]
