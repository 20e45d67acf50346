"""`spanlm cls train|eval|predict`: the subcommands, registered by :func:`add_cls_commands`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spanlm.cli_support import (
    add_model_command,
    add_training_command,
    guard_outputs,
    log,
    require_records,
    write_lines_or_stdout,
)


def _train(args: argparse.Namespace) -> int:
    from spanlm.cls.config import ClsRecipe
    from spanlm.cls.task import train_cls
    from spanlm.finetune.task import run_training

    return run_training(args, ClsRecipe, train_cls, lambda scores: scores, log)


def _eval(args: argparse.Namespace) -> int:
    import dataclasses

    from spanlm.cls.data import read_examples
    from spanlm.cls.predict import ClsModel
    from spanlm.cls.task import evaluate_model

    guard_outputs(
        {"--output": args.output, "--predictions": args.predictions}, {"MODEL": args.model, "--data": args.data}
    )
    model = ClsModel(args.model, device=args.device)
    # The column layout of the training data carries over; --format / --task read another layout.
    data = dataclasses.replace(
        model.recipe.data,
        format=args.format or model.recipe.data.format,
        task=args.task if args.task is not None else model.recipe.data.task,
    )
    examples = read_examples(args.data, data, model.labels is None, args.split, "--split")
    scores, logits, _ = evaluate_model(model, examples, args.batch_size)
    result = {"data": args.data, "examples": len(examples), **scores}
    if args.output:
        from spanlm.files import write_text_atomically

        write_text_atomically(Path(args.output), json.dumps(result, indent=2, ensure_ascii=False) + "\n")
        log(f"wrote {args.output}")
    if args.predictions:
        lines = [json.dumps(record, ensure_ascii=False) + "\n" for record in model.records(logits)]
        write_lines_or_stdout(lines, args.predictions, "predictions")
    print(json.dumps(result, ensure_ascii=False))
    return 0


def _predict(args: argparse.Namespace) -> int:
    from spanlm.cls.data import Example, read_texts
    from spanlm.cls.predict import ClsModel

    guard_outputs({"--output": args.output}, {"MODEL": args.model, "--input": args.input})
    if args.text is not None:
        examples = [Example(args.text, args.text_pair, None, "--text")]
    else:
        examples = require_records(read_texts(args.input), args.input, "texts")  # before the model loads
    model = ClsModel(args.model, device=args.device)
    lines = [
        json.dumps(record, ensure_ascii=False) + "\n"
        for record in model.records(model.logits(examples, args.batch_size))
    ]
    write_lines_or_stdout(lines, args.output, "predictions")
    return 0


def add_cls_commands(commands) -> None:
    """Add ``cls`` with its three subcommands to the ``spanlm`` subcommand table."""
    from spanlm.cls.tasks import FORMATS, TASKS

    cls = commands.add_parser(
        "cls",
        help="sentence (pair) classification and regression, GLUE / CLUE style: train, eval, predict",
        description="Fine-tune an encoder to classify sentences or sentence pairs (or score them: regression), "
        "score it as GLUE / CLUE do (accuracy, F1, Matthews, Pearson / Spearman) and label new text. The "
        "exported model is a transformers *ForSequenceClassification directory where the pooling is the family's own "
        "(cls.pooling: cls for BERT-style families), else spanlm's layout, which cls eval / predict load.",
    )
    actions = cls.add_subparsers(dest="cls_command", metavar="ACTION", required=True)
    add_training_command(
        actions,
        "train",
        "fine-tune with a recipe; exports <run>/model/ and scores it on data.dev",
        "configs/cls/sst2.yaml",
        "model.path=DIR model.init=random train.max_steps=200",
        _train,
    )
    evaluate = add_model_command(
        actions, "eval", "the task's scores of an exported model on a labelled file", "cls", _eval
    )
    evaluate.add_argument(
        "--data", required=True, help="a labelled file, or a 🤗 dataset (save_to_disk directory or hf:NAME…)"
    )
    evaluate.add_argument("--format", choices=FORMATS, default=None, help="its format (default: the model's recipe)")
    evaluate.add_argument(
        "--task", choices=sorted(TASKS), default=None, help="its GLUE / CLUE layout (default: the recipe's)"
    )
    evaluate.add_argument(
        "--split", default="test", help="the split of a dataset that does not name one (default test)"
    )
    evaluate.add_argument("--output", default=None, metavar="FILE", help="also write the scores as JSON")
    evaluate.add_argument("--predictions", default=None, metavar="FILE", help="also write the predictions as JSONL")

    predict = add_model_command(
        actions, "predict", 'label text: JSONL {"label", "score"} (regression: {"score"}) per input', "cls", _predict
    )
    source = predict.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", default=None, help="one text to label")
    source.add_argument(
        "--input", default=None, metavar="FILE", help='.jsonl ({"text", "text_pair"?} per line) or .txt (one per line)'
    )
    predict.add_argument("--text-pair", default=None, help="the second sentence of --text (a pair model)")
    predict.add_argument("--output", default=None, metavar="FILE", help="JSONL output (default: stdout)")
