"""Extractive QA fine-tuning on the training engine: objective, data setup, export and final evaluation.

``train_qa(recipe)`` runs :func:`spanlm.train.loop.train` with :func:`qa_setup` (so checkpoints,
resume, metrics.jsonl, signals and distribution come from the engine), then on the main process
exports ``<run>/model/`` from the final checkpoint, evaluates it on ``data.dev`` — tuning the
no-answer threshold there for SQuAD v2.0 — and writes ``<run>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from spanlm.errors import ConfigError, InputError
from spanlm.models.packed import resolve_packing
from spanlm.objectives.base import EncoderTask
from spanlm.qa.config import QARecipe
from spanlm.qa.data import QAExample, read_squad
from spanlm.qa.head import SpanHead, span_loss
from spanlm.qa.predict import HEAD_FILE, RECIPE_FILE, SETTINGS_FILE, QAModel, evaluate_predictions, predict
from spanlm.qa.windows import encoder_featurizer, make_windows
from spanlm.train.data import build_window_loader
from spanlm.train.dist import is_main_process
from spanlm.train.loop import TrainingSetup, train


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


def read_split(path: str, recipe: QARecipe, name: str, log) -> list[QAExample]:
    if not path:
        raise ConfigError(f"data.{name} is required: a SQuAD-format JSON file")
    examples, report = read_squad(path, recipe.data.repair_window, allow_impossible=recipe.qa.no_answer,
                                  for_training=name == "train")
    for line in report.lines():
        log(line)
    if not examples:
        raise InputError(report.nothing_usable())
    log(f"{path}: {len(examples)} questions " + json.dumps(report.summary(), ensure_ascii=False))
    return examples


def qa_setup(recipe: QARecipe, env, log=print) -> TrainingSetup:
    """Windows of the training and dev files, a resumable keyed loader, held-out loss and EM/F1."""
    from spanlm.models.encoder import load_encoder

    data = recipe.data
    torch.manual_seed(recipe.seed)  # the same seed on every rank gives identical head weights
    encoder = load_encoder(recipe.model)
    if data.max_length > encoder.max_length():
        raise ConfigError(f"data.max_length {data.max_length} exceeds the {encoder.max_length()} positions of {recipe.model.path}")
    objective = QAObjective(encoder)
    tokenizer = encoder.tokenizer
    train_examples = read_split(data.train, recipe, "train", log)
    dev_examples = read_split(data.dev, recipe, "dev", log)
    featurizer = encoder_featurizer(encoder)
    train_windows = make_windows(tokenizer, train_examples, data.max_length, data.doc_stride, data.max_query_length, featurizer)
    dev_windows = make_windows(tokenizer, dev_examples, data.max_length, data.doc_stride, data.max_query_length, featurizer)
    log(f"{len(train_windows)} training windows from {len(train_examples)} questions, {len(dev_windows)} dev windows")
    data.packing = resolve_packing(data.packing, objective, env.device)  # config.yaml records the choice
    train_windows.packed = dev_windows.packed = data.packing

    loader = build_window_loader(train_windows, recipe.train, recipe.seed, env.rank, env.world_size, data.tokens_per_batch)

    def held_out():
        # Every rank the same number of windows, so the loop can average the losses over ranks.
        mine = np.arange(len(dev_windows) - len(dev_windows) % env.world_size)[env.rank::env.world_size]
        for first in range(0, len(mine), recipe.train.batch_size):
            yield dev_windows.batch(mine[first:first + recipe.train.batch_size])

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        # Every rank scores the whole dev set (identical results, no reduction needed; FSDP needs every
        # rank in every forward anyway).
        module = getattr(model, "module", model)  # DDP's wrapper adds nothing at inference
        predictions = predict(module, tokenizer, dev_examples, recipe, recipe.train.batch_size, env.device, dev_windows)
        return evaluate_predictions(predictions, dev_examples, recipe)

    return TrainingSetup(objective, loader, held_out, evaluate)


def export_model(run_dir: Path, recipe: QARecipe, threshold: float = 0.0) -> Path:
    """``<run>/model/`` from the run's latest checkpoint (written to a temp dir, then renamed)."""
    from spanlm.config import save_config
    from spanlm.models.encoder import load_encoder
    from spanlm.train.checkpoint import latest_checkpoint
    from spanlm.train.export import load_objective_weights, write_directory

    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise InputError(f"{run_dir}: no complete checkpoint to export")
    # The architecture only: the checkpoint's weights replace the fresh ones.
    objective = QAObjective(load_encoder(dataclasses.replace(recipe.model, init="random")))
    load_objective_weights(objective, checkpoint / "model.safetensors")
    def fill(directory: Path) -> None:
        objective.export(directory)
        save_config(recipe, directory / RECIPE_FILE)
        write_threshold(directory, threshold)

    return write_directory(run_dir / "model", fill)


def write_threshold(model_dir: Path, threshold: float) -> None:
    (model_dir / SETTINGS_FILE).write_text(json.dumps({"no_answer_threshold": threshold}) + "\n", encoding="utf-8")


def train_qa(recipe: QARecipe, resume: str | None = None, log=print, weights_from: str | None = None) -> tuple[Path, dict | None]:
    """Fine-tune, export ``<run>/model/`` and score it on the dev set; returns (run dir, dev metrics)."""
    run_dir = train(recipe, qa_setup, resume, log, weights_from)
    if not is_main_process():
        return run_dir, None
    model_dir = export_model(run_dir, recipe)
    model = QAModel(model_dir, device=recipe.train.device)
    dev = read_split(recipe.data.dev, recipe, "dev", lambda *_: None)
    predictions = model.predict(dev, recipe.train.batch_size)
    metrics = evaluate_predictions(predictions, dev, recipe, model.threshold)
    if recipe.qa.no_answer:
        # SQuAD v2.0: the null threshold is tuned on the dev set (BERT's null_score_diff_threshold);
        # the model keeps the F1-best one and the report shows the scores at it.
        model.threshold = metrics["best_f1_threshold"]
        write_threshold(model_dir, model.threshold)
        metrics = evaluate_predictions(predictions, dev, recipe, model.threshold)
    result = {"data": recipe.data.dev, "metric": recipe.qa.metric, **metrics}
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    log(f"dev {recipe.qa.metric}: EM {metrics['em']:.2f} F1 {metrics['f1']:.2f}")
    return run_dir, result
