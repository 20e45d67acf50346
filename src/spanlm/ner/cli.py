"""`spanlm ner train|eval|predict|genia`: the subcommands, registered by :func:`add_ner_commands`."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from spanlm.cli_support import (
    add_model_command,
    add_training_command,
    guard_outputs,
    log,
    number,
    require_records,
    write_lines_or_stdout,
)


def _train(args: argparse.Namespace) -> int:
    from spanlm.finetune.task import run_training
    from spanlm.ner.config import NerRecipe
    from spanlm.ner.task import train_ner

    def summary(scores: dict) -> dict:
        found = {"data": scores["data"], **{k: scores["micro"][k] for k in ("precision", "recall", "f1")}}
        if "cluener_macro_f1" in scores:
            found["cluener_macro_f1"] = scores["cluener_macro_f1"]["f1"]
        return found

    return run_training(args, NerRecipe, train_ner, summary, log)


def _format(path: str, explicit: str | None, default: str | None) -> str | None:
    """hf for a dataset; else --format, else what the suffix says, else the model's training format."""
    from spanlm.errors import InputError
    from spanlm.ner.data import ReadOptions, input_format

    try:
        return input_format(path, ReadOptions(format=explicit))
    except InputError:  # no suffix to go by
        return default


def _read(model, path: str, fmt: str | None, on_bad_record: str | None, split: str):
    import dataclasses

    from spanlm.errors import InputError
    from spanlm.ner.data import read_documents

    data = model.recipe.data  # the column layout and tag scheme of the training data carry over
    options = dataclasses.replace(
        data, format=fmt, labels=list(model.labels), on_bad_record=on_bad_record or data.on_bad_record
    )
    documents, report = read_documents(path, options, split, "--split")
    for line in report.lines():
        log(line)
    if not documents:
        raise InputError(f"{path}: no usable record ({report.records} read, {len(report.skipped)} skipped)")
    return documents, report


def _eval(args: argparse.Namespace) -> int:
    from spanlm.ner.data import document_record
    from spanlm.ner.metrics import format_table
    from spanlm.ner.predict import NerModel
    from spanlm.ner.task import evaluate_model

    guard_outputs(
        {"--output": args.output, "--predictions": args.predictions}, {"MODEL": args.model, "--data": args.data}
    )
    model = NerModel(args.model, device=args.device)
    fmt = _format(args.data, args.format, model.recipe.data.format)
    documents, report = _read(model, args.data, fmt, args.on_bad_record, args.split)
    scores, predicted = evaluate_model(model, documents, cluener=fmt == "cluener", batch_size=args.batch_size)
    result = {"data": args.data, **scores, **report.summary()}
    if args.noise is not None:  # the same documents again, misspelt (CharBERT's robustness test)
        from spanlm.ner.attack import attack_documents, format_comparison

        attacked_documents, counts = attack_documents(documents, args.noise, args.noise_seed)
        attacked, _ = evaluate_model(model, attacked_documents, cluener=fmt == "cluener", batch_size=args.batch_size)
        result["attacked"] = {"noise": args.noise, "noise_seed": args.noise_seed, **counts.summary(), **attacked}
    from spanlm.files import write_text_atomically

    output = (
        Path(args.output) if args.output else Path(args.model) / f"eval-{_data_name(args.data, fmt, args.split)}.json"
    )
    write_text_atomically(output, json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    if args.predictions:
        # The lines `ner predict` writes, each entity with its score
        lines = [json.dumps(document_record(d, scores), ensure_ascii=False) + "\n" for d, scores in predicted]
        write_lines_or_stdout(lines, args.predictions, "documents")
    print(format_table(scores) if args.noise is None else format_comparison(scores, attacked, args.noise))
    log(f"wrote {output}")
    return 0


def _data_name(data: str, fmt: str | None, split: str) -> str:
    """The name of ``--data`` in the default metrics file name: a file's stem; a dataset's name and split."""
    from spanlm.data.hf_datasets import HF_PREFIX, DatasetName

    if fmt != "hf":
        return Path(data).stem
    if not data.startswith(HF_PREFIX):  # a save_to_disk directory
        return f"{Path(data).name}-{split}"
    parts = DatasetName.parse(data)
    return re.sub(r"[^\w.-]+", "_", f"{Path(parts.name).name}-{parts.split or split}")  # a sliced split has [ : %


def _texts(args: argparse.Namespace):
    from spanlm.ner.data import NerDocument, read_texts

    if args.text is not None:
        return [NerDocument("0", args.text, [])]
    return read_texts(args.input)


def _predict(args: argparse.Namespace) -> int:
    from spanlm.ner.data import document_record
    from spanlm.ner.predict import NerModel

    guard_outputs({"--output": args.output}, {"MODEL": args.model, "--input": args.input})
    documents = require_records(_texts(args), args.input, "texts")  # before the model loads: bad input fails at once
    model = NerModel(args.model, device=args.device)
    flat = True if args.flat else None
    lines = [
        json.dumps(document_record(d, scores), ensure_ascii=False) + "\n"
        for d, scores in model.predict(documents, args.batch_size, flat=flat, threshold=args.threshold)
    ]
    write_lines_or_stdout(lines, args.output, "documents")
    return 0


def _genia(args: argparse.Namespace) -> int:
    from spanlm.errors import InputError
    from spanlm.ner.genia import read_genia, write_genia_split

    splits = Path(args.splits)
    names = [name for name in ("train", "dev", "test") if (splits / f"{name}.txt").is_file()]
    if not names:
        raise InputError(f"{splits}: no train.txt, dev.txt or test.txt (files of MEDLINE ids, one per line)")
    guard_outputs({"--out": args.out}, {"the archive": args.archive, "--splits": splits})
    corpus = read_genia(args.archive)  # read once for every split
    log(f"read {len(corpus)} articles from {args.archive}")
    summary = {}
    for name in names:
        out = Path(args.out) / f"{name}.jsonlines"
        counts = write_genia_split(corpus, splits / f"{name}.txt", out)
        summary[name] = {"sentences": counts.sentences, "entities": counts.entities, "nested": counts.nested}
        log(f"wrote {counts.sentences} sentences, {counts.entities} entities ({counts.nested} nested) to {out}")
    print(json.dumps(summary))
    return 0


def add_ner_commands(commands) -> None:
    """Add ``ner`` with its four subcommands to the ``spanlm`` subcommand table."""
    from spanlm.ner.data import FORMATS

    ner = commands.add_parser(
        "ner",
        help="span NER with GlobalPointer (flat and nested): train, eval, predict, genia",
        description="Fine-tune an encoder with a GlobalPointer head (ZLPR loss), score it "
        "(micro / per-type P, R, F1; CLUENER's macro F1) and tag new text.",
    )
    actions = ner.add_subparsers(dest="ner_command", metavar="ACTION", required=True)

    add_training_command(
        actions,
        "train",
        "fine-tune with a recipe; exports <run>/model/ and scores it on data.dev",
        "configs/ner/cluener.yaml",
        "model.path=DIR ner.head.kind=standard train.max_steps=200",
        _train,
    )

    evaluate = add_model_command(actions, "eval", "P / R / F1 of an exported model on a labelled file", "ner", _eval)
    evaluate.add_argument(
        "--data",
        required=True,
        help="a labelled file, or a Hugging Face NER dataset (a save_to_disk "
        "directory or hf:NAME[@REVISION][:CONFIG][:SPLIT])",
    )
    evaluate.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="its format (default: hf for a dataset, else from the suffix, else the model's training format)",
    )
    evaluate.add_argument(
        "--split", default="test", help="the split of a dataset that does not name one (default test)"
    )
    evaluate.add_argument(
        "--on-bad-record", choices=["error", "skip"], default=None, help="default: the model's recipe"
    )
    evaluate.add_argument(
        "--output", default=None, metavar="FILE", help="metrics JSON (default MODEL/eval-<data name>.json)"
    )
    evaluate.add_argument("--predictions", default=None, metavar="FILE", help="also write the predictions as JSONL")
    evaluate.add_argument(
        "--noise",
        type=number(float, minimum=0.0, maximum=1.0),
        default=None,
        metavar="RATE",
        help="also score a copy whose ASCII words are misspelt with probability RATE "
        "(drop / add / swap / keyboard typo, as CharBERT's robustness test)",
    )
    evaluate.add_argument(
        "--noise-seed",
        type=number(int, minimum=0),
        default=0,
        metavar="N",
        help="seed of the --noise attack (default 0)",
    )

    predict = add_model_command(
        actions, "predict", 'tag text: JSONL {"text", "entities": [{start, end, label, text, score}]}', "ner", _predict
    )
    source = predict.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", default=None, help="one text to tag")
    source.add_argument(
        "--input",
        default=None,
        metavar="FILE",
        help='.jsonl ({"text"} per line, "id" optional) or .txt (one text per line)',
    )
    predict.add_argument("--output", default=None, metavar="FILE", help="JSONL output (default: stdout)")
    predict.add_argument(
        "--flat", action="store_true", help="non-overlapping entities (highest score first) instead of nested"
    )
    predict.add_argument(
        "--threshold", type=number(float), default=None, help="logit threshold (default: the recipe's, 0)"
    )

    genia = actions.add_parser(
        "genia",
        help="GENIA 3.02 XML archive + document splits → nested jsonlines (yhcc's format)",
        description="Convert the official GENIA 3.02 term corpus (GENIAcorpus3.02.tgz) into "
        "yhcc/CNN_Nested_NER's nested jsonlines: DNA, RNA, protein, cell_line, "
        "cell_type; one OUT/<split>.jsonlines per SPLITS/<split>.txt of MEDLINE ids.",
    )
    genia.add_argument("archive", help="GENIAcorpus3.02.tgz (or the GENIAcorpus3.02.xml inside it)")
    genia.add_argument("--splits", required=True, metavar="DIR", help="a directory with train.txt / dev.txt / test.txt")
    genia.add_argument("--out", required=True, metavar="DIR", help="where to write <split>.jsonlines")
    genia.set_defaults(run=_genia)
