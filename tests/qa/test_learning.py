"""The learning test: a tiny encoder fine-tuned on a handful of CMRC 2018 questions answers them all."""

from __future__ import annotations

import json

import pytest

from spanlm.config import from_dict
from spanlm.qa.config import QARecipe
from spanlm.qa.task import train_qa


def tiny_recipe(encoder_dir, data, output_dir, **sections) -> QARecipe:
    recipe = {
        "seed": 0,
        "model": {"path": str(encoder_dir), "dropout": 0.0},
        "data": {"train": str(data), "dev": str(data), "max_length": 128, "doc_stride": 64, "max_query_length": 32},
        "qa": {"metric": "cmrc2018", "max_answer_length": 30},
        "train": {
            "output_dir": str(output_dir),
            "max_steps": 200,
            "batch_size": 8,
            "lr": 2e-3,
            "warmup_steps": 10,
            "eval_every": 0,
            "save_every": 1000,
            "log_every": 50,
            "num_workers": 0,
            "device": "cpu",
        },
        "logging": {"report_to": [], "progress": False},
    }
    for name, values in sections.items():
        recipe[name] = {**recipe.get(name, {}), **values}
    return from_dict(QARecipe, recipe)


@pytest.mark.slow
def test_tiny_encoder_overfits_a_handful_of_questions(qa_encoder_dir, qa_fixtures, tmp_path):
    recipe = tiny_recipe(qa_encoder_dir, qa_fixtures / "cmrc2018_sample.json", tmp_path / "run")
    run_dir, result = train_qa(recipe, log=lambda *_: None)
    assert result["questions"] == 6
    assert result["em"] == 100.0 and result["f1"] == 100.0, result
    assert json.loads((run_dir / "eval.json").read_text())["em"] == 100.0
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.1 * losses[0]
