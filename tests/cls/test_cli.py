"""`spanlm cls train → eval → predict` end to end; the exported directory in transformers' pipeline gives the
predictions `cls predict` gives; a resume with another sequence length is refused."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from helpers import REPO, transformers_bars_on
from spanlm.cli import main

DATA = REPO / "data" / "cls"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_recipe(path, encoder, out, data: dict, cls: dict | None = None, steps: int = 4):
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(encoder)},
                "data": {"max_length": 48, **data},
                "cls": cls or {},
                "train": {
                    "output_dir": str(out),
                    "max_steps": steps,
                    "batch_size": 8,
                    "lr": 1e-3,
                    "warmup_steps": 0,
                    "eval_every": 2,
                    "save_every": 2,
                    "log_every": 2,
                    "num_workers": 0,
                    "device": "cpu",
                },
                "logging": {"report_to": [], "progress": False},
            }
        )
    )
    return path


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sst2_train_eval_predict_and_the_pipeline(cls_encoder_dir, tmp_path, capsys, pooling):
    """cls.pooling: cls exports the stock BertForSequenceClassification, which the pipeline loads to the same
    predictions; the default (mean) exports in spanlm's layout, which spanlm's own eval and predict read back."""
    from transformers import pipeline

    sst2 = {"train": str(DATA / "sst2/train.tsv"), "dev": str(DATA / "sst2/dev.tsv"), "task": "sst2"}
    cls = {"pooling": pooling} if pooling == "cls" else None
    recipe = write_recipe(tmp_path / "sst2.yaml", cls_encoder_dir, tmp_path / "run", sst2, cls=cls)
    code, out, err = run(capsys, "cls", "train", recipe)
    assert code == 0, err
    assert ("spanlm's layout" in err) == (pooling == "mean")  # the run says which export it wrote
    trained = json.loads(out)
    model_dir = tmp_path / "run" / "model"
    assert trained["model_dir"] == str(model_dir) and trained["examples"] == 872 and 0 <= trained["accuracy"] <= 100
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval" and "accuracy" in r] == [2, 4]
    per_example = json.loads((tmp_path / "run" / "per_example.json").read_text())
    assert 100 * sum(per_example["correct"]) / 872 == pytest.approx(trained["accuracy"])

    # The exported model, loaded back, scores what the run reported; its stderr, not a terminal, holds no bar
    # (transformers' "Loading weights"), as in a fresh process, where the training run had not turned them off.
    scores, predictions = tmp_path / "scores.json", tmp_path / "predictions.jsonl"
    with transformers_bars_on():
        code, out, err = run(
            capsys, "cls", "eval", model_dir, "--data", DATA / "sst2/dev.tsv", "--device", "cpu",
            "--output", scores, "--predictions", predictions,
        )  # fmt: skip
    assert code == 0, err
    assert "Loading weights" not in err and "\r" not in err
    assert (
        json.loads(out)["accuracy"] == pytest.approx(trained["accuracy"]) == json.loads(scores.read_text())["accuracy"]
    )
    labels = [json.loads(line)["label"] for line in predictions.read_text().splitlines()]
    gold = [line.split("\t")[1] for line in (DATA / "sst2/dev.tsv").read_text().splitlines()[1:]]
    assert 100 * sum(p == g for p, g in zip(labels, gold)) / len(gold) == pytest.approx(trained["accuracy"])

    texts = [line.split("\t")[0].strip() for line in (DATA / "sst2/dev.tsv").read_text().splitlines()[1:21]]
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    output = tmp_path / "out.jsonl"
    code, _, err = run(capsys, "cls", "predict", model_dir, "--input", inputs, "--output", output, "--device", "cpu")
    assert code == 0, err
    ours = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(ours) == len(texts)
    assert json.loads((model_dir / "cls.json").read_text())["pooling"] == pooling
    if pooling == "cls":
        theirs = pipeline("text-classification", model=str(model_dir), device="cpu")(texts)
        assert [o["label"] for o in ours] == [t["label"] for t in theirs]
        assert [o["score"] for o in ours] == pytest.approx([t["score"] for t in theirs], abs=1e-4)

    # The sequence length changes every batch: a resume with another one is refused, naming it.
    code, _, err = run(capsys, "cls", "train", recipe, "train.max_steps=6", "data.max_length=40", "--resume", "auto")
    assert code == 2 and "data.max_length: " in err and "Traceback" not in err
    # --output never overwrites the model's own files.
    code, _, err = run(capsys, "cls", "predict", model_dir, "--text", "fine", "--output", model_dir / "config.json")
    assert code == 2 and "config.json" in err


@pytest.mark.slow
def test_stsb_regression_and_pairs(cls_encoder_dir, tmp_path, capsys):
    from transformers import pipeline

    stsb = {"train": str(DATA / "stsb/train.tsv"), "dev": str(DATA / "stsb/dev.tsv"), "task": "stsb"}
    # the stock class's pooling, so that the pipeline loads it
    recipe = write_recipe(tmp_path / "stsb.yaml", cls_encoder_dir, tmp_path / "run", stsb, {"pooling": "cls"}, steps=2)
    code, out, err = run(capsys, "cls", "train", recipe)
    assert code == 0, err
    trained = json.loads(out)
    assert math.isfinite(trained["pearson"]) and math.isfinite(trained["spearman"])
    model_dir = tmp_path / "run" / "model"
    code, out, err = run(capsys, "cls", "predict", model_dir, "--text", "A plane.", "--text-pair", "An air plane.")
    assert code == 0, err
    ours = json.loads(out)["score"]
    theirs = pipeline("text-classification", model=str(model_dir), device="cpu")(
        {"text": "A plane.", "text_pair": "An air plane."}
    )
    assert ours == pytest.approx(theirs["score"], abs=1e-4)
    # A pair model given one sentence is refused, naming the input.
    code, _, err = run(capsys, "cls", "predict", model_dir, "--text", "A plane.")
    assert code == 2 and "--text" in err and "text_pair is missing" in err


@pytest.mark.slow
def test_resume_is_exact(cls_encoder_dir, tmp_path, capsys):
    from safetensors.torch import load_file

    from spanlm.train.checkpoint import latest_checkpoint

    sst2 = {"train": str(DATA / "sst2/train.tsv"), "task": "sst2", "tokens_per_batch": 256}
    constant = ["train.schedule=constant", "train.save_every=2"]
    straight = write_recipe(tmp_path / "a.yaml", cls_encoder_dir, tmp_path / "a", sst2)
    assert run(capsys, "cls", "train", straight, *constant)[0] == 0
    halves = write_recipe(tmp_path / "b.yaml", cls_encoder_dir, tmp_path / "b", sst2)
    assert run(capsys, "cls", "train", halves, *constant, "train.max_steps=2")[0] == 0
    assert run(capsys, "cls", "train", halves, *constant, "--resume", "auto")[0] == 0
    a = load_file(str(latest_checkpoint(tmp_path / "a") / "model.safetensors"))
    b = load_file(str(latest_checkpoint(tmp_path / "b") / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_classifier_whose_loss_stays_at_chance_says_so(cls_encoder_dir, tmp_path, capsys):
    """Two labels, a rate too small to move the weights: the training loss stays at ln 2 and, past the first fifth
    of the run, the run says it is not learning (once), in its log and metrics.jsonl."""
    from spanlm.train.metrics import read_metrics

    sst2 = REPO / "data" / "cls" / "sst2"
    data = {"train": str(sst2 / "dev.tsv"), "dev": "", "task": "sst2"}
    recipe = write_recipe(tmp_path / "cls.yaml", cls_encoder_dir, tmp_path / "run", data, steps=10)
    code, _, err = run(capsys, "cls", "train", recipe, "train.lr=1e-9", "train.log_every=1", "train.eval_every=0")
    assert code == 0, err
    health = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "health"]
    assert len(health) == 1 and f"chance ({math.log(2):.4f})" in health[0]["message"]
    assert "not learning: the training loss" in err and "train.encoder_lr" in err
