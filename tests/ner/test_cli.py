"""`spanlm ner train | eval | predict` end to end on WNUT-17 fixtures, and user errors as one line + exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import write_wnut_recipe
from spanlm.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ner"


@pytest.fixture(scope="module")
def trained(tiny_encoder_dir, tmp_path_factory):
    """A few steps of `ner train` on the WNUT-17 fixtures: (run dir, stdout summary)."""
    out = tmp_path_factory.mktemp("ner_cli") / "run"
    return out, write_wnut_recipe(tiny_encoder_dir, out, steps=6)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_train_eval_predict(trained, capsys, tmp_path):
    out, recipe = trained
    code, stdout, stderr = run_cli(capsys, "ner", "train", str(recipe), "train.eval_every=3")
    assert code == 0 and "encoder: pretrained weights loaded from" in stderr and ", fine-tuned" in stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["model_dir"] == str(out / "model") and all(
        math.isfinite(summary[k]) for k in ("precision", "recall", "f1")
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [3, 6] and all(
        math.isfinite(r["f1"]) and math.isfinite(r["loss"]) for r in evals
    )
    labels = json.loads((out / "model" / "labels.json").read_text())
    assert labels == ["corporation", "creative-work", "group", "location", "person", "product"]

    metrics = tmp_path / "metrics.json"
    code, stdout, _ = run_cli(
        capsys,
        "ner",
        "eval",
        str(out / "model"),
        "--data",
        str(FIXTURES / "wnut_dev_mini.conll"),
        "--output",
        str(metrics),
        "--predictions",
        str(tmp_path / "pred.jsonl"),
    )
    assert code == 0 and "micro" in stdout
    scores = json.loads(metrics.read_text())
    assert scores["micro"]["n_gold"] == 39 and math.isfinite(scores["micro"]["f1"]) and scores["records"] == 40
    predictions = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert len(predictions) == 40
    entities = [e for p in predictions for e in p["entities"]]
    assert entities and all(set(e) == {"start", "end", "label", "text", "score"} for e in entities)

    code, stdout, _ = run_cli(
        capsys, "ner", "predict", str(out / "model"), "--text", "Holmes met Watson in London .", "--threshold=-1e9"
    )
    assert code == 0
    (line,) = [json.loads(x) for x in stdout.splitlines()]
    assert line["text"] == "Holmes met Watson in London ." and line["entities"]  # every cell above -1e9 is an entity
    for entity in line["entities"]:
        assert line["text"][entity["start"] : entity["end"]] == entity["text"] and entity["label"] in labels
        assert set(entity) == {"start", "end", "label", "text", "score"}

    texts = tmp_path / "texts.txt"
    texts.write_text("Holmes met Watson .\n\nParis is big .\n", encoding="utf-8")
    code, _, _ = run_cli(
        capsys,
        "ner",
        "predict",
        str(out / "model"),
        "--input",
        str(texts),
        "--output",
        str(tmp_path / "o.jsonl"),
        "--flat",
        "--threshold=-1e9",
    )
    lines = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert code == 0 and [x["text"] for x in lines] == ["Holmes met Watson .", "Paris is big ."]
    for x in lines:  # flat: no two entities overlap
        spans = sorted((e["start"], e["end"]) for e in x["entities"])
        assert spans and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))

    # The prediction output is the JSONL span format: it reads back as input.
    code, _, _ = run_cli(
        capsys,
        "ner",
        "predict",
        str(out / "model"),
        "--input",
        str(tmp_path / "o.jsonl"),
        "--output",
        str(tmp_path / "p.jsonl"),
    )
    assert code == 0 and len((tmp_path / "p.jsonl").read_text().splitlines()) == 2


def test_user_errors_are_one_line(tiny_encoder_dir, capsys, tmp_path):
    code, _, err = run_cli(capsys, "ner", "predict", str(tmp_path), "--text", "x")
    assert code == 2 and "not a spanlm NER model" in err and len(err.strip().splitlines()) == 1
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: {{path: {tiny_encoder_dir}}}\ndata: {{train: {tmp_path / 'missing.json'}, format: cluener}}\n"
    )
    code, _, err = run_cli(capsys, "ner", "train", str(recipe), f"train.output_dir={tmp_path / 'run'}")
    assert code == 2 and "missing.json: no such file" in err
    code, _, err = run_cli(capsys, "ner", "train", str(recipe), "data.format=xml")
    assert code == 2 and "data.format" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "entities": [{"start": 0, "end": 9, "label": "X"}]}\n')
    code, _, err = run_cli(
        capsys,
        "ner",
        "train",
        str(recipe),
        f"data.train={bad}",
        "data.format=jsonl",
        f"train.output_dir={tmp_path / 'r2'}",
    )
    assert code == 2 and f"{bad}:1: " in err and "out of range" in err


@pytest.mark.parametrize("name", ["cluener", "conll03", "genia_nested"])
def test_recipes_load(name):
    from spanlm.config import load_config
    from spanlm.ner.config import NerRecipe

    recipe = load_config(Path(__file__).resolve().parents[2] / "configs" / "ner" / f"{name}.yaml", cls=NerRecipe)
    assert recipe.data.train and recipe.data.dev and recipe.model.path
    assert recipe.data.stride < recipe.data.max_len - 2 and recipe.ner.head.head_size == 64


@pytest.mark.parametrize(
    "settings",
    [["train.encoder_lr=0.0001"], ["model.frozen=true"], ["train.probe_steps=2", "train.max_steps=3"], []],
    ids=str,
)
def test_metrics_log_the_encoder_and_head_rates_by_name(tiny_encoder_dir, tmp_path, capsys, settings):
    recipe = write_wnut_recipe(tiny_encoder_dir, tmp_path / "run", steps=2)
    code, _, stderr = run_cli(capsys, "ner", "train", str(recipe), "train.log_every=1", "data.dev=", *settings)
    assert code == 0, stderr
    assert ("frozen (model.frozen" in stderr) == ("model.frozen=true" in settings)
    assert "Loading weights" not in stderr and "it/s]" not in stderr  # logging.progress=false: no library bars
    first = next(json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    # Both at the same point of the schedule (no warm-up; linear decay): the peak rates' ratio
    head = first["lr_head"]
    held = {"train.encoder_lr=0.0001": 0.1, "model.frozen=true": 0.0, "train.probe_steps=2": 0.0}
    ratio = held.get(next(iter(settings), ""), 1.0)
    assert 0 < head <= 0.001 and first["lr_encoder"] == pytest.approx(ratio * head)
    # the first group's, as before: the encoder's (0.0 while it is held back), the head's when it is frozen
    assert first["lr"] == pytest.approx(head if "model.frozen=true" in settings else first["lr_encoder"])
