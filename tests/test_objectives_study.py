"""examples/objectives_study.sh runs: with a few steps it pretrains two objectives of different architectures,
then `spanlm eval` compares each with the random init of its own architecture; a rerun keeps everything."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import REPO, external_data

SCRIPT = REPO / "examples" / "objectives_study.sh"


def run_study(environment: dict, out: Path, task: str, **budget: str) -> subprocess.CompletedProcess:
    environment = {**environment, "STEPS": "6", "SEEDS": "3", "NER_STEPS": "4", "QA_STEPS": "4", "JOBS": "2", **budget}
    return subprocess.run(
        ["bash", str(SCRIPT), str(out), task], capture_output=True, text=True, timeout=900, env=environment
    )


def scored_cells(results: dict) -> dict:
    return {(c["encoder"], c["arm"]): c for c in results["cells"] if "score" in c}


@pytest.mark.slow
def test_the_quick_ner_study_compares_each_objective_with_its_own_random_init(study_environment, tmp_path):
    out = tmp_path / "study"
    # the fine-tuned arm here, the frozen one in the QA study's test: the same script writes both
    result = run_study(study_environment, out, "ner", OBJECTIVES="spanbert charbert", DEV="50", ARMS="fine-tuned")
    assert result.returncode == 0, result.stderr[-3000:]

    results = json.loads((out / "eval" / "results.json").read_text(encoding="utf-8"))
    assert results["seeds"] == [3]
    # CharBERT is its own architecture: compared with its own random init, the BERT objective with `random`
    assert results["baselines"] == {
        "spanbert": "random-spanbert",
        "charbert": "random-charbert",
        "random-spanbert": "random-spanbert",
        "random-charbert": "random-charbert",
    }
    cells = scored_cells(results)
    names = ("spanbert", "charbert", "random-spanbert", "random-charbert")
    assert set(cells) == {(name, "fine-tuned") for name in names}
    for (name, arm), cell in cells.items():
        recipe = yaml.safe_load((Path(cell["directory"]) / "recipe.yaml").read_text(encoding="utf-8"))
        # the demo's comparison in CharBERT's 64-token windows, on the first DEV dev sentences
        assert recipe["data"]["max_len"] == 64 and recipe["train"]["max_steps"] == 4 and recipe["seed"] == 3
        assert recipe["data"]["train_docs"] == 500 and recipe["model"]["frozen"] is False
        assert recipe["model"]["path"] == str(
            out / "export" / name.removeprefix("random-").replace("random", "spanbert")
        )
    dev = (out / "text" / "dev.conll").read_text(encoding="utf-8")
    assert len([record for record in dev.split("\n\n") if record.strip()]) == 50
    (arm,) = [a for a in results["tasks"][0]["arms"] if a["arm"] == "fine-tuned"]
    rows = {row["encoder"]: row for row in arm["encoders"]}
    assert rows["charbert"]["difference"]["baseline"] == "random-charbert"
    assert rows["charbert"]["difference"]["mean"] == pytest.approx(
        cells["charbert", "fine-tuned"]["score"] - cells["random-charbert", "fine-tuned"]["score"]
    )
    assert "difference" not in rows["random-charbert"] and "difference" not in rows["random-spanbert"]
    # the pretraining text: the embedded unlabelled sentences and the training sentences, cased
    pretrain = yaml.safe_load((out / "pretrain" / "spanbert" / "config.yaml").read_text(encoding="utf-8"))
    assert [Path(p).name for p in pretrain["data"]["inputs"]] == ["unlabelled.txt.gz", "train_sentences.txt"]
    assert pretrain["tokenizer"]["lowercase"] is False and pretrain["train"]["max_steps"] == 6
    assert (out / "eval" / "report.md").is_file()

    # A rerun keeps every pretraining run and cell.
    exported = {name: (out / "export" / name / "config.json").stat().st_mtime_ns for name in ("spanbert", "charbert")}
    rerun = run_study(study_environment, out, "ner", OBJECTIVES="spanbert charbert", DEV="50", ARMS="fine-tuned")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "4 of 4 cells already finished" in rerun.stderr
    assert exported == {name: (out / "export" / name / "config.json").stat().st_mtime_ns for name in exported}


CMRC = external_data("cmrc2018")


@pytest.mark.slow
@pytest.mark.skipif(not CMRC.is_dir(), reason="needs external/cmrc2018 and external/chinese_text (data/README.md)")
def test_the_quick_qa_study_pretrains_on_chinese_text_and_scores_cmrc(study_environment, tmp_path):
    out = tmp_path / "study"
    result = run_study(
        study_environment, out, "qa", OBJECTIVES="spanbert", DEV="40", EXTERNAL=str(CMRC.parent), ARMS="frozen"
    )
    assert result.returncode == 0, result.stderr[-3000:]

    cells = scored_cells(json.loads((out / "eval" / "results.json").read_text(encoding="utf-8")))
    assert set(cells) == {(name, "frozen") for name in ("spanbert", "random-spanbert")}
    for cell in cells.values():
        assert cell["scores"]["metric"] == "cmrc2018" and cell["scores"]["questions"] == 40
        recipe = yaml.safe_load((Path(cell["directory"]) / "recipe.yaml").read_text(encoding="utf-8"))
        assert recipe["model"]["frozen"] is True
        assert (recipe["data"]["max_length"], recipe["data"]["doc_stride"], recipe["data"]["max_query_length"]) == (
            64, 48, 16,
        )  # fmt: skip
    # pretraining text: the novels and the trial contexts, never dev text; the Chinese recipe's tokenizer and words
    trial = json.loads((REPO / "data/qa/cmrc2018/train.json").read_text(encoding="utf-8"))
    contexts = (out / "text" / "cmrc2018_trial_contexts.txt").read_text(encoding="utf-8")
    assert contexts == "".join(
        dict.fromkeys(p["context"].strip() + "\n" for a in trial["data"] for p in a["paragraphs"])
    )
    pretrain = yaml.safe_load((out / "pretrain" / "spanbert" / "config.yaml").read_text(encoding="utf-8"))
    assert sorted(Path(p).name for p in pretrain["data"]["inputs"]) == sorted(
        [
            *(p.name for p in (CMRC.parent / "chinese_text/classical_novels").glob("*.txt")),
            "cmrc2018_trial_contexts.txt",
        ]
    )
    assert pretrain["data"]["words"] == "jieba" and pretrain["tokenizer"]["vocab_size"] == 6000


def test_the_qa_study_names_the_missing_dataset_in_one_line(study_environment, tmp_path):
    result = run_study(study_environment, tmp_path / "study", "qa", EXTERNAL=str(tmp_path))
    assert result.returncode == 2 and not (tmp_path / "study").exists()
    assert result.stderr.strip().splitlines() == [
        f"objectives_study.sh: {tmp_path}/cmrc2018/cmrc2018_dev.squad.json: not found; qa needs external/ "
        "(data/README.md)"
    ]
