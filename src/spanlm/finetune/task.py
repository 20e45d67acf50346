"""What every fine-tuning task (NER, QA, sequence classification) does the same way around its own readers,
features, head, decoder and metric: the encoder's extra-input featurizer, the encoder-length check, loading an
exported task model directory for inference, and the ``train`` verb's body.

A task is plain functions over these: it reads its data, makes its features, builds an
:class:`~spanlm.finetune.model.EncoderTask`, and hands the engine a ``TrainingSetup`` with the data settings a
resume must keep (``resume_keeps``). Values a task resolves (the label set, ``data.packing: auto``) are
returned to it, never written back into the recipe it was given.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from spanlm.cli_support import guard_training_outputs
from spanlm.config import load_config
from spanlm.errors import ConfigError
from spanlm.finetune.model import EncoderTask, check_task_directory, ready_for_inference


def encoder_featurizer(encoder) -> Callable | None:
    """The encoder's extra-input featurizer (CharBERT's character channel), or None for a plain encoder."""
    return encoder.featurizer() if hasattr(encoder, "featurizer") else None


def check_max_length(encoder, length: int, key: str, model_path: str) -> None:
    """Refuse a window / sequence length ``length`` (the recipe's ``key``) beyond the encoder's positions."""
    if length > encoder.max_length():
        raise ConfigError(f"{key} {length} exceeds the {encoder.max_length()} positions of {model_path}")


@dataclasses.dataclass
class LoadedModel:
    """An exported task model ready for inference: its recipe, objective and device."""

    recipe: Any
    objective: EncoderTask
    device: torch.device

    @property
    def tokenizer(self):
        return self.objective.encoder.tokenizer


def load_task_model(
    directory: str | Path,
    task: str,
    files: tuple[str, ...],
    recipe_file: str,
    recipe_class: type,
    build: Callable[[Path, Any], EncoderTask],
    device: str = "auto",
    head_state: Callable[[Path, EncoderTask], dict] | None = None,
) -> LoadedModel:
    """The model/ directory of a ``spanlm TASK train`` run, loaded: ``files`` must be there (else a one-line error
    naming the task), ``recipe_file`` is read as ``recipe_class``, ``build(directory, recipe)`` gives the objective
    (its encoder loaded from the directory), whose head weights come from ``head_state(directory, objective)`` or
    else the objective's ``head_file``; then on ``device`` in eval mode."""
    directory = Path(directory)
    check_task_directory(directory, files, task)
    recipe = load_config(directory / recipe_file, cls=recipe_class)
    objective = build(directory, recipe)
    state = head_state(directory, objective) if head_state is not None else None
    return LoadedModel(recipe, objective, ready_for_inference(objective, directory, device, state))


# What usually makes a fine-tuning run that is not learning learn (spanlm.train.health): the rates and their warm-up,
# the budget, the dropout (Mosbach et al. 2021, "On the Stability of Fine-tuning BERT")
FINE_TUNING_HINT = "train.lr / train.encoder_lr and train.warmup_steps, train.max_steps, model.dropout"


class RunStopped(Exception):
    """A fine-tuning run stopped by a signal before its last step: saved, neither exported nor scored."""

    def __init__(self, run_dir: Path, signal: str, step: int):
        super().__init__(f"stopped by {signal} at step {step}")
        self.run_dir, self.signal, self.step = run_dir, signal, step


def train_to_the_end(recipe, build_setup: Callable, resume, log, weights_from) -> Path:
    """Train ``recipe`` (spanlm.train.loop.train); returns the run directory once its last step is trained.

    A stop signal (a scheduler's SIGTERM, a ^C) raises :class:`RunStopped` after the run saved: what a stop asks
    for is an exit within the scheduler's grace period, and a model of a cut-short run would pass for the
    recipe's. Exporting and scoring are for ``--resume auto``, which finishes the run."""
    from spanlm.train import checkpoint as ckpt
    from spanlm.train.loop import train
    from spanlm.train.stop import StopSignal

    with StopSignal() as stop:
        run_dir = train(recipe, build_setup, resume, log, weights_from)
    if stop.received is not None:
        latest = ckpt.latest_checkpoint(run_dir)
        step = ckpt.step_of(latest) if latest is not None else 0
        if step < recipe.train.max_steps:
            raise RunStopped(run_dir, stop.received, step)
    return run_dir


def run_training(args, recipe_class: type, train_task: Callable, summary: Callable[[dict], dict], log) -> int:
    """The ``TASK train RECIPE [OVERRIDES] [--resume …] [--resume-weights-only …]`` verb: load the recipe, train
    (``train_task(recipe, resume=, log=, weights_from=)`` → (run dir, dev scores or None)), and on the main
    process print one JSON line: the run and model directories and ``summary(scores)``; for a run stopped by a
    signal, its directory, the signal and the step it saved."""
    from spanlm.train.dist import is_main_process

    recipe = load_config(args.recipe, args.overrides, cls=recipe_class)
    guard_training_outputs(args.recipe, recipe, args.resume, args.weights_from)
    try:
        run_dir, scores = train_task(recipe, resume=args.resume, log=log, weights_from=args.weights_from)
    except RunStopped as stopped:
        if is_main_process():
            log(
                f"stopped at step {stopped.step} of {recipe.train.max_steps}: not exported or scored; the same "
                "command with --resume auto finishes the run"
            )
            print(json.dumps({"run_dir": str(stopped.run_dir), "stopped": stopped.signal, "step": stopped.step}))
        return 0
    if is_main_process():  # the main process reports; the others only trained
        result = {"run_dir": str(run_dir), "model_dir": str(run_dir / "model")}
        if scores is not None:
            result.update(summary(scores))
        print(json.dumps(result, ensure_ascii=False))
    return 0
