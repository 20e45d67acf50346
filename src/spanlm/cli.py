"""The `spanlm` command: one subcommand table; user errors are one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spanlm.cli_support import (
    add_training_command,
    guard_outputs,
    guard_training_outputs,
    log,
    number,
    set_library_progress_bars,
)


def _prepare(args: argparse.Namespace) -> int:
    from spanlm.data.prepare import prepare
    from spanlm.data.shards import read_meta
    from spanlm.pretrain.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    inputs = {key: value for key, value in recipe.input_paths().items() if not key.startswith("data.prepared")}
    guard_outputs({"data.prepared_dir": recipe.data.prepared_dir}, {"the recipe": args.recipe, **inputs})
    set_library_progress_bars(recipe.logging.progress)
    directory = prepare(recipe, force=args.force, log=log, shard=_shard(args.shard))
    meta = read_meta(directory)
    summary = {
        key: meta[key] for key in ("n_documents", "n_sentences", "n_words", "n_tokens", "vocab_size", "dtype", "words")
    }
    summary["tokens_per_word"] = round(meta["n_tokens"] / max(meta["n_words"], 1), 3)
    summary["stats"] = meta["stats"]
    summary["prepared_dir"] = str(directory)
    print(json.dumps(summary, ensure_ascii=False))
    return 0


def _shard(text: str | None) -> tuple[int, int] | None:
    from spanlm.errors import ConfigError

    if text is None:
        return None
    index, slash, count = text.partition("/")
    if not (slash and index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise ConfigError(f"--shard {text}: expected I/N with 0 <= I < N (e.g. --shard 0/16)")
    return int(index), int(count)


def _pretrain(args: argparse.Namespace) -> int:
    from spanlm.pretrain.recipe import load_recipe
    from spanlm.pretrain.run import pretrain
    from spanlm.train.dist import is_main_process

    recipe = load_recipe(args.recipe, args.overrides)
    guard_training_outputs(args.recipe, recipe, args.resume, args.weights_from)
    run_dir = pretrain(recipe, resume=args.resume, log=log, weights_from=args.weights_from)
    if is_main_process():  # under torchrun every rank returns here; one reports
        print(json.dumps({"run_dir": str(run_dir)}))
    return 0


def _export(args: argparse.Namespace) -> int:
    from spanlm.pretrain.export import export_checkpoint

    guard_outputs({"--out": args.out}, {"the checkpoint": args.checkpoint})
    print(json.dumps({"exported": str(export_checkpoint(args.checkpoint, args.out))}))
    return 0


def _report(args: argparse.Namespace) -> int:
    from spanlm.report import write_report

    print(json.dumps({"report": str(write_report(args.run_dir))}))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from spanlm.report import compare_runs

    guard_outputs({"--out": args.out}, {"the run directories": args.run_dirs})
    print(json.dumps({"plot": str(compare_runs(args.run_dirs, args.metric, args.out, args.kind))}))
    return 0


def _preview(args: argparse.Namespace) -> int:
    from spanlm.masking.preview import preview
    from spanlm.pretrain.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    guard_outputs({"--jsonl": args.jsonl}, {"the recipe": args.recipe, **recipe.input_paths()})
    step = args.step  # step N: the N-th optimiser step, as metrics.jsonl and the log number them (from 1)
    if recipe.phases:  # the phase that trains step N, with its settings (a masking schedule counts the run's steps)
        from spanlm.errors import ConfigError
        from spanlm.pretrain.phases import phase_at

        last = recipe.train.max_steps  # the phases' steps
        if not 1 <= step <= last:
            raise ConfigError(f"--step {step}: the phases train steps 1–{last}")
        phase = phase_at(recipe, step - 1)  # phase_at counts the steps done before, from 0
        changed = ", ".join(f"{k}={v}" for k, v in phase.config.set.items()) or "the recipe's own settings"
        log(f"step {step}: phase {phase.config.name} (steps {phase.start + 1}–{phase.end}): {changed}")
        recipe = phase.recipe
    preview(recipe, n=args.n, stats_blocks=args.stats_blocks, jsonl=args.jsonl, log=log, step=step)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from spanlm.demo import F1_KEYS, run_demo
    from spanlm.recipes import shipped_root

    root = shipped_root()
    guard_outputs({"--out": args.out}, {"spanlm's embedded data": root / "data", "its recipes": root / "configs"})
    summary = run_demo(
        args.out, quick=args.quick, seeds=tuple(args.seeds), log=log, pretrain_recipe=args.pretrain_recipe
    )
    print(
        json.dumps(
            {
                "report": str(Path(args.out) / "report.html"),
                "interrupted": summary["interrupted"],
                "failed": summary["failed"],
                **{key: summary.get(key) for key in ("mlm_accuracy", "unigram_accuracy", *F1_KEYS)},
            }
        )
    )
    if summary["failed"]:
        log(f"spanlm demo: {', '.join(summary['failed'])} failed (the error is in the table above and in its log.txt)")
        return 1
    if summary["interrupted"]:
        log("spanlm demo: interrupted; the report shows the steps that ran")
        return 1
    return 0


def _recipes_list(args: argparse.Namespace) -> int:
    from spanlm.recipes import shipped_recipes, shipped_root

    recipes = shipped_recipes()
    width = max((len(recipe.name) for recipe in recipes), default=0)
    for recipe in recipes:
        print(f"{recipe.name:<{width}}  {recipe.description}")
    log(
        f"{len(recipes)} recipes in {shipped_root() / 'configs'}; `spanlm recipes copy NAME DEST` copies one to "
        "edit and run"
    )
    return 0


def _recipes_copy(args: argparse.Namespace) -> int:
    from spanlm.recipes import copy_destination, copy_recipe, shipped_root

    guard_outputs({"DEST": copy_destination(args.name, args.dest)}, {"the shipped recipes": shipped_root() / "configs"})
    print(json.dumps({"recipe": args.name, "copied": str(copy_recipe(args.name, args.dest, force=args.force))}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from spanlm import __version__

    parser = argparse.ArgumentParser(
        prog="spanlm",
        description="spanlm: span-, word- and character-aware pretraining and span-extraction fine-tuning "
        "for BERT-family encoders.",
    )
    parser.add_argument("--version", action="version", version=f"spanlm {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    prepare = commands.add_parser(
        "prepare",
        help="raw text → tokenizer + token shards (reused when up to date)",
        description="Tokenize a corpus into memmappable shards with word starts, sentence and document offsets.",
    )
    prepare.add_argument("recipe", help="a YAML recipe (its data and tokenizer sections are used)")
    prepare.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. data.inputs=[a.txt] tokenizer.vocab_size=16000"
    )
    prepare.add_argument(
        "--force",
        action="store_true",
        help="rebuild even when the prepared directory is up to date, or when that replaces its tokenizer "
        "(the runs trained on it are named)",
    )
    prepare.add_argument(
        "--shard",
        metavar="I/N",
        default=None,
        help="prepare only shard I (from 0) of N consecutive parts of the inputs, into "
        "PREPARED_DIR/shard-IIIII-of-NNNNN, five digits each (needs tokenizer.path; a run reads the shards with "
        "data.prepared_shards)",
    )
    prepare.set_defaults(run=_prepare)

    preview = commands.add_parser(
        "preview",
        help="show masked blocks and masking statistics for a recipe",
        description="Mask a few blocks with the recipe's masking scheme, print them decoded "
        "(targets and noised tokens marked), then one JSON line of statistics.",
    )
    preview.add_argument(
        "recipe", help="a YAML recipe (data, tokenizer and masking sections), e.g. configs/masking/spanbert.yaml"
    )
    preview.add_argument("overrides", nargs="*", help="dotted overrides, e.g. masking.span.p=0.3 data.max_len=256")
    preview.add_argument("--n", type=number(int, minimum=0), default=4, help="blocks to show (default 4)")
    preview.add_argument(
        "--stats-blocks", type=number(int, minimum=1), default=256, help="blocks the statistics cover (default 256)"
    )
    preview.add_argument(
        "--jsonl", default=None, metavar="FILE", help="also write the raw masked batches, one JSON line per batch"
    )
    preview.add_argument(
        "--step",
        type=number(int, minimum=1),
        default=1,
        metavar="N",
        help="mask as the N-th optimiser step does, numbered from 1 as in metrics.jsonl (default 1): at the rate "
        "masking.rate_schedule gives after N-1 steps, and with a phased recipe in the phase that trains step N",
    )
    preview.set_defaults(run=_preview)

    add_training_command(
        commands,
        "pretrain",
        "pretrain with a recipe's objective (one process or torchrun)",
        "configs/pretrain/spanbert.yaml",
        "train.max_steps=200",
        _pretrain,
        description="Train; under torchrun every process runs this same command.",
    )

    export = commands.add_parser("export", help="checkpoint → Hugging Face directory (+ heads) that AutoModel loads")
    export.add_argument("checkpoint", help="a checkpoint directory, or a run directory (its latest checkpoint)")
    export.add_argument("--out", required=True, help="the directory to write")
    export.set_defaults(run=_export, loads_a_model=True)

    report = commands.add_parser("report", help="plots and an HTML summary of a run directory")
    report.add_argument("run_dir")
    report.set_defaults(run=_report)

    compare = commands.add_parser("compare", help="one plot of several runs' metrics side by side")
    compare.add_argument("run_dirs", nargs="+")
    compare.add_argument(
        "--metric", action="append", required=True, help="a logged key, e.g. mlm_loss (repeatable: one panel each)"
    )
    compare.add_argument("--kind", choices=["train", "eval"], default="eval", help="which records (default eval)")
    compare.add_argument("--out", required=True, help="the PNG to write")
    compare.set_defaults(run=_compare)

    demo = commands.add_parser(
        "demo",
        help="the whole toolkit on the embedded data: pretrain → NER from it and from random init → report",
        description="Pretrain a tiny CharBERT on the text of the embedded GermEval 2014 NER data, train "
        "GlobalPointer NER on a few hundred of its labelled sentences from that encoder and from a random "
        "initialisation with the same budget (each fine-tuned whole and with the encoder frozen), evaluate "
        "them, and write OUT/report.html and OUT/summary.json, from the recipes and data installed with "
        "spanlm (any working directory).",
    )
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    demo.add_argument("--quick", action="store_true", help="the one-minute smoke version (a few steps per stage)")
    demo.add_argument(
        "--seeds",
        type=number(int, minimum=0, setting="seed"),
        nargs="+",
        default=[0],
        metavar="SEED",
        help="run the comparison once per seed (in OUT/seed-N) and report mean and spread (default: 0)",
    )
    demo.add_argument(
        "--pretrain-recipe",
        default=None,
        metavar="NAME",
        help="the shipped pretraining recipe whose encoder the demo pretrains (`spanlm recipes list`; default "
        "pretrain/charbert, e.g. pretrain/spanbert); the demo sets its text and budget",
    )
    demo.set_defaults(run=_demo)

    recipes = commands.add_parser(
        "recipes",
        help="the recipes installed with spanlm: list them, copy one to edit and run",
        description="The recipes of the repository's configs/, installed with the package "
        "(with the embedded data they read).",
    )
    actions = recipes.add_subparsers(dest="recipes_command", metavar="ACTION", required=True)
    actions.add_parser("list", help="each recipe's name (e.g. pretrain/spanbert) and what it is").set_defaults(
        run=_recipes_list
    )
    copy = actions.add_parser(
        "copy",
        help="write a recipe where you can edit it, its embedded-data paths made absolute",
        description="Copy a recipe; its data/... paths become the absolute paths of the installed "
        "embedded data, so the copy runs from any directory.",
    )
    copy.add_argument("name", help="a name from `spanlm recipes list`, e.g. pretrain/spanbert")
    copy.add_argument("dest", help="the file to write, or a directory to put it in (keeping the recipe's file name)")
    copy.add_argument("--force", action="store_true", help="replace DEST if it exists")
    copy.set_defaults(run=_recipes_copy)

    from spanlm.qa.cli import add_qa_commands

    add_qa_commands(commands)

    from spanlm.ner.cli import add_ner_commands

    add_ner_commands(commands)

    from spanlm.cls.cli import add_cls_commands

    add_cls_commands(commands)

    from spanlm.evaluate.cli import add_eval_command

    add_eval_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    from spanlm.errors import SpanlmError

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides += extra  # overrides after an option (`--resume auto train.max_steps=600`) are overrides too
    elif extra:
        parser.parse_args(argv)  # argparse's own message and exit 2 for what no command takes
    if getattr(args, "loads_a_model", False):  # transformers' loading and writing bars, only on a terminal: in a
        set_library_progress_bars(sys.stderr.isatty())  # redirected log every redraw would be a line
    try:
        return args.run(args)
    except SpanlmError as error:
        print(f"spanlm {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the file system refused (a path through a file, no permission, a full disk)
        where = f"{error.filename}: " if error.filename else ""
        print(f"spanlm {args.command}: error: {where}{error.strerror or error}", file=sys.stderr)
        return 2
    except Exception as error:
        # A write the device refused, wrapped by a library in its own error type (torch.save's RuntimeError):
        # wherever it happens, one line. What writes spanlm's files names the file and what was kept itself.
        from spanlm.files import out_of_space

        if (reason := out_of_space(error)) is None:
            raise
        print(f"spanlm {args.command}: error: a write failed ({reason}); no file was half written", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"spanlm {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
