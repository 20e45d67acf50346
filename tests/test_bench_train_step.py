"""bench/train_step.py runs: a one-step run on the embedded books prints one JSON line with the ratio and MFU."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from helpers import REPO, measured

pytestmark = pytest.mark.slow  # runs the bench script in a subprocess

SCRIPT = REPO / "bench" / "train_step.py"


def test_a_one_step_run_prints_the_ratio_against_the_peer(tmp_path):
    command = [sys.executable, str(SCRIPT), "--seqs", "32", "--steps", "1", "--warmup", "0", "--batch", "2"]
    command += ["--batches", "1", "--peak-size", "64", "--data", "data/corpus", "--work", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = result.stdout.splitlines()
    output = json.loads(line)
    # (the MFU of a 64² matmul peak means nothing, only that it is computed)
    assert output["bench"] == "train_step" and measured(output["ratio"]) and measured(output["mfu"])
    (run,) = output["results"]
    assert run["seq"] == 32 and run["spanlm"]["targets_sbo"] > 0
    assert all(math.isfinite(loss) for side in ("spanlm", "peer") for loss in run[side]["loss_first_last"])
