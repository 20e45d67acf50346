"""What the `spanlm` subcommand modules (spanlm.cli, spanlm.ner.cli, spanlm.qa.cli) share: the training
command, the commands on an exported model, and where their output goes."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable


def log(message: str) -> None:
    """Progress and notices go to stderr; stdout carries only the command's JSON result."""
    print(message, file=sys.stderr)


def set_library_progress_bars(enabled: bool) -> None:
    """``logging.progress: false`` silences the libraries' progress bars too (transformers' loading and saving,
    huggingface_hub's, datasets' map and load), not only spanlm's: a batch job's log stays lines, not bars."""
    if enabled:
        return
    import os

    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # read when datasets is imported
    if "datasets" in sys.modules:  # already imported: its switch
        sys.modules["datasets"].disable_progress_bars()
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # transformers' bars and huggingface_hub's


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


def number(kind: type, minimum: float | None = None, maximum: float | None = None, setting: str | None = None):
    """An argparse ``type`` for a numeric option: a finite ``kind`` (int or float) in [minimum, maximum], the
    same bounds as the config key it stands for (``setting``), so a bad value is a usage error naming the
    option rather than a ZeroDivisionError deep in the command (argparse exits 2)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = f"in [{minimum:g}, {maximum:g}]" if maximum is not None else f"at least {minimum:g}"
            raise argparse.ArgumentTypeError(f"{text} must be {bounds}" + (f", as {setting}" if setting else ""))
        return value

    return parse


def add_model_command(actions, name: str, help: str, task: str, run: Callable):
    """A ``NAME MODEL [--batch-size N] [--device D]`` subcommand on an exported fine-tuned model (``ner`` / ``qa``
    ``eval`` and ``predict``); the caller adds the command's own arguments."""
    command = actions.add_parser(name, help=help)
    command.add_argument("model", help=f"the model/ directory of a `spanlm {task} train` run")
    command.add_argument(
        "--batch-size",
        type=number(int, minimum=1, setting="train.batch_size"),
        default=32,
        help="windows per forward pass (default 32)",
    )
    command.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    command.set_defaults(run=run, loads_a_model=True)
    return command


def guard_outputs(outputs: dict, inputs: dict) -> None:
    """spanlm.files.guard_outputs, imported when a command runs (``spanlm --help`` loads no more than it needs)."""
    from spanlm.files import guard_outputs as guard

    guard(outputs, inputs)


def guard_training_outputs(recipe_file: str, recipe, resume: str | None, weights_from: str | None) -> None:
    """A training command's ``train.output_dir`` is none of what its run reads (the recipe file, the recipe's
    inputs, a ``--resume-weights-only`` checkpoint), nor inside nor around one (spanlm.files.guard_outputs).

    One exception: a resumed run may read what it keeps in its own directory — its ``config.yaml`` (the resume check
    compares it with the checkpoint's), its copy of its tokenizer (``tokenizer.path`` as a refused resume advises).
    """
    from pathlib import Path

    from spanlm.files import guard_outputs

    inputs = {"the recipe": recipe_file, **recipe.input_paths(), "--resume-weights-only": weights_from}
    if resume is not None:
        run = Path(recipe.train.output_dir).resolve()

        def kept_by_the_run(value) -> bool:
            path = Path(value).resolve() if isinstance(value, (str, Path)) and value else None
            return path is not None and path != run and path.is_relative_to(run)

        inputs = {key: value for key, value in inputs.items() if not kept_by_the_run(value)}
    guard_outputs({"train.output_dir": recipe.train.output_dir}, inputs)


def require_records(records: list, path: str | None, what: str) -> list:
    """``records`` read from a predict verb's ``--input`` ``path``, unless there are none: an empty input is one line
    naming the file (a stale ``--output`` from an earlier call would otherwise look like this call's)."""
    if not records:
        from spanlm.errors import InputError

        raise InputError(f"{path}: no {what} in it (an empty file, or only blank lines)")
    return records


def write_lines_or_stdout(lines: list[str], output: str | None, what: str) -> None:
    """JSON lines (each ending in a newline) to ``output``, or to stdout when it is None."""
    if output:
        from pathlib import Path

        from spanlm.files import write_text_atomically

        write_text_atomically(Path(output), "".join(lines))  # whole, or the previous file as it was
        log(f"wrote {len(lines)} {what} to {output}")
    else:
        sys.stdout.writelines(lines)
