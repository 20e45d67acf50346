"""Sequence classification and regression on the training engine: the task's setup, export and final evaluation.

``train_cls(recipe)`` runs :func:`spanlm.train.loop.train` with :func:`cls_setup` (checkpoints, resume, metrics.jsonl,
signals and distribution come from the engine), then on the main process exports ``<run>/model/``, scores it on
the dev set read by the setup (read once) and writes ``<run>/eval.json``.

The model is BERT's (Devlin et al. 2019, §4.1): the encoder's first-token state through the family's pooler and a
linear classifier, cross-entropy over the labels, or one output and mean squared error for regression (STS-B).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path

import numpy as np
import torch

from spanlm.cls.config import ClsRecipe
from spanlm.cls.data import Example, check_labels, label_set, layout_of, read_examples
from spanlm.cls.features import make_features
from spanlm.cls.metrics import classification_scores, regression_scores
from spanlm.cls.model import RECIPE_FILE, ClsObjective, write_settings
from spanlm.cls.predict import ClsModel, predict_logits
from spanlm.config import save_config
from spanlm.errors import ConfigError, InputError
from spanlm.files import write_text_atomically
from spanlm.finetune.batches import build_window_loader, held_out_batches
from spanlm.finetune.model import PER_EXAMPLE_FILE, export_task_model
from spanlm.finetune.task import FINE_TUNING_HINT, check_max_length, encoder_featurizer, train_to_the_end
from spanlm.models.encoder import describe_start, load_encoder
from spanlm.models.flops import training_flops
from spanlm.models.packed import resolve_packing
from spanlm.train.dist import is_main_process
from spanlm.train.loop import StartingPoint, TrainingSetup

# The sequence length and batch layout: another value changes every batch, so a resume must keep them.
RESUME_KEEPS = ("data.max_length", "data.packing", "data.tokens_per_batch", "data.labels", "data.task")


@dataclasses.dataclass
class ClsTask:
    """What a recipe resolves to (returned, never written back into it)."""

    labels: list[str] | None  # the classes in id order; None: regression
    metrics: list[str]  # the scores reported, the headline first
    dev: list[Example] | None = None  # the dev set, read once by the setup


def resolve_metrics(recipe: ClsRecipe, regression: bool) -> list[str]:
    layout = layout_of(recipe.data)
    if recipe.cls.metrics is not None:
        metrics = list(recipe.cls.metrics)
    elif layout is not None:
        metrics = list(layout.metrics)
    else:
        metrics = ["pearson", "spearman"] if regression else ["accuracy"]
    wrong = [m for m in metrics if (m in ("pearson", "spearman")) != regression]
    if wrong:
        kind = "a regression" if regression else "a classification"
        raise ConfigError(f"cls.metrics: {wrong[0]} does not score {kind} task")
    return metrics


def is_regression(recipe: ClsRecipe) -> bool:
    if recipe.cls.problem is not None:
        return recipe.cls.problem == "regression"
    layout = layout_of(recipe.data)
    return layout is not None and layout.problem == "regression"


def read_split(recipe: ClsRecipe, name: str, log) -> list[Example]:
    path = getattr(recipe.data, name)
    if not path:
        raise ConfigError(f"data.{name} is required: a labelled file or dataset")
    split = getattr(recipe.data, f"{name}_split")
    examples = read_examples(path, recipe.data, is_regression(recipe), split, f"data.{name}_split")
    log(f"{path}: {len(examples)} examples")
    return examples


def check_data(recipe: ClsRecipe) -> None:
    """Read ``data.train`` and ``data.dev`` as :func:`cls_setup` reads them, the dev labels checked against the
    training labels: what `spanlm eval` checks of every task before any cell runs."""
    quiet = lambda *_: None  # noqa: E731
    task = resolve_task(recipe, read_split(recipe, "train", quiet))
    dev = read_split(recipe, "dev", quiet)
    if task.labels is not None:
        check_labels(dev, task.labels)


def resolve_task(recipe: ClsRecipe, train_examples: list[Example]) -> ClsTask:
    regression = is_regression(recipe)
    metrics = resolve_metrics(recipe, regression)
    if regression:
        return ClsTask(None, metrics)
    labels = list(recipe.data.labels) if recipe.data.labels is not None else label_set(train_examples)
    check_labels(train_examples, labels)
    if len(labels) < 2:
        raise InputError(f"{recipe.data.train}: one label only ({labels[0]}); a classifier needs two or more")
    if "f1" in metrics and recipe.cls.positive_label not in labels:
        raise ConfigError(f"cls.positive_label {recipe.cls.positive_label!r} is not a label ({', '.join(labels)})")
    return ClsTask(labels, metrics)


def score(task: ClsTask, recipe: ClsRecipe, examples: list[Example], logits: np.ndarray) -> tuple[dict, dict]:
    """The task's metrics of ``logits`` on labelled ``examples``, and per-example columns (for a bootstrap)."""
    if task.labels is None:
        gold = np.asarray([e.label for e in examples], dtype=np.float64)
        predicted = logits[:, 0].astype(np.float64)
        return regression_scores(gold, predicted, task.metrics), {
            "gold": gold.tolist(),
            "predicted": predicted.tolist(),
        }
    index = {label: i for i, label in enumerate(task.labels)}
    gold = np.asarray([index[e.label] for e in examples], dtype=np.int64)
    predicted = logits.argmax(1)
    scores = classification_scores(gold, predicted, task.labels, task.metrics, recipe.cls.positive_label)
    return scores, {"correct": (gold == predicted).astype(int).tolist()}


def cls_setup(
    recipe: ClsRecipe, env, log=print, start: StartingPoint = StartingPoint(), resolved: dict | None = None
) -> TrainingSetup:
    """Features of the training and dev files, a resumable keyed loader, held-out loss and the task's metrics.
    ``resolved`` (a dict) receives the :class:`ClsTask` (labels, metrics, the dev set) under "task" and the recipe
    with the label order and ``data.packing`` resolved under "recipe"."""
    data = recipe.data
    train_examples = read_split(recipe, "train", log)  # data errors first: reading is cheap
    task = resolve_task(recipe, train_examples)
    dev = read_split(recipe, "dev", log) if data.dev else None
    if dev is not None and task.labels is not None:
        check_labels(dev, task.labels)
    task.dev = dev
    if resolved is not None:
        resolved["task"] = task
    torch.manual_seed(recipe.seed)  # the same seed on every rank gives identical head weights
    encoder = load_encoder(recipe.model)
    log(describe_start(recipe.model))
    check_max_length(encoder, data.max_length, "data.max_length", recipe.model.path)
    featurizer = encoder_featurizer(encoder)
    objective = ClsObjective(encoder, task.labels, recipe.cls.pooling)
    packed = resolve_packing(data.packing, objective, env.packs_by_default, recipe.train.compile, log)
    # What the setup resolved goes into a copy (the run's config.yaml and the export record it), not into the recipe.
    labels = task.labels if task.labels is not None else data.labels
    recipe = dataclasses.replace(recipe, data=dataclasses.replace(data, labels=labels, packing=packed))
    if resolved is not None:
        resolved["recipe"] = recipe
    train_features = make_features(encoder.tokenizer, train_examples, data.max_length, task.labels, featurizer)
    train_features.packed = packed
    # Learning health: a classifier that has learnt nothing has the training loss ln K of K labels
    health = {
        "learning_hint": FINE_TUNING_HINT,
        "chance_loss": math.log(len(task.labels)) if task.labels is not None and len(task.labels) > 1 else None,
    }
    loader = build_window_loader(
        train_features, recipe.train, recipe.seed, env.rank, env.world_size, data.tokens_per_batch
    )
    if dev is None:
        return TrainingSetup(
            objective,
            loader,
            lambda: iter(()),
            resume_keeps=RESUME_KEEPS,
            recipe=recipe,
            flops=training_flops(objective),
            **health,
        )
    dev_features = make_features(encoder.tokenizer, dev, data.max_length, task.labels, featurizer)
    dev_features.packed = packed
    batch_size = recipe.train.batch_size
    held_out = functools.partial(held_out_batches, dev_features, batch_size, env.rank, env.world_size)

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        # Every rank scores the whole dev set (identical results, no reduction; FSDP needs every rank in every
        # forward anyway); sentence classification's dev sets are small.
        module = getattr(model, "module", model)  # DDP's wrapper adds nothing at inference
        logits = predict_logits(module, dev_features, batch_size, env.device)
        return score(task, recipe, dev, logits)[0]

    return TrainingSetup(
        objective,
        loader,
        held_out,
        evaluate,
        resume_keeps=RESUME_KEEPS,
        recipe=recipe,
        flops=training_flops(objective),
        **health,
    )


def export_model(run_dir: Path, recipe: ClsRecipe, labels: list[str] | None, log=print) -> Path:
    """``<run>/model/`` from the run's latest checkpoint, with its recipe and labels; says so when it is spanlm's
    layout rather than the family's stock class."""
    built = {}

    def build() -> ClsObjective:
        built["objective"] = ClsObjective(
            load_encoder(dataclasses.replace(recipe.model, init="random")), labels, recipe.cls.pooling
        )
        return built["objective"]

    def write_files(directory: Path) -> None:
        save_config(recipe, directory / RECIPE_FILE)
        write_settings(directory, labels, built["objective"].stock, recipe.cls.pooling)

    model_dir = export_task_model(run_dir, build, write_files)
    if not built["objective"].stock:
        log(
            f"{model_dir}: spanlm's layout (spanlm cls eval / predict, ClsModel); cls.pooling: cls exports the "
            "family's stock *ForSequenceClassification instead"
        )
    return model_dir


def evaluate_model(
    model: ClsModel, examples: list[Example], batch_size: int = 32
) -> tuple[dict[str, float], np.ndarray, dict]:
    """The model's metrics on labelled ``examples``, its logits and the per-example columns."""
    if model.labels is not None:
        check_labels(examples, model.labels)
    task = ClsTask(model.labels, resolve_metrics(model.recipe, model.labels is None))
    logits = model.logits(examples, batch_size)
    scores, per_example = score(task, model.recipe, examples, logits)
    return scores, logits, per_example


def train_cls(
    recipe: ClsRecipe, resume: str | None = None, log=print, weights_from: str | None = None
) -> tuple[Path, dict | None]:
    """Fine-tune, export ``<run>/model/`` and score it on the dev set; returns (run dir, dev scores)."""
    resolved: dict = {}
    run_dir = train_to_the_end(recipe, functools.partial(cls_setup, resolved=resolved), resume, log, weights_from)
    if not is_main_process():
        return run_dir, None
    task, recipe = resolved["task"], resolved["recipe"]  # the labels and packing the run used; dev read once
    model_dir = export_model(run_dir, recipe, task.labels, log)
    if task.dev is None:
        return run_dir, None
    model = ClsModel(model_dir, device=recipe.train.device)
    scores, _, per_example = evaluate_model(model, task.dev, recipe.train.batch_size)
    write_text_atomically(run_dir / PER_EXAMPLE_FILE, json.dumps(per_example) + "\n")
    result = {"data": recipe.data.dev, "examples": len(task.dev), **scores}
    # eval.json last: its presence marks a finished run (spanlm eval keeps such a run)
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log("dev " + ", ".join(f"{name} {value:.2f}" for name, value in scores.items()))
    return run_dir, result
