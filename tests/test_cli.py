"""The command line as a shell user types it: overrides anywhere after the recipe, options between them."""

from __future__ import annotations

import pytest

import spanlm.cli
from spanlm.cli import main


@pytest.fixture
def pretrain_args(monkeypatch):
    """What `spanlm pretrain …` hands its command, recorded instead of training."""
    seen = []
    monkeypatch.setattr(spanlm.cli, "_pretrain", lambda args: seen.append(args) or 0)
    return seen


def test_overrides_after_an_option_are_overrides(pretrain_args):
    argv = ["pretrain", "r.yaml", "train.output_dir=runs/new", "--resume-weights-only", "runs/old", "train.max_steps=2"]
    assert main(argv) == 0
    (args,) = pretrain_args
    assert args.overrides == ["train.output_dir=runs/new", "train.max_steps=2"] and args.weights_from == "runs/old"
    assert main(["pretrain", "r.yaml", "--resume", "auto", "train.max_steps=600"]) == 0
    assert pretrain_args[1].overrides == ["train.max_steps=600"] and pretrain_args[1].resume == "auto"


@pytest.mark.parametrize("extra", ["--no-such-option", "stray"])
def test_what_no_command_takes_is_still_refused(pretrain_args, extra, capsys):
    with pytest.raises(SystemExit) as error:
        main(["pretrain", "r.yaml", "--resume", "auto", extra])
    assert error.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err and not pretrain_args


def test_a_command_without_overrides_takes_none_after_its_options(capsys):
    with pytest.raises(SystemExit) as error:
        main(["export", "runs/x", "--out", "runs/y", "train.max_steps=2"])
    assert error.value.code == 2 and "unrecognized arguments: train.max_steps=2" in capsys.readouterr().err
