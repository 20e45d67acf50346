"""examples/english_small_levers/: the suites behind RESULTS.md's SST-2 rows after pretraining on SST-2's own text
read with the embedded data: sst2.yaml is english-small's SST-2 task as shipped, sst2-lpft.yaml the same with the
LP-FT lever (the lever chinese-small's TNEWS runs)."""

from __future__ import annotations

from pathlib import Path

from helpers import REPO
from spanlm.evaluate.suite import load_suite

FOLDER = REPO / "examples" / "english_small_levers"


def settings(task) -> dict:
    return {
        f"{section}.{key}": value
        for section in ("train", "model", "cls", "data")
        for key, value in vars(getattr(task.recipe, section)).items()
        if key != "output_dir"
    }


def test_the_two_suites_differ_by_the_lp_ft_lever_alone():
    (before,) = load_suite(str(FOLDER / "sst2.yaml")).tasks
    (lever,) = load_suite(str(FOLDER / "sst2-lpft.yaml")).tasks
    assert before.arms == ("fine-tuned", "frozen") and lever.arms == ("fine-tuned",)
    old, new = settings(before), settings(lever)
    assert {k: (old[k], new[k]) for k in old if old[k] != new[k]} == {
        "train.encoder_lr": (1e-3, 1e-4),
        "train.probe_steps": (0, 100),
    }
    for task in (before, lever):
        assert task.name == "sst2" and Path(task.recipe.data.train).is_file() and Path(task.recipe.data.dev).is_file()


def test_english_small_sst2_is_the_suite_the_study_started_from():
    """The shipped suite's SST-2 task runs as sst2.yaml does: no lever of that study became its default."""
    (before,) = load_suite(str(FOLDER / "sst2.yaml")).tasks
    shipped = {task.kind: task for task in load_suite("english-small").tasks}["cls"]
    assert settings(shipped) == settings(before) and shipped.arms == before.arms


def test_each_lever_of_sst2_levers_changes_the_shipped_task_by_its_keys_alone():
    (shipped,) = load_suite(str(FOLDER / "sst2.yaml")).tasks
    expected = {
        "sst2-encoder-1e-4": {"train.encoder_lr": 1e-4},
        "sst2-layer-decay": {"train.layer_decay": 0.8},
        "sst2-reinit-1": {"model.reinit_layers": 1},
        "sst2-longer": {"train.max_steps": 900, "train.save_every": 900, "train.warmup_steps": 90},
        "sst2-cls-pooling": {"cls.pooling": "cls"},
    }
    suite = load_suite(str(FOLDER / "sst2-levers.yaml"))
    assert suite.seeds == (0, 1, 2) and [task.name for task in suite.tasks] == list(expected)
    old = settings(shipped)
    for task in suite.tasks:
        new = settings(task)
        assert {k: new[k] for k in new if new[k] != old[k]} == expected[task.name], task.name
        assert task.arms == ("fine-tuned",) and task.recipe.data.dev == shipped.recipe.data.dev
