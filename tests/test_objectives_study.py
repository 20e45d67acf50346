"""docs/results/objectives_study.py runs: --quick pretrains two objectives for a few steps, runs the four NER
arms per seed through the spanlm CLI, and writes study.json and the markdown table from those runs."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from helpers import REPO

SCRIPT = REPO / "docs" / "results" / "objectives_study.py"


@pytest.mark.slow
def test_the_quick_study_writes_every_arm_per_seed_and_the_table(tmp_path):
    out, seeds = tmp_path / "study", [3]  # one seed: every stage is a subprocess (~5 s to start)
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--quick", "--seeds", *map(str, seeds)]
    # No OMP_NUM_THREADS: the script gives each of its two processes at a time half the cores (a thread per
    # core each, they spin-wait on one another and run several times slower).
    environment = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]

    study = json.loads((out / "study.json").read_text(encoding="utf-8"))
    assert study["seeds"] == seeds and list(study["objectives"]) == ["spanbert", "charbert"]
    assert study["threads_per_process"] == max(1, os.cpu_count() // 2)
    for name, row in study["objectives"].items():
        # CharBERT's export is a different architecture from SpanBERT's: each has its own random-init arms.
        assert row["random_init_from"] == name
        assert 0 <= row["mlm_accuracy"] <= 1 and 0 < row["unigram_accuracy"] < 1
        assert set(row["f1"]) == {"pretrained_fine-tuned", "random_fine-tuned", "pretrained_frozen", "random_frozen"}
        for key, values in row["f1"].items():
            assert len(values) == len(seeds) and all(0 <= f1 <= 100 for f1 in values)
            # every F1 is the one the arm's own run wrote
            init, arm = key.split("_")
            for seed, f1 in zip(seeds, values):
                scores = json.loads((out / "ner" / f"{name}-{init}-{arm}-seed{seed}" / "eval.json").read_text())
                assert f1 == scores["micro"]["f1"]
        for arm in ("fine-tuned", "frozen"):
            gaps = [p - r for p, r in zip(row["f1"][f"pretrained_{arm}"], row["f1"][f"random_{arm}"])]
            assert row[f"gap_{arm}"] == pytest.approx({"mean": statistics.fmean(gaps), "sd": 0.0})
    # CharBERT's encoder has 64 positions: its NER runs use windows of 64, the others the recipe's 128.
    charbert_config = (out / "ner" / "charbert-random-frozen-seed3" / "config.yaml").read_text(encoding="utf-8")
    assert "max_len: 64" in charbert_config and "seed: 3" in charbert_config
    assert "max_len: 128" in (out / "ner" / "spanbert-pretrained-fine-tuned-seed3" / "config.yaml").read_text()

    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(study["objectives"])
    assert table[0].startswith("| objective | MLM acc") and all(line.count("|") == 7 for line in table)
    assert table[2].startswith("| spanbert | ") and table[3].startswith("| charbert | ")
