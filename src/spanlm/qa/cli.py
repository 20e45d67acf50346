"""`spanlm qa train|eval|predict`: the subcommands, registered by :func:`add_qa_commands`."""

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
    from spanlm.finetune.task import run_training
    from spanlm.qa.config import QARecipe
    from spanlm.qa.task import train_qa

    return run_training(args, QARecipe, train_qa, lambda metrics: metrics, log)


def _eval(args: argparse.Namespace) -> int:
    from spanlm.qa.data import read_squad
    from spanlm.qa.predict import QAModel, final_answer

    guard_outputs({"--predictions": args.predictions}, {"MODEL": args.model, "--data": args.data})
    model = QAModel(args.model, device=args.device)
    examples, report = read_squad(
        args.data, model.recipe.data.repair_window, allow_impossible=model.recipe.qa.no_answer, for_training=False
    )
    for line in report.lines():
        log(line)
    if not examples:
        from spanlm.errors import InputError

        raise InputError(report.nothing_usable())
    metrics, predictions = model.evaluate(examples, args.batch_size)
    if args.predictions:  # the official scripts' input: {question id: answer}
        answers = {p.id: final_answer(p, model.recipe.qa.no_answer, model.threshold) for p in predictions}
        from spanlm.files import write_text_atomically

        write_text_atomically(Path(args.predictions), json.dumps(answers, ensure_ascii=False, indent=1))
    print(
        json.dumps(
            {"data": args.data, "metric": model.recipe.qa.metric, **metrics, "read": report.summary()},
            ensure_ascii=False,
        )
    )
    return 0


def _predict(args: argparse.Namespace) -> int:
    from spanlm.qa.data import read_questions_jsonl
    from spanlm.qa.predict import QAModel

    guard_outputs({"--output": args.output}, {"MODEL": args.model, "--input": args.input})
    examples = require_records(read_questions_jsonl(args.input), args.input, "questions")  # before the model loads
    model = QAModel(args.model, device=args.device)
    lines = [json.dumps(model.answer(p), ensure_ascii=False) + "\n" for p in model.predict(examples, args.batch_size)]
    write_lines_or_stdout(lines, args.output, "answers")
    return 0


def add_qa_commands(commands) -> None:
    """Add ``qa`` with its three subcommands to the ``spanlm`` subcommand table."""
    qa = commands.add_parser(
        "qa",
        help="extractive question answering (SQuAD format): train, eval, predict",
        description="Fine-tune an encoder for span-extraction QA, score it with the official "
        "SQuAD / CMRC 2018 EM and F1, and answer new questions.",
    )
    actions = qa.add_subparsers(dest="qa_command", metavar="ACTION", required=True)

    add_training_command(
        actions,
        "train",
        "fine-tune with a recipe; exports <run>/model/ and scores it on data.dev",
        "configs/qa/cmrc2018.yaml",
        "model.path=DIR model.init=random train.max_steps=200",
        _train,
    )

    evaluate = add_model_command(actions, "eval", "EM / F1 of an exported model on a SQuAD-format file", "qa", _eval)
    evaluate.add_argument("--data", required=True, help="a SQuAD v1.1 / v2.0 JSON file")
    evaluate.add_argument(
        "--predictions", default=None, metavar="FILE", help="also write {question id: answer} as JSON"
    )
    predict = add_model_command(
        actions, "predict", 'answer JSONL questions: {"question", "context"} per line', "qa", _predict
    )
    predict.add_argument("--input", required=True, help='JSONL, one {"question", "context"} ("id" optional) per line')
    predict.add_argument("--output", default=None, help="JSONL answers (default: stdout)")
