"""`spanlm demo --quick` end to end: every stage runs and the report holds its sections and finite numbers."""

from __future__ import annotations

import json
import math

import pytest

from spanlm.cli import main


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["report"] == str(out / "report.html")

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    pretrain = summary["pretrain"]
    assert {"mlm_loss", "sbo_loss", "mlm_accuracy", "sbo_accuracy"} <= set(pretrain)
    assert all(math.isfinite(v) for v in pretrain.values())
    micro = summary["ner"]["micro"]
    assert all(math.isfinite(micro[k]) and 0 <= micro[k] <= 1 for k in ("precision", "recall", "f1"))
    assert micro["n_gold"] == 836  # the whole WNUT-17 dev set is scored
    assert set(summary["ner"]["per_type"]) == {"corporation", "creative-work", "group", "location", "person", "product"}
    assert len(summary["predictions"]) == 4
    for item in summary["predictions"]:
        for entity in item["entities"]:  # predicted offsets point at the predicted text
            assert item["text"][entity["start"]:entity["end"]] == entity["text"]

    page = (out / "report.html").read_text(encoding="utf-8")
    for section in ("<h2>Summary</h2>", "Pretraining loss (MLM and SBO parts)", "NER training loss",
                    "NER F1 per type", "<h2>Predictions</h2>", "pretrain/report.html", "ner/report.html"):
        assert section in page
    for image in ("pretrain/loss.png", "ner/loss.png", "ner_f1_per_type.png"):
        assert (out / image).stat().st_size > 1000
    # The exported encoder is a plain Hugging Face directory.
    from transformers import AutoModel

    AutoModel.from_pretrained(str(out / "encoder"))
