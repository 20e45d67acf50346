"""Span NER fine-tuning on the training engine: objective, data setup, export and final evaluation.

``train_ner(recipe)`` runs :func:`spanlm.train.loop.train` with :func:`ner_setup` (checkpoints, resume,
metrics.jsonl, signals and distribution come from the engine), then on the main process exports
``<run>/model/`` from the final checkpoint, scores it on the whole ``data.dev`` and writes
``<run>/eval.json``.

The model is the encoder + GlobalPointer (Su et al. 2022, arXiv 2208.03054): every
(type, start, end) cell gets a logit, trained with the ZLPR multi-label loss (arXiv 2208.02955), so
nested and multi-type entities need nothing special.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from spanlm.config import save_config
from spanlm.errors import ConfigError, InputError
from spanlm.files import write_text_atomically
from spanlm.finetune.batches import build_window_loader, held_out_batches
from spanlm.finetune.model import PER_EXAMPLE_FILE, export_task_model
from spanlm.finetune.task import FINE_TUNING_HINT, check_max_length, encoder_featurizer, train_to_the_end
from spanlm.models.encoder import describe_start, load_encoder
from spanlm.models.flops import training_flops
from spanlm.models.packed import resolve_packing
from spanlm.ner.config import NerRecipe
from spanlm.ner.data import NerDocument, input_format, label_set, read_documents
from spanlm.ner.metrics import format_table, per_document_counts
from spanlm.ner.model import LABELS_FILE, RECIPE_FILE, NerObjective
from spanlm.ner.predict import (
    NerModel,
    Spans,
    by_length,
    entity_tuples,
    flat_select,
    merge,
    score_documents,
    spans_to_documents,
    whole,
    window_spans,
)
from spanlm.ner.windows import make_windows
from spanlm.train.dist import is_main_process
from spanlm.train.loop import StartingPoint, TrainingSetup

# The window settings and batch layout: another value changes every batch, so a resume must keep them.
# data.labels: the label set in the head's order, read from the data when the recipe does not name it: another set
# would continue the run with each type id meaning another type
RESUME_KEEPS = (
    "data.max_len",
    "data.stride",
    "data.train_docs",
    "data.packing",
    "data.tokens_per_batch",
    "data.labels",
)


def read_split(path: str, recipe: NerRecipe, name: str, labels: list[str] | None, log) -> list[NerDocument]:
    """The documents of ``data.train`` or ``data.dev`` (``name``), a dataset read from ``data.<name>_split``."""
    if not path:
        raise ConfigError(f"data.{name} is required: a {recipe.data.format or 'NER'} file or dataset")
    split = getattr(recipe.data, f"{name}_split")
    documents, report = read_documents(
        path, dataclasses.replace(recipe.data, labels=labels), split, f"data.{name}_split"
    )
    for line in report.lines():
        log(line)
    if not documents:
        raise InputError(f"{path}: no usable record ({report.records} read, {len(report.skipped)} skipped)")
    return documents


def read_training(recipe: NerRecipe, log) -> tuple[list[NerDocument], list[str]]:
    """The documents a run trains on (the first ``data.train_docs``) and its label set: the recipe's, else theirs."""
    train_docs = read_split(recipe.data.train, recipe, "train", recipe.data.labels, log)
    train_docs = train_docs[: recipe.data.train_docs or None]
    labels = recipe.data.labels if recipe.data.labels is not None else label_set(train_docs)
    if not labels:
        first = f" (data.train_docs: its first {recipe.data.train_docs})" if recipe.data.train_docs else ""
        raise InputError(
            f"{recipe.data.train}: no entity in the training file{first}, so no label set; list them in data.labels"
        )
    return train_docs, labels


def check_data(recipe: NerRecipe) -> None:
    """Read ``data.train`` and ``data.dev`` as :func:`ner_setup` reads them (the label set from the documents
    trained on where the recipe names none): what `spanlm eval` checks of every task before any cell runs."""
    quiet = lambda *_: None  # noqa: E731
    _, labels = read_training(recipe, quiet)
    read_split(recipe.data.dev, recipe, "dev", labels, quiet)


def ner_setup(
    recipe: NerRecipe, env, log=print, start: StartingPoint = StartingPoint(), resolved: dict | None = None
) -> TrainingSetup:
    """Windows of the training and dev files, a resumable keyed loader, held-out loss and dev P/R/F1.

    What the setup resolves — the label order (the head's type ids), ``data.packing`` — goes into a copy of the
    recipe (``TrainingSetup.recipe``: the run's config.yaml and the export record it), never into ``recipe``;
    ``resolved`` (a dict), when given, receives that copy under "recipe" and the whole dev set, read once, under
    "dev". ``start`` changes nothing here: the windows are read the same however the run starts.
    """

    train_docs, labels = read_training(recipe, log)  # data errors first
    torch.manual_seed(recipe.seed)  # the same seed on every rank gives identical head weights
    encoder = load_encoder(recipe.model)
    log(describe_start(recipe.model))
    check_max_length(encoder, recipe.data.max_len, "data.max_len", recipe.model.path)
    featurizer = encoder_featurizer(encoder)
    objective = NerObjective(encoder, len(labels), recipe.ner)
    packing = resolve_packing(recipe.data.packing, objective, env.packs_by_default, recipe.train.compile, log)
    recipe = dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, labels=list(labels), packing=packing))
    data = recipe.data
    train_windows, report = make_windows(encoder.tokenizer, train_docs, labels, data.max_len, data.stride, featurizer)
    for line in report.lines(data.train):
        log(line)
    log(f"{data.train}: " + json.dumps(report.summary()))
    train_windows.packed = data.packing
    all_dev = read_split(data.dev, recipe, "dev", labels, log) if data.dev else None
    if resolved is not None:
        resolved.update(recipe=recipe, dev=all_dev)

    loader = build_window_loader(
        train_windows, recipe.train, recipe.seed, env.rank, env.world_size, data.tokens_per_batch
    )
    if all_dev is None:
        return TrainingSetup(
            objective,
            loader,
            lambda: iter(()),
            resume_keeps=RESUME_KEEPS,
            recipe=recipe,
            flops=training_flops(objective),
            learning_hint=FINE_TUNING_HINT,
        )

    dev_docs = all_dev[: data.eval_docs or None]
    dev_format = input_format(data.dev, data)
    dev_windows, dev_report = make_windows(encoder.tokenizer, dev_docs, labels, data.max_len, data.stride, featurizer)
    dev_windows.packed = train_windows.packed
    for line in dev_report.lines(data.dev):
        log(line)
    batch_size = recipe.train.batch_size
    held_out = functools.partial(held_out_batches, dev_windows, batch_size, env.rank, env.world_size)

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        module = getattr(model, "module", model)  # DDP's wrapper adds nothing at inference
        mine = by_length(dev_windows, np.arange(len(dev_windows))[env.rank :: env.world_size])
        # Rank 0 holds the most windows; every rank runs that many forward passes (FSDP needs them all).
        n_batches = -(-len(range(0, len(dev_windows), env.world_size)) // batch_size)
        spans = window_spans(module, dev_windows, mine, recipe.ner.threshold, batch_size, env.device, n_batches)
        if env.enabled:
            every = [None] * env.world_size
            dist.all_gather_object(every, spans)
            spans = Spans.concat(every)
        spans = merge(whole(spans, dev_docs))
        predicted = spans_to_documents(flat_select(spans) if recipe.ner.flat else spans, dev_docs, labels)
        scores = score_documents(dev_docs, [d for d, _ in predicted], labels, cluener=dev_format == "cluener")
        metrics = {
            "precision": scores["micro"]["precision"],
            "recall": scores["micro"]["recall"],
            "f1": scores["micro"]["f1"],
        }
        if "cluener_macro_f1" in scores:
            metrics["cluener_macro_f1"] = scores["cluener_macro_f1"]["f1"]
        return metrics

    return TrainingSetup(
        objective,
        loader,
        held_out,
        evaluate,
        resume_keeps=RESUME_KEEPS,
        recipe=recipe,
        flops=training_flops(objective),
        learning_hint=FINE_TUNING_HINT,
    )


def export_model(run_dir: Path, recipe: NerRecipe) -> Path:
    """``<run>/model/`` from the run's latest checkpoint, with its recipe and labels."""
    labels = recipe.data.labels

    def write_files(directory: Path) -> None:
        save_config(recipe, directory / RECIPE_FILE)
        (directory / LABELS_FILE).write_text(json.dumps(labels, ensure_ascii=False) + "\n", encoding="utf-8")

    return export_task_model(
        run_dir,
        lambda: NerObjective(load_encoder(dataclasses.replace(recipe.model, init="random")), len(labels), recipe.ner),
        write_files,
    )


def evaluate_model(
    model: NerModel, documents: list[NerDocument], cluener: bool, batch_size: int = 32
) -> tuple[dict, list]:
    """Scores of ``model`` on gold ``documents`` and its predictions."""
    predicted = model.predict(documents, batch_size)
    return score_documents(documents, [d for d, _ in predicted], model.labels, cluener), predicted


def train_ner(
    recipe: NerRecipe, resume: str | None = None, log=print, weights_from: str | None = None
) -> tuple[Path, dict | None]:
    """Fine-tune, export ``<run>/model/`` and score it on the whole dev set; returns (run dir, dev scores)."""

    resolved: dict = {}
    run_dir = train_to_the_end(recipe, functools.partial(ner_setup, resolved=resolved), resume, log, weights_from)
    if not is_main_process():
        return run_dir, None
    recipe, dev = resolved["recipe"], resolved["dev"]  # the label order and packing the run used; dev read once
    model_dir = export_model(run_dir, recipe)
    if dev is None:
        return run_dir, None
    model = NerModel(model_dir, device=recipe.train.device)
    scores, predicted = evaluate_model(
        model, dev, input_format(recipe.data.dev, recipe.data) == "cluener", recipe.train.batch_size
    )
    counts = per_document_counts(entity_tuples(dev), entity_tuples([d for d, _ in predicted]), len(dev))
    write_text_atomically(run_dir / PER_EXAMPLE_FILE, json.dumps(counts) + "\n")
    result = {"data": recipe.data.dev, **scores}
    # eval.json last: its presence marks a finished run (spanlm eval keeps such a run)
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log(format_table(scores))
    return run_dir, result
