"""bench/eval_cells.py: a suite's cells forked from the preloaded server against fresh interpreters, one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow  # two suites of cells, one started from fresh interpreters


def test_one_suite_each_way_prints_the_ratio(tmp_path):
    command = [sys.executable, str(REPO / "bench" / "eval_cells.py"), "--repeats", "1", "--seeds", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = result.stdout.splitlines()
    output = json.loads(line)
    assert output["bench"] == "eval_cells" and output["cells"] == 2
    assert output["forked_s"] > 0 and output["fresh_s"] > 0
    assert output["ratio"] == pytest.approx(output["fresh_s"] / output["forked_s"], rel=0.02)
