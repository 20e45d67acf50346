"""Learning health: held-out tallies give each masked part its unigram line and prediction diversity, and a run
that stays at its unigram line (or, fine-tuning, at chance loss) says so once, naming the keys that usually fix it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from helpers import embedded_recipe
from spanlm.pretrain.run import pretrain, pretraining_setup
from spanlm.train.dist import init_distributed
from spanlm.train.health import LearningHealth, summarise_tallies
from spanlm.train.metrics import read_metrics

QUIET = {"log": lambda *_: None}


def test_tallies_give_the_unigram_line_the_distinct_predictions_and_their_entropy():
    targets = torch.tensor([0.0, 6.0, 3.0, 1.0])  # 10 targets, the most frequent 6 times
    predicted = torch.tensor([0.0, 5.0, 5.0, 0.0])  # two tokens, half and half
    metrics = summarise_tallies({"mlm_target_counts": targets, "mlm_predicted_counts": predicted})
    assert metrics == {
        "mlm_unigram_accuracy": 0.6,
        "mlm_distinct_predictions": 2,
        "mlm_prediction_entropy": pytest.approx(1.0),
    }


def test_one_predicted_token_has_an_entropy_of_zero_not_minus_zero():
    metrics = summarise_tallies({"mlm_target_counts": torch.ones(3), "mlm_predicted_counts": torch.tensor([0.0, 3, 0])})
    assert metrics["mlm_prediction_entropy"] == 0.0 and str(metrics["mlm_prediction_entropy"]) == "0.0"


def test_a_part_stuck_at_its_unigram_line_is_said_once_after_three_evaluations():
    health = LearningHealth("train.lr", None, max_steps=1000)
    stuck = {"mlm_accuracy": 0.064, "mlm_unigram_accuracy": 0.070, "mlm_distinct_predictions": 1}
    assert health.after_evaluation(0, stuck) == []  # step 0: the initial weights do not count
    assert health.after_evaluation(100, stuck) == [] and health.after_evaluation(200, stuck) == []
    (line,) = health.after_evaluation(300, stuck)
    assert line.startswith("not learning: held-out mlm_accuracy 0.0640 has stayed at its unigram line 0.0700")
    assert "1 distinct predicted tokens" in line and line.endswith("what usually fixes it: train.lr")
    assert health.after_evaluation(400, stuck) == []  # once


def test_only_the_masked_tokens_own_part_is_judged_where_there_is_one():
    health = LearningHealth("train.lr", None, max_steps=1000)
    learning_mlm_slow_sbo = {"mlm_accuracy": 0.09, "mlm_unigram_accuracy": 0.058, "sbo_accuracy": 0.06}
    learning_mlm_slow_sbo["sbo_unigram_accuracy"] = 0.058
    assert all(health.after_evaluation(step, learning_mlm_slow_sbo) == [] for step in (100, 200, 300, 400))
    nlm_only = LearningHealth("train.lr", None, max_steps=1000)
    stuck = {"nlm_accuracy": 0.01, "nlm_unigram_accuracy": 0.01}
    assert [nlm_only.after_evaluation(step, stuck) for step in (100, 200, 300)][-1]  # no MLM part: each is judged


def test_a_part_that_leaves_its_line_is_not_said():
    health = LearningHealth("train.lr", None, max_steps=1000)
    for step, accuracy in ((100, 0.06), (200, 0.09), (300, 0.12), (400, 0.15)):
        assert health.after_evaluation(step, {"mlm_accuracy": accuracy, "mlm_unigram_accuracy": 0.057}) == []


def test_a_fine_tuning_loss_at_chance_is_said_past_the_first_fifth_of_the_run():
    chance = math.log(2)
    health = LearningHealth("train.lr", chance, max_steps=100)
    assert all(health.after_train_record(step, chance) == [] for step in (5, 10, 15))  # the first fifth
    (line,) = health.after_train_record(25, chance * 1.001)
    assert "the training loss" in line and f"chance ({chance:.4f})" in line
    learning = LearningHealth("train.lr", chance, max_steps=100)
    assert all(learning.after_train_record(step, 0.4) == [] for step in range(10, 100, 10))


def test_a_run_that_does_not_learn_says_so_with_its_tallies_exact(embedded_prepared, tmp_path):
    """A SpanBERT whose rate is too small to move: every evaluation records the held-out unigram line of the
    targets it scored (exactly: the share of the most frequent label over the held-out batches) and how few tokens
    it predicts; after three evaluations the log, metrics.jsonl and spanlm report say it is not learning."""
    from spanlm.report import write_report

    said = []
    overrides = ("train.lr=1e-9", "train.max_steps=6", "train.eval_every=2", "train.warmup_steps=0")
    recipe = embedded_recipe("spanbert", embedded_prepared, tmp_path / "run", *overrides)
    run = pretrain(recipe, log=said.append)
    records = read_metrics(run)
    evaluations = [r for r in records if r["kind"] == "eval"]
    setup = pretraining_setup(recipe, init_distributed("cpu"), **QUIET)
    labels = np.concatenate([b["target_labels"].numpy() for b in setup.eval_batches()])
    expected = np.bincount(labels).max() / len(labels)
    for record in evaluations:
        assert record["mlm_unigram_accuracy"] == pytest.approx(expected)
        assert 1 <= record["mlm_distinct_predictions"] <= len(labels) and record["mlm_prediction_entropy"] >= 0
        assert "sbo_unigram_accuracy" in record
    health = [r for r in records if r["kind"] == "health"]
    # one line, of the MLM part (SBO's auxiliary predictions are recorded, not judged)
    assert [r["step"] for r in health] == [6] and "held-out mlm_accuracy" in health[0]["message"]
    assert all("train.lr and train.warmup_steps" in r["message"] for r in health)
    assert any(line.startswith("not learning: held-out mlm_accuracy") for line in said)
    write_report(run)
    assert "Learning health" in (run / "report.html").read_text(encoding="utf-8")
    assert json.loads((run / "summary.json").read_text(encoding="utf-8"))["health"][0]["step"] == 6
