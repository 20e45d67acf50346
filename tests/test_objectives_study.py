"""examples/objectives_study.py runs: --quick pretrains two objectives for a few steps, runs the four NER
arms per seed through the spanlm CLI, and writes study.json and the markdown table from those runs."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from helpers import REPO, external_data

SCRIPT = REPO / "examples" / "objectives_study.py"


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


CMRC = external_data("cmrc2018")


@pytest.mark.slow
@pytest.mark.skipif(not CMRC.is_dir(), reason="needs external/cmrc2018 and external/chinese_text (data/README.md)")
def test_the_quick_qa_study_writes_every_arm_per_seed_and_the_table(tmp_path):
    out, seeds = tmp_path / "study", [3]
    command = [sys.executable, str(SCRIPT), "--task", "qa", "--out", str(out), "--quick", "--seeds", *map(str, seeds)]
    # one objective (the suite's time): CharBERT's halved windows are checked on the NER study above
    command += ["--external", str(CMRC.parent), "--objectives", "spanbert"]
    # a minute or two on an idle 2-core machine: six spanlm processes, four of them reading 1,000 questions
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]

    study = json.loads((out / "study.json").read_text(encoding="utf-8"))
    assert study["task"] == "qa" and study["seeds"] == seeds and study["threads_per_process"] is not None
    assert list(study["objectives"]) == ["spanbert"]
    # the QA training split is CMRC's trial; --quick scores the first 40 dev questions
    assert study["qa"]["train"] == str(CMRC / "cmrc2018_trial.squad.json")
    # pretraining text: the novels and the trial contexts, never dev text; the Chinese recipe's tokenizer
    trial = json.loads((CMRC / "cmrc2018_trial.squad.json").read_text(encoding="utf-8"))
    contexts = (out / "task_text" / "cmrc2018_trial_contexts.txt").read_text(encoding="utf-8")
    assert contexts == "".join(p["context"].strip() + "\n" for a in trial["data"] for p in a["paragraphs"])
    pretrain_config = (out / "pretrain" / "spanbert" / "config.yaml").read_text(encoding="utf-8")
    assert "hongloumeng.txt" in pretrain_config and "cmrc2018_trial_contexts.txt" in pretrain_config
    assert "words: jieba" in pretrain_config and "vocab_size: 6000" in pretrain_config
    assert "cmrc2018_dev" not in pretrain_config
    for name, row in study["objectives"].items():
        assert row["random_init_from"] == name
        assert 0 <= row["mlm_accuracy"] <= 1 and 0 < row["unigram_accuracy"] < 1
        for metric in ("em", "f1"):
            assert set(row[metric]) == {
                "pretrained_fine-tuned",
                "random_fine-tuned",
                "pretrained_frozen",
                "random_frozen",
            }
            for key, values in row[metric].items():
                assert len(values) == len(seeds)
                init, arm = key.split("_")
                run = f"{init}-frozen" if arm == "frozen" else init  # the demo's arm names
                for seed, value in zip(seeds, values):  # every score is the one the arm's own run wrote
                    run_dir = out / "qa" / f"{name}-{run}-seed{seed}"
                    scores = json.loads((run_dir / "eval.json").read_text())
                    assert value == scores[metric] and 0 <= value <= 100
                    assert scores["metric"] == "cmrc2018" and scores["questions"] == 40
                    assert f"frozen: {str(arm == 'frozen').lower()}" in (run_dir / "config.yaml").read_text()
            for arm in ("fine-tuned", "frozen"):
                values = row[metric]
                gaps = [p - r for p, r in zip(values[f"pretrained_{arm}"], values[f"random_{arm}"])]
                assert row[f"gap_{metric}_{arm}"] == pytest.approx({"mean": statistics.fmean(gaps), "sd": 0.0})
    windows = {name: row["qa_windows"] for name, row in study["objectives"].items()}
    assert windows["spanbert"] == {"max_length": 128, "doc_stride": 96, "max_query_length": 32}
    config = (out / "qa" / "spanbert-random-frozen-seed3" / "config.yaml").read_text(encoding="utf-8")
    assert "max_length: 128" in config and "doc_stride: 96" in config and "seed: 3" in config

    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(study["objectives"])
    assert table[0].startswith("| objective | MLM acc (unigram) | fine-tuned EM pretrained / random | gap")
    assert all(line.count("|") == 11 for line in table)
    assert table[2].startswith("| spanbert | ")


def test_the_qa_study_names_the_missing_dataset_in_one_line(tmp_path):
    command = [
        sys.executable,
        str(SCRIPT),
        "--task",
        "qa",
        "--out",
        str(tmp_path / "study"),
        "--external",
        str(tmp_path),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not (tmp_path / "study").exists()
    assert f"{tmp_path / 'cmrc2018' / 'cmrc2018_trial.squad.json'}: not found" in result.stderr.splitlines()[-1]
