"""`spanlm qa train → eval → predict` end to end on SQuAD v2.0-format data; user errors exit 2."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from spanlm.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_train_eval_predict(qa_encoder_dir, qa_fixtures, tmp_path, capsys):
    data = str(qa_fixtures / "squad_v2_sample.json")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(qa_encoder_dir)},
                "data": {"train": data, "dev": data, "max_length": 48, "doc_stride": 16, "max_query_length": 16},
                "qa": {"metric": "squad", "no_answer": True},
                "train": {
                    "output_dir": str(tmp_path / "run"),
                    "max_steps": 4,
                    "batch_size": 4,
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
    code, out, err = run(capsys, "qa", "train", str(recipe), "train.max_steps=3")
    assert code == 0, err
    trained = json.loads(out)
    model_dir = tmp_path / "run" / "model"
    assert trained["model_dir"] == str(model_dir) and trained["questions"] == 6
    for key in ("em", "f1", "has_answer_f1", "no_answer_f1", "best_f1", "best_f1_threshold"):
        assert math.isfinite(trained[key]), key
    # The F1-best threshold on the dev set is kept with the model, and reported.
    assert (
        json.loads((model_dir / "qa.json").read_text())["no_answer_threshold"]
        == trained["best_f1_threshold"]
        == trained["threshold"]
    )
    assert trained["f1"] == pytest.approx(trained["best_f1"])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [2, 3] and all(
        math.isfinite(r["f1"]) for r in records if r["kind"] == "eval"
    )

    # Resume continues the run from its last checkpoint.
    code, out, err = run(capsys, "qa", "train", str(recipe), "train.max_steps=4", "--resume", "auto")
    assert code == 0 and "resumed from" in err and "step 3" in err
    resumed = json.loads(out)
    # The window settings change every batch: a resume with another one is refused, naming it.
    code, out, err = run(
        capsys, "qa", "train", str(recipe), "train.max_steps=6", "data.doc_stride=8", "--resume", "auto"
    )
    assert code == 2 and "data.doc_stride: " in err and "Traceback" not in err
    code, out, err = run(
        capsys, "qa", "train", str(recipe), "train.max_steps=6", "data.max_length=40", "--resume", "auto"
    )
    assert code == 2 and "data.max_length: 48 → 40" in err and "Traceback" not in err

    predictions = tmp_path / "predictions.json"
    code, out, err = run(
        capsys, "qa", "eval", str(model_dir), "--data", data, "--predictions", str(predictions), "--device", "cpu"
    )
    assert code == 0, err
    evaluated = json.loads(out)
    assert evaluated["questions"] == 6 and math.isfinite(evaluated["f1"]) and evaluated["read"]["repaired_answers"] == 0
    # The exported model, loaded back, scores exactly what the run reported for it.
    assert {k: evaluated[k] for k in ("em", "f1", "threshold")} == {k: resumed[k] for k in ("em", "f1", "threshold")}
    assert set(json.loads(predictions.read_text())) == {"q1", "q2", "q3", "q4", "q5", "q6"}

    output = tmp_path / "answers.jsonl"
    code, out, err = run(
        capsys,
        "qa",
        "predict",
        str(model_dir),
        "--input",
        str(qa_fixtures / "questions.jsonl"),
        "--output",
        str(output),
    )
    assert code == 0, err
    answers = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    inputs = [json.loads(line) for line in (qa_fixtures / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [a["id"] for a in answers] == ["a", "2"]
    for answer, question in zip(answers, inputs):
        assert math.isfinite(answer["score"]) and math.isfinite(answer["null_margin"])
        assert (
            question["context"][answer["start"] : answer["end"]] == answer["answer"]
            if answer["answer"]
            else answer["start"] == -1
        )
        assert answer["span"] and answer["span"] in question["context"]

    # An empty context has no span to score: null, not -Infinity (which is not JSON).
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"question": "Who?", "context": ""}\n', encoding="utf-8")
    code, out, err = run(capsys, "qa", "predict", str(model_dir), "--input", str(empty))

    def no_infinity(constant):
        raise ValueError(constant)

    (answer,) = [json.loads(line, parse_constant=no_infinity) for line in out.splitlines()]
    assert code == 0 and answer["answer"] == "" and answer["score"] is None


def test_user_errors_are_one_line(tmp_path, capsys, qa_fixtures):
    code, out, err = run(capsys, "qa", "eval", str(tmp_path), "--data", str(qa_fixtures / "squad_v2_sample.json"))
    assert code == 2 and err.count("\n") == 1 and "not a spanlm QA model (no recipe.yaml)" in err
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("data:\n  doc_strid: 3\n")
    code, out, err = run(capsys, "qa", "train", str(recipe))
    assert code == 2 and "unknown config key 'data.doc_strid'" in err
    code, out, err = run(capsys, "qa", "train", str(recipe.with_name("none.yaml")))
    assert code == 2 and "does not exist" in err


@pytest.mark.parametrize(("name", "metric", "no_answer"), [("cmrc2018", "cmrc2018", False), ("squad", "squad", True)])
def test_shipped_recipes_load(name, metric, no_answer):
    from pathlib import Path

    from spanlm.config import load_config
    from spanlm.qa.config import QARecipe

    recipe = load_config(Path(__file__).resolve().parents[2] / "configs" / "qa" / f"{name}.yaml", cls=QARecipe)
    assert (recipe.qa.metric, recipe.qa.no_answer, recipe.data.doc_stride) == (metric, no_answer, 128)


def test_a_span_head_at_chance_says_so(qa_encoder_dir, qa_fixtures, tmp_path, capsys):
    """A rate too small to move the weights: the loss stays at the windows' mean log of their allowed positions (each
    boundary spread over the context and [CLS]), and past the first fifth of the run the run says it is not
    learning."""
    data = str(qa_fixtures / "squad_v2_sample.json")
    recipe = tmp_path / "recipe.yaml"
    settings = {"train": data, "dev": data, "max_length": 48, "doc_stride": 16, "max_query_length": 16}
    train = {"output_dir": str(tmp_path / "run"), "max_steps": 10, "batch_size": 4, "lr": 1e-9, "warmup_steps": 0}
    train |= {"eval_every": 0, "save_every": 10, "log_every": 1, "num_workers": 0, "device": "cpu"}
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(qa_encoder_dir)},
                "data": settings,
                "qa": {"metric": "squad", "no_answer": True},
                "train": train,
                "logging": {"report_to": [], "progress": False},
            }
        )
    )
    code, _, err = run(capsys, "qa", "train", str(recipe))
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (health,) = [r for r in records if r["kind"] == "health"]
    assert "not learning: the training loss" in health["message"] and "chance" in health["message"]
