"""A CharBERT encoder fine-tunes for classification with both channels: the head reads 2H features. Its modeling
file has no sequence-classification class, so its export is spanlm's (cls_head.safetensors), loaded by spanlm."""

from __future__ import annotations

import math

import pytest

from helpers import REPO, tiny_charbert_export
from spanlm.cls.config import ClsRecipe
from spanlm.cls.data import Example
from spanlm.cls.model import HEAD_FILE
from spanlm.cls.predict import ClsModel
from spanlm.cls.task import train_cls
from spanlm.config import from_dict


@pytest.mark.slow
def test_charbert_encoder_trains_exports_and_predicts(embedded_prepared, tmp_path):
    tiny_charbert_export(embedded_prepared, tmp_path / "charbert")
    sst2 = REPO / "data" / "cls" / "sst2"
    recipe = from_dict(
        ClsRecipe,
        {
            "model": {"path": str(tmp_path / "charbert")},
            "data": {"train": str(sst2 / "dev.tsv"), "dev": str(sst2 / "dev.tsv"), "task": "sst2", "max_length": 32},
            "train": {
                "output_dir": str(tmp_path / "run"),
                "max_steps": 2,
                "batch_size": 8,
                "lr": 1e-3,
                "eval_every": 0,
                "num_workers": 0,
                "device": "cpu",
            },
            "logging": {"report_to": [], "progress": False},
        },
    )
    run_dir, result = train_cls(recipe, log=lambda *_: None)
    assert math.isfinite(result["accuracy"])
    assert (run_dir / "model" / HEAD_FILE).is_file()
    model = ClsModel(run_dir / "model", device="cpu")
    assert not model.objective.stock and model.objective.head.dense.in_features == 64  # [token channel; char channel]
    (record,) = model.records(model.logits([Example("a charming journey", None, None, "x")]))
    assert record["label"] in ("0", "1") and 0 < record["score"] <= 1
