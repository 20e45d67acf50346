"""Extractive QA fine-tuning on the training engine: objective, data setup, export and final evaluation.

``train_qa(recipe)`` runs :func:`spanlm.train.loop.train` with :func:`qa_setup` (so checkpoints,
resume, metrics.jsonl, signals and distribution come from the engine), then on the main process
exports ``<run>/model/`` from the final checkpoint, evaluates it on ``data.dev`` — tuning the
no-answer threshold there for SQuAD v2.0 — and writes ``<run>/eval.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import torch

from spanlm.config import save_config
from spanlm.errors import ConfigError, InputError
from spanlm.files import write_text_atomically
from spanlm.finetune.batches import build_window_loader, held_out_batches
from spanlm.finetune.model import PER_EXAMPLE_FILE, export_task_model
from spanlm.finetune.task import FINE_TUNING_HINT, check_max_length, encoder_featurizer, train_to_the_end
from spanlm.models.encoder import describe_start, load_encoder
from spanlm.models.flops import training_flops
from spanlm.models.packed import resolve_packing
from spanlm.qa.config import QARecipe
from spanlm.qa.data import QAExample, read_squad
from spanlm.qa.metrics import question_scores
from spanlm.qa.model import RECIPE_FILE, SETTINGS_FILE, QAObjective
from spanlm.qa.predict import QAModel, evaluate_predictions, final_answer, predict
from spanlm.qa.windows import make_windows
from spanlm.train.dist import is_main_process
from spanlm.train.loop import StartingPoint, TrainingSetup

# The window settings and batch layout: another value changes every batch, so a resume must keep them.
# data.repair_window moves the answers it repairs: the training targets themselves
RESUME_KEEPS = (
    "data.max_length",
    "data.doc_stride",
    "data.max_query_length",
    "data.repair_window",
    "data.packing",
    "data.tokens_per_batch",
)


def read_split(path: str, recipe: QARecipe, name: str, log) -> list[QAExample]:
    if not path:
        raise ConfigError(f"data.{name} is required: a SQuAD-format JSON file")
    examples, report = read_squad(
        path, recipe.data.repair_window, allow_impossible=recipe.qa.no_answer, for_training=name == "train"
    )
    for line in report.lines():
        log(line)
    if not examples:
        raise InputError(report.nothing_usable())
    log(f"{path}: {len(examples)} questions " + json.dumps(report.summary(), ensure_ascii=False))
    return examples


def check_data(recipe: QARecipe) -> None:
    """Read ``data.train`` and ``data.dev`` as :func:`qa_setup` reads them: what `spanlm eval` checks of every task
    before any cell runs."""
    for name in ("train", "dev"):
        read_split(getattr(recipe.data, name), recipe, name, lambda *_: None)


def qa_setup(
    recipe: QARecipe, env, log=print, start: StartingPoint = StartingPoint(), resolved: dict | None = None
) -> TrainingSetup:
    """Windows of the training and dev files, a resumable keyed loader, held-out loss and EM/F1.

    ``data.packing`` as resolved goes into a copy of the recipe (``TrainingSetup.recipe``: config.yaml and the
    export record it), never into ``recipe``; ``resolved`` (a dict), when given, receives that copy under "recipe"
    and the dev set, read once, under "dev". ``start`` changes nothing here: the windows are read the same however
    the run starts."""

    data = recipe.data
    torch.manual_seed(recipe.seed)  # the same seed on every rank gives identical head weights
    encoder = load_encoder(recipe.model)
    log(describe_start(recipe.model))
    check_max_length(encoder, data.max_length, "data.max_length", recipe.model.path)
    objective = QAObjective(encoder)
    tokenizer = encoder.tokenizer
    train_examples = read_split(data.train, recipe, "train", log)
    dev_examples = read_split(data.dev, recipe, "dev", log)
    featurizer = encoder_featurizer(encoder)
    train_windows = make_windows(
        tokenizer, train_examples, data.max_length, data.doc_stride, data.max_query_length, featurizer
    )
    dev_windows = make_windows(
        tokenizer, dev_examples, data.max_length, data.doc_stride, data.max_query_length, featurizer
    )
    log(f"{len(train_windows)} training windows from {len(train_examples)} questions, {len(dev_windows)} dev windows")
    packing = resolve_packing(data.packing, objective, env.packs_by_default, recipe.train.compile, log)
    recipe = dataclasses.replace(recipe, data=dataclasses.replace(data, packing=packing))
    train_windows.packed = dev_windows.packed = packing
    if resolved is not None:
        resolved.update(recipe=recipe, dev=dev_examples)

    loader = build_window_loader(
        train_windows, recipe.train, recipe.seed, env.rank, env.world_size, data.tokens_per_batch
    )

    held_out = functools.partial(held_out_batches, dev_windows, recipe.train.batch_size, env.rank, env.world_size)

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        # Every rank scores the whole dev set (identical results, no reduction needed; FSDP needs every
        # rank in every forward anyway).
        module = getattr(model, "module", model)  # DDP's wrapper adds nothing at inference
        predictions = predict(module, tokenizer, dev_examples, recipe, recipe.train.batch_size, env.device, dev_windows)
        return evaluate_predictions(predictions, dev_examples, recipe)

    return TrainingSetup(
        objective,
        loader,
        held_out,
        evaluate,
        resume_keeps=RESUME_KEEPS,
        recipe=recipe,
        flops=training_flops(objective),
        learning_hint=FINE_TUNING_HINT,
        # A span head that has learnt nothing spreads each boundary evenly over the window's context and [CLS]: its
        # loss is the windows' mean log of that count
        chance_loss=float(np.mean(np.log(train_windows.context_mask[:, 1:].sum(1) + 1))),
    )


def export_model(run_dir: Path, recipe: QARecipe, threshold: float = 0.0) -> Path:
    """``<run>/model/`` from the run's latest checkpoint, with its recipe and no-answer threshold."""

    def write_files(directory: Path) -> None:
        save_config(recipe, directory / RECIPE_FILE)
        write_threshold(directory, threshold)

    return export_task_model(
        run_dir, lambda: QAObjective(load_encoder(dataclasses.replace(recipe.model, init="random"))), write_files
    )


def write_threshold(model_dir: Path, threshold: float) -> None:
    (model_dir / SETTINGS_FILE).write_text(json.dumps({"no_answer_threshold": threshold}) + "\n", encoding="utf-8")


def train_qa(
    recipe: QARecipe, resume: str | None = None, log=print, weights_from: str | None = None
) -> tuple[Path, dict | None]:
    """Fine-tune, export ``<run>/model/`` and score it on the dev set; returns (run dir, dev metrics)."""
    resolved: dict = {}
    run_dir = train_to_the_end(recipe, functools.partial(qa_setup, resolved=resolved), resume, log, weights_from)
    if not is_main_process():
        return run_dir, None
    recipe, dev = resolved["recipe"], resolved["dev"]  # the packing the run used; the dev set read once
    model_dir = export_model(run_dir, recipe)
    model = QAModel(model_dir, device=recipe.train.device)
    predictions = model.predict(dev, recipe.train.batch_size)
    metrics = evaluate_predictions(predictions, dev, recipe, model.threshold)
    if recipe.qa.no_answer:
        # SQuAD v2.0: the null threshold is tuned on the dev set (BERT's null_score_diff_threshold);
        # the model keeps the F1-best one and the report shows the scores at it.
        model.threshold = metrics["best_f1_threshold"]
        write_threshold(model_dir, model.threshold)
        metrics = evaluate_predictions(predictions, dev, recipe, model.threshold)
    answers = {p.id: final_answer(p, recipe.qa.no_answer, model.threshold) for p in predictions}
    per_question = [question_scores(answers.get(e.id, ""), e.gold, recipe.qa.metric) for e in dev]
    write_text_atomically(
        run_dir / PER_EXAMPLE_FILE,
        json.dumps({"em": [100 * em for em, _ in per_question], "f1": [100 * f1 for _, f1 in per_question]}) + "\n",
    )
    result = {"data": recipe.data.dev, "metric": recipe.qa.metric, **metrics}
    # eval.json last: its presence marks a finished run (spanlm eval keeps such a run)
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    log(f"dev {recipe.qa.metric}: EM {metrics['em']:.2f} F1 {metrics['f1']:.2f}")
    return run_dir, result
