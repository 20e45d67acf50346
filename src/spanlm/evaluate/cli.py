"""`spanlm eval SUITE --encoders NAME=DIR … [--seeds …] [--out DIR]`."""

from __future__ import annotations

import argparse
import json

from spanlm.cli_support import log, number


def _eval(args: argparse.Namespace) -> int:
    from spanlm.evaluate import run_suite

    results = run_suite(
        args.suite,
        args.encoders,
        args.out,
        args.seeds,
        args.baseline,
        args.jobs,
        force=args.force,
        log=log,
        keep_predictions=args.keep_predictions,
    )
    failed = [c for c in results["cells"] if c.get("status") == "failed"]
    print(
        json.dumps({"results": str(args.out) + "/results.json", "failed": len(failed), "stopped": results["stopped"]})
    )
    if results["stopped"]:
        log(f"spanlm eval: stopped by {results['stopped']}; run the same command again to finish the suite")
        return 1
    if failed:
        log(f"spanlm eval: {len(failed)} cell(s) failed (their logs: results.json, 'directory'/log.txt)")
        return 1
    return 0


def add_eval_command(commands) -> None:
    command = commands.add_parser(
        "eval",
        help="did pretraining help? fine-tune several encoders on a suite of tasks over seeds, with intervals",
        description="Fine-tune every encoder on every task of SUITE (a YAML file, or a shipped suite: "
        "`spanlm recipes list` shows eval/…) for each seed and arm, one `spanlm KIND train` per cell, then "
        "report each encoder's mean ± sd and its paired difference from the baseline with a 95%% interval "
        "(OUT/results.json, report.md, report.html). Finished cells are kept: rerunning continues a stopped "
        "suite and reruns only the cells whose settings changed.",
    )
    command.add_argument("suite", help="a suite file, or a shipped suite's name (demo, english-small, …)")
    command.add_argument(
        "--encoders",
        nargs="+",
        action="extend",  # given twice, both lists: the duplicate checks see every name
        required=True,
        metavar="NAME=DIR",
        help="the encoders to compare: NAME=DIR (a Hugging Face encoder directory: a spanlm export, a hub "
        "checkpoint) or NAME=random:DIR (DIR's architecture and tokenizer, freshly initialised)",
    )
    command.add_argument(
        "--seeds",
        type=number(int, minimum=0, setting="seed"),
        nargs="+",
        action="extend",
        default=None,
        metavar="SEED",
        help="default: the suite's",
    )
    command.add_argument(
        "--baseline",
        nargs="+",
        action="extend",
        default=None,
        metavar="NAME",
        help="the encoder compared against (default: the suite's, else the first random:); ENCODER=NAME gives "
        "one encoder its own (an encoder of another architecture against its own random init)",
    )
    command.add_argument("--out", default="runs/eval", help="output directory (default runs/eval)")
    command.add_argument(
        "--jobs",
        type=number(int, minimum=1),
        default=None,
        help="cells at a time (default: one per core on a CPU, one on a GPU)",
    )
    command.add_argument("--force", action="store_true", help="rerun every cell, finished or not")
    command.add_argument(
        "--keep-predictions",
        action="store_true",
        help="write each cell's dev predictions into its folder (predictions.jsonl; finished cells too)",
    )
    command.set_defaults(run=_eval)
