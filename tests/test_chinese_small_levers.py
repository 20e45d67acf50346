"""examples/chinese_small_levers/: the suites RESULTS.md's chinese-small lever tables came from read with the
embedded data, each task being the baseline's (chinese-small's tasks before TNEWS took LP-FT) with the one lever its
name says."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from helpers import REPO
from spanlm.evaluate.suite import load_suite

FOLDER = REPO / "examples" / "chinese_small_levers"
# the lever suites (tnews-shipped.yaml is the shipped task itself, for other encoders)
SUITES = sorted(path for path in FOLDER.glob("*.yaml") if path.stem != "tnews-shipped")


@functools.cache
def baselines() -> dict:
    """The baseline tasks, by name: TNEWS's (in tnews-probe.yaml) and CMRC 2018's (in cmrc-levers.yaml)."""
    return {
        t.name: t for name in ("tnews-probe", "cmrc-levers") for t in load_suite(str(FOLDER / f"{name}.yaml")).tasks
    }


def lever(task) -> dict:
    """What a lever task changes against the baseline task of its kind."""
    shipped = baselines()["tnews" if task.kind == "cls" else "cmrc-baseline"]
    changes = {}
    for section in ("train", "model"):
        mine, theirs = vars(getattr(task.recipe, section)), vars(getattr(shipped.recipe, section))
        changes |= {f"{section}.{k}": v for k, v in mine.items() if v != theirs[k] and k != "output_dir"}
    return changes


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_each_lever_suite_reads_and_changes_what_its_tasks_say(path: Path):
    suite = load_suite(str(path))
    assert suite.tasks and suite.seeds == (0, 1, 2)
    expected = {
        "tnews": {},
        "tnews-frozen": {},
        "tnews-probe100": {"train.probe_steps": 100},
        "tnews-reinit-1": {"model.reinit_layers": 1},
        "tnews-layer-decay": {"train.layer_decay": 0.8},
        "tnews-dropout-3": {"model.dropout": 0.3},
        "tnews-probe-split": {"train.lr": 3e-3, "train.encoder_lr": 1e-4, "train.probe_steps": 100},
        "tnews-longer": {"train.max_steps": 600, "train.save_every": 600, "train.warmup_steps": 60},
        "tnews-lr-1e-3": {"train.lr": 1e-3},
        "tnews-probe-split-longer": {
            "train.max_steps": 600,
            "train.save_every": 600,
            "train.warmup_steps": 60,
            "train.lr": 3e-3,
            "train.encoder_lr": 1e-4,
            "train.probe_steps": 300,
        },
        "cmrc-baseline": {},
        "cmrc-probe100": {"train.probe_steps": 100},
        "cmrc-layer-decay": {"train.layer_decay": 0.8},
        "cmrc-reinit-1": {"model.reinit_layers": 1},
        "cmrc-800": {"train.max_steps": 800, "train.save_every": 800, "train.warmup_steps": 80},
    }
    for task in suite.tasks:
        assert lever(task) == expected[task.name], task.name
        assert task.arms == (("frozen",) if task.name == "tnews-frozen" else ("fine-tuned",))
        assert Path(task.recipe.data.train).is_file() and Path(task.recipe.data.dev).is_file()


def same_settings(task, other) -> None:
    for section in ("train", "model", "cls", "data"):
        mine, theirs = vars(getattr(task.recipe, section)), vars(getattr(other.recipe, section))
        assert {k: v for k, v in mine.items() if k != "output_dir"} == {
            k: v for k, v in theirs.items() if k != "output_dir"
        }, section


def test_chinese_small_tnews_is_the_lp_ft_lever():
    """The shipped suite's TNEWS task fine-tunes as the LP-FT lever with split rates that RESULTS.md measured."""
    (lever_task,) = [t for t in load_suite(str(FOLDER / "tnews-levers.yaml")).tasks if t.name == "tnews-probe-split"]
    shipped = {task.kind: task for task in load_suite("chinese-small").tasks}["cls"]
    same_settings(lever_task, shipped)


def test_tnews_shipped_is_chinese_small_tnews_task():
    """tnews-shipped.yaml (RESULTS.md's titles-only encoder) runs the shipped suite's TNEWS task, both arms."""
    (task,) = load_suite(str(FOLDER / "tnews-shipped.yaml")).tasks
    shipped = {task.kind: task for task in load_suite("chinese-small").tasks}["cls"]
    same_settings(task, shipped)
    assert (task.name, task.arms, task.metric) == (shipped.name, shipped.arms, shipped.metric)
