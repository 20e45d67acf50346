"""examples/curriculum_study.sh, small: a three-phase curriculum of a few steps, then `spanlm eval` of its phase
exports and a random init, each against the extension's export."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from helpers import NER_FIXTURES, REPO

pytestmark = pytest.mark.slow  # pretraining and fine-tuning runs in subprocesses


def test_the_phase_exports_are_compared_with_the_extension(study_environment, tmp_path):
    recipe = yaml.safe_load((REPO / "configs" / "pretrain" / "ettin_modernbert.yaml").read_text(encoding="utf-8"))
    recipe["data"]["inputs"] = [str(REPO / "data" / "corpus" / "alice_in_wonderland.txt")]
    recipe["data"]["prepared_dir"] = str(tmp_path / "prepared")
    recipe["tokenizer"]["vocab_size"] = 1000
    recipe["model"] |= {"hidden_size": 32, "intermediate_size": 48}
    recipe["train"] |= {"batch_size": 4, "warmup_steps": 1, "eval_every": 0, "save_every": 2, "num_workers": 0}
    for phase, steps in zip(recipe["phases"], (2, 1, 1)):
        phase["steps"] = steps
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    suite = {
        "seeds": [0],
        "tasks": [
            {
                "name": "wnut-mini",
                "kind": "ner",
                "recipe": str(REPO / "configs" / "ner" / "wnut17.yaml"),
                "metric": "f1",
                "settings": {
                    "data.train": str(NER_FIXTURES / "wnut_train_mini.conll"),
                    "data.dev": str(NER_FIXTURES / "wnut_dev_mini.conll"),
                    "data.max_len": 32,
                    "data.stride": 8,
                    "train.max_steps": 2,
                    "train.batch_size": 4,
                    "train.num_workers": 0,
                    "train.device": "cpu",
                },
            }
        ],
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite), encoding="utf-8")
    environment = {
        **study_environment,
        "RECIPE": str(tmp_path / "recipe.yaml"),
        "SUITE": str(tmp_path / "suite.yaml"),
        "SEEDS": "0",
    }
    result = subprocess.run(
        ["bash", str(REPO / "examples" / "curriculum_study.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "eval" / "results.json").read_text(encoding="utf-8"))
    rows = {row["encoder"]: row for row in results["tasks"][0]["arms"][0]["encoders"]}
    assert set(rows) == {"pretrain", "extend", "decay", "random"} and "difference" not in rows["extend"]
    assert {rows[name]["difference"]["baseline"] for name in ("pretrain", "decay", "random")} == {"extend"}
