"""One output guard for every command: no output is an input, lies inside one or holds one (spanlm.files.guard_outputs).

The table names every `spanlm` command and each output it writes; a command added to the parser without a row here
fails ``test_every_command_has_its_outputs_in_the_table``, and each row is run with its output aimed at an input:
exit 2, one line naming the output option and the input, nothing written.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from spanlm.cli import build_parser, main
from spanlm.recipes import shipped_root


def leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[str]:
    """Every runnable command of ``parser`` ("pretrain", "ner train", "recipes copy"…)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += leaf_commands(sub, (*prefix, name))
    return found or [" ".join(prefix)]


class Case:
    """What a case builds in its temporary directory: inputs to aim an output at."""

    def __init__(self, tmp: Path, encoder: Path):
        self.tmp, self.encoder = tmp, encoder

    def file(self, name: str, text: str = "x\n") -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def folder(self, name: str) -> Path:
        path = self.tmp / name
        (path / "config.json").parent.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text("{}\n", encoding="utf-8")
        return path

    def recipe(self, data: dict) -> Path:
        return self.file("recipe.yaml", yaml.safe_dump(data))

    def finetune(self, output_dir: Callable[[Path, Path], Path]) -> Path:
        """A fine-tuning recipe whose train.output_dir is ``output_dir(encoder, data file)``."""
        encoder, train = self.folder("encoder"), self.file("data/train.txt")
        data = {"train": str(train), "dev": ""}
        return self.recipe(
            {"model": {"path": str(encoder)}, "data": data, "train": {"output_dir": str(output_dir(encoder, train))}}
        )

    def pretrain(self, output_dir: Callable[[Path], Path], prepared: Callable[[Path], Path] | None = None) -> Path:
        text = self.file("corpus/book.txt")
        data = {"inputs": [str(text)], "prepared_dir": str((prepared or (lambda _: self.tmp / "prepared"))(text))}
        return self.recipe({"data": data, "train": {"output_dir": str(output_dir(text))}})


# command → [(output option, build: Case → (argv, what the error names besides the option))]; [] with the reason
# a command has no output of its own
CASES: dict[str, list[tuple[str, Callable[[Case], tuple[list, list[str]]]]]] = {
    "prepare": [
        (
            "data.prepared_dir",
            lambda c: (["prepare", c.pretrain(lambda t: c.tmp / "run", lambda t: t.parent)], ["holds", "book.txt"]),
        )
    ],
    "preview": [
        ("--jsonl", lambda c: (["preview", r := c.pretrain(lambda t: c.tmp / "run"), "--jsonl", r], ["is the input"]))
    ],
    "pretrain": [
        ("train.output_dir", lambda c: (["pretrain", c.pretrain(lambda t: t.parent)], ["holds", "data.inputs"])),
        ("train.output_dir", lambda c: (["pretrain", c.pretrain(lambda t: t / "run")], ["is inside", "data.inputs"])),
        (
            "train.output_dir",
            lambda c: (
                ["pretrain", c.pretrain(lambda t: c.tmp / "prepared" / "run")],
                ["is inside", "data.prepared_dir"],
            ),
        ),
    ],
    "export": [("--out", lambda c: (["export", f := c.folder("run"), "--out", f / "hf"], ["is inside", "checkpoint"]))],
    "report": [],  # writes its plots into the run directory it reads: that is what it is for
    "compare": [
        ("--out", lambda c: (["compare", f := c.folder("a"), "--metric", "loss", "--out", f / "x.png"], ["is inside"]))
    ],
    "demo": [("--out", lambda c: (["demo", "--out", shipped_root() / "data" / "demo"], ["is inside", "embedded"]))],
    "recipes list": [],  # prints, writes nothing
    "recipes copy": [
        (
            "DEST",
            lambda c: (
                ["recipes", "copy", "pretrain/mlm", shipped_root() / "configs" / "pretrain", "--force"],
                ["is inside", "shipped recipes"],
            ),
        )
    ],
    "eval": [
        (
            "--out",
            lambda c: (
                ["eval", "demo", "--encoders", f"tiny={c.encoder}", "--out", c.encoder / "eval"],
                ["is inside", "--encoders"],
            ),
        )
    ],
    "ner genia": [
        (
            "--out",
            lambda c: (
                [
                    "ner",
                    "genia",
                    a := c.file("GENIAcorpus3.02.xml"),
                    "--splits",
                    c.file("splits/train.txt").parent,
                    "--out",
                    a.parent,
                ],
                ["holds", "archive"],
            ),
        )
    ],
}
for task in ("ner", "qa", "cls"):
    CASES[f"{task} train"] = [
        (
            "train.output_dir",
            lambda c, t=task: ([t, "train", c.finetune(lambda e, d: e)], ["is the input", "model.path"]),
        ),
        (
            "train.output_dir",
            lambda c, t=task: ([t, "train", c.finetune(lambda e, d: e / "run")], ["is inside", "model.path"]),
        ),
        (
            "train.output_dir",
            lambda c, t=task: ([t, "train", c.finetune(lambda e, d: d.parent)], ["holds", "data.train"]),
        ),
    ]
    CASES[f"{task} predict"] = [
        (
            "--output",
            lambda c, t=task: (
                [t, "predict", c.folder("model"), "--input", i := c.file("in.jsonl"), "--output", i],
                ["is the input", "--input"],
            ),
        ),
        (
            "--output",
            lambda c, t=task: (
                [t, "predict", m := c.folder("model"), "--input", c.file("in.jsonl"), "--output", m / "p"],
                ["is inside", "MODEL"],
            ),
        ),
    ]
    CASES[f"{task} eval"] = [
        (
            "--predictions",
            lambda c, t=task: (
                [t, "eval", c.folder("model"), "--data", d := c.file("dev.txt"), "--predictions", d],
                ["is the input", "--data"],
            ),
        )
    ]
for task in ("ner", "cls"):
    CASES[f"{task} eval"].append(
        (
            "--output",
            lambda c, t=task: (
                [t, "eval", m := c.folder("model"), "--data", c.file("dev.txt"), "--output", m / "scores.json"],
                ["is inside", "MODEL"],
            ),
        )
    )

ROWS = [(command, option, build) for command, rows in CASES.items() for option, build in rows]


def test_every_command_has_its_outputs_in_the_table():
    """A command added later without a row here (its outputs guarded, or why it has none) fails this test."""
    assert sorted(leaf_commands(build_parser())) == sorted(CASES)


def snapshot(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command, option, build", ROWS, ids=[f"{c} {o} {i}" for i, (c, o, _) in enumerate(ROWS)])
def test_an_output_aimed_at_an_input_is_refused_before_anything_is_written(
    command, option, build, tmp_path, tiny_encoder_dir, capsys
):
    case = Case(tmp_path, tiny_encoder_dir)
    argv, expected = build(case)
    watched = [tmp_path, tiny_encoder_dir, shipped_root() / "configs" / "pretrain"]
    before = [snapshot(root) for root in watched]
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith(f"spanlm {argv[0]}: error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert f": {option} " in errors[0] and "the input" in errors[0] and "write it elsewhere" in errors[0], errors[0]
    for needle in expected:
        assert needle in errors[0], (needle, errors[0])
    assert [snapshot(root) for root in watched] == before
    assert not (shipped_root() / "data" / "demo").exists()


def test_an_output_beside_its_inputs_is_not_refused(tmp_path):
    """Siblings are fine: runs/export/x beside runs/pretrain/x, predictions beside the data file."""
    from spanlm.files import guard_outputs

    guard_outputs(
        {"--out": tmp_path / "export" / "x", "--output": tmp_path / "data" / "predictions.jsonl"},
        {
            "checkpoint": tmp_path / "pretrain" / "x",
            "--data": tmp_path / "data" / "dev.conll",
            "names": ["hf:conll2003"],
        },
    )
