"""examples/finetune_levers_study.sh, small: on stand-in SST-2 and TNEWS files it pretrains both encoders, runs a
lever's suites (pretrained against random init) and prints the table of differences."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow  # pretraining and fine-tuning runs in subprocesses


def stand_in_external(root):
    """external/ as data/README.md lays it out, with 64 made-up sentences per task (two labels each)."""
    sst2 = root / "glue" / "SST-2"
    sst2.mkdir(parents=True)
    rows = [f"a {'fine' if i % 2 else 'dull'} film number {i} .\t{i % 2}" for i in range(64)]
    for split in ("train", "dev"):
        (sst2 / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    tnews = root / "tnews"
    tnews.mkdir()
    lines = [
        json.dumps({"label": "10" + str(i % 2), "label_desc": "news", "sentence": f"新闻标题第{i}条", "keywords": ""})
        for i in range(64)
    ]
    with zipfile.ZipFile(tnews / "tnews_public.zip", "w") as archive:
        archive.writestr("tnews_public/train.json", "\n".join(lines) + "\n")
    (tnews / "dev.json").write_text("\n".join(lines[:16]) + "\n", encoding="utf-8")


def test_a_lever_is_compared_on_both_tasks_and_tabled(study_environment, tmp_path):
    stand_in_external(tmp_path / "external")
    environment = {
        **os.environ,
        "EXTERNAL": str(tmp_path / "external"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # this Python's spanlm
        "STEPS": "4",
        "TASK_STEPS": "4",
        "SEEDS": "0",
        "LEVERS": "reinit-1",
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        ["bash", str(REPO / "examples" / "finetune_levers_study.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    suite = (tmp_path / "out" / "reinit-1-english.yaml").read_text(encoding="utf-8")
    assert "model.reinit_layers: 1" in suite and "train.max_steps: 4" in suite
    assert "cls.pooling: cls" in suite  # every lever but mean-pooling on the stock BERT head's [CLS]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| reinit-1 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["sst2", "tnews"]
