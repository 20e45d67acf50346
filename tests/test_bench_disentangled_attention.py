"""bench/disentangled_attention.py: a small run prints one JSON line per length, the two models' step times and
their ratio."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import REPO, measured

pytestmark = pytest.mark.slow  # runs the bench in a subprocess

SCRIPT = REPO / "bench" / "disentangled_attention.py"


def test_a_small_run_prints_each_lengths_ratio():
    command = [sys.executable, str(SCRIPT), "--seq", "32", "64", "--batch", "4", "--hidden", "32", "--steps", "2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["seq"] for line in lines] == [32, 64] and [line["batch"] for line in lines] == [4, 2]
    for line in lines:
        assert line["spanlm_path"] == "sdpa" and line["device"] == "cpu"
        steps = line["median_step_s"]
        assert measured(steps["transformers"]) and measured(steps["spanlm"])
        assert line["ratio"] == pytest.approx(steps["transformers"] / steps["spanlm"], rel=0.01)
