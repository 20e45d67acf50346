"""A CharBERT encoder fine-tunes for QA with both channels: the head reads 2H features."""

from __future__ import annotations

import json
import math

from helpers import tiny_charbert_export
from spanlm.config import from_dict
from spanlm.qa.config import QARecipe
from spanlm.qa.predict import QAModel
from spanlm.qa.task import train_qa


def test_charbert_encoder_trains_exports_and_predicts(embedded_prepared, qa_fixtures, tmp_path):
    tiny_charbert_export(embedded_prepared, tmp_path / "charbert")

    data = str(qa_fixtures / "squad_v2_sample.json")
    recipe = from_dict(
        QARecipe,
        {
            "model": {"path": str(tmp_path / "charbert")},
            "data": {"train": data, "dev": data, "max_length": 48, "doc_stride": 16, "max_query_length": 16},
            "qa": {"no_answer": True},
            "train": {
                "output_dir": str(tmp_path / "run"),
                "max_steps": 2,
                "batch_size": 4,
                "lr": 1e-3,
                "eval_every": 0,
                "num_workers": 0,
                "device": "cpu",
            },
            "logging": {"report_to": [], "progress": False},
        },
    )
    run_dir, result = train_qa(recipe, log=lambda *_: None)
    assert math.isfinite(result["f1"])
    model = QAModel(run_dir / "model", device="cpu")
    assert model.objective.head.qa_outputs.in_features == 64  # [token channel; char channel]
    assert all(math.isfinite(json.loads(line)["loss"]) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
