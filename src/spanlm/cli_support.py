"""What the `spanlm` subcommand modules (spanlm.cli, spanlm.ner.cli, spanlm.qa.cli) share: the training
command, the commands on an exported model, and where their output goes."""

from __future__ import annotations

import sys
from collections.abc import Callable


def log(message: str) -> None:
    """Progress and notices go to stderr; stdout carries only the command's JSON result."""
    print(message, file=sys.stderr)


def add_training_command(
    actions,
    name: str,
    help: str,
    recipe_example: str,
    override_examples: str,
    run: Callable,
    description: str | None = None,
):
    """A ``NAME RECIPE [OVERRIDES…] [--resume auto|PATH]`` subcommand (pretrain, ner train, qa train)."""
    command = actions.add_parser(name, help=help, description=description)
    command.add_argument("recipe", help=f"a YAML recipe, e.g. {recipe_example}")
    command.add_argument("overrides", nargs="*", help=f"dotted overrides, e.g. {override_examples}")
    command.add_argument(
        "--resume",
        default=None,
        metavar="auto|PATH",
        help="auto: the latest complete checkpoint of train.output_dir; or a checkpoint / run directory",
    )
    command.add_argument(
        "--resume-weights-only",
        default=None,
        metavar="PATH",
        dest="weights_from",
        help="start a new run (in another train.output_dir) from the weights of this checkpoint / run "
        "directory: new optimiser, schedule and data position, any settings may differ",
    )
    command.set_defaults(run=run)
    return command


def add_model_command(actions, name: str, help: str, task: str, run: Callable):
    """A ``NAME MODEL [--batch-size N] [--device D]`` subcommand on an exported fine-tuned model (``ner`` / ``qa``
    ``eval`` and ``predict``); the caller adds the command's own arguments."""
    command = actions.add_parser(name, help=help)
    command.add_argument("model", help=f"the model/ directory of a `spanlm {task} train` run")
    command.add_argument("--batch-size", type=int, default=32, help="windows per forward pass (default 32)")
    command.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    command.set_defaults(run=run)
    return command


def write_lines_or_stdout(lines: list[str], output: str | None, what: str) -> None:
    """JSON lines (each ending in a newline) to ``output``, or to stdout when it is None."""
    if output:
        from pathlib import Path

        from spanlm.files import write_text_atomically

        write_text_atomically(Path(output), "".join(lines))  # whole, or the previous file as it was
        log(f"wrote {len(lines)} {what} to {output}")
    else:
        sys.stdout.writelines(lines)
