"""examples/recipes_learn.py: each shipped pretraining recipe run as it ships, judged by what the run says of itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow  # pretraining runs in a subprocess


def test_a_few_steps_of_one_recipe_give_its_row_and_a_rerun_keeps_the_run(tmp_path):
    """Four steps do not leave the unigram line: the row says so and the script exits 1; the rerun trains nothing."""
    command = [sys.executable, str(REPO / "examples" / "recipes_learn.py"), str(tmp_path), "mlm"]
    environment = {**os.environ, "STEPS": "4", "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    assert first.returncode in (0, 1), first.stderr[-2000:]
    (row,) = json.loads((tmp_path / "table.json").read_text(encoding="utf-8"))
    assert row["recipe"] == "pretrain/mlm" and row["steps"] == 4
    assert 0 <= row["unigram_line"] <= 1 and 0 <= row["mlm_accuracy"] <= 1 and row["distinct_predictions"] >= 1
    assert first.returncode == (0 if row["learns"] else 1)
    assert "| pretrain/mlm | 4 |" in first.stdout
    again = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    assert again.stdout == first.stdout and "recipes_learn.py: mlm" not in again.stderr
