"""bench/train_step_modern.py runs: a one-step run on the embedded books prints one JSON line with the ratios."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow  # runs the bench script in a subprocess

SCRIPT = REPO / "bench" / "train_step_modern.py"


# Each objective once and each mode once (the eager MLM step is the compiled one's, uncompiled)
@pytest.mark.parametrize("objective, compiled", [("spanbert", False), ("mlm", True)])
def test_a_one_step_run_prints_the_ratio_against_the_peer_and_bert(objective, compiled, tmp_path):
    command = [sys.executable, str(SCRIPT), "--seq", "32", "--steps", "1", "--warmup", "0", "--batch", "2"]
    command += ["--batches", "1", "--data", "data/corpus", "--work", str(tmp_path), "--vocab", "2000"]
    command += ["--objective", objective, *(["--compile"] if compiled else [])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = result.stdout.splitlines()
    output = json.loads(line)
    assert output["bench"] == "train_step_modern" and output["ratio"] > 0 and output["flops_ratio_vs_bert"] > 0
    assert output["compile"] is compiled
    runs = output["results"]
    assert (
        (runs["modernbert"]["targets_sbo"] > 0) == (objective == "spanbert")
        and runs["peer"]["targets_sbo"] == 0
        and runs["peer"]["targets_mlm"] > 0
    )
    assert all(math.isfinite(loss) for side in runs.values() for loss in side["loss_first_last"])
