"""`spanlm demo`: every stage runs and the page holds its sections and finite numbers (``--quick``); a SIGTERM
in the NER stage leaves an honest report of an interrupted run."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time

import pytest
import yaml

from helpers import REPO
from spanlm.cli import main
from spanlm.demo import ARMS, EXAMPLES, FILL_MASK, QUICK, DemoPlan, ner_run_dir, run_demo
from spanlm.train.metrics import read_metrics


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["report"] == str(out / "report.html") and printed["interrupted"] is False

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["seeds"] == [0] and summary["interrupted"] is False
    for key in (
        "mlm_accuracy",
        "unigram_accuracy",
        "ner_f1_pretrained",
        "ner_f1_random",
        "ner_f1_pretrained_frozen",
        "ner_f1_random_frozen",
    ):
        assert math.isfinite(summary[key]) and printed[key] == summary[key], key
    assert 0 < summary["unigram_accuracy"] < 1
    assert all(stage == {"planned": 12, "ran": 12, "complete": True} for stage in summary["stages"].values())
    assert set(summary["ner"]) == {"pretrained", "random", "pretrained-frozen", "random-frozen"}
    # The quick plan scores the first dev_sentences of the embedded GermEval dev set: their gold entities, all.
    records = (REPO / "data/ner/germeval2014/dev.conll").read_text(encoding="utf-8").split("\n\n")
    first = [record for record in records if record.strip()][: QUICK.dev_sentences]
    gold = sum(line.split("\t")[1].startswith("B-") for record in first for line in record.splitlines())
    assert summary["run"]["dev_sentences"] == QUICK.dev_sentences < 1000 and gold > 0
    for init, scores in summary["ner"].items():
        micro = scores["micro"]
        assert micro["n_gold"] == gold
        assert all(0 <= micro[k] <= 100 for k in ("precision", "recall", "f1"))  # percent
        assert scores["seen"]["n_gold"] + scores["unseen"]["n_gold"] == micro["n_gold"] and scores["seen"]["n_gold"] > 0
        assert summary[f"ner_f1_{init.replace('-', '_')}"] == micro["f1"]
        # Both runs start with a step-0 evaluation of the same head on their own encoder.
        assert [r["step"] for r in read_metrics(ner_run_dir(out, init, 0)) if r["kind"] == "eval"] == [0, 6, 12]
        assert len(summary["predictions"][init]) == len(EXAMPLES)
        for item in summary["predictions"][init]:
            for entity in item["entities"]:  # predicted offsets point at the predicted text
                assert item["text"][entity["start"] : entity["end"]] == entity["text"]
    assert [item["text"] for item in summary["fill_mask"]] == FILL_MASK and all(
        len(item["top"]) == 3 for item in summary["fill_mask"]
    )
    run = summary["run"]
    assert run["seed"] == 0 and run["encoder_parameters"] > 0 and run["pretraining_blocks_seen"] == 12 * 16
    # NER learns from the first labelled_sentences sentences; pretraining reads all 24,000 without labels.
    assert run["labelled_sentences"] == QUICK.labelled_sentences < 3000
    assert json.loads((out / "prepared" / "meta.json").read_text(encoding="utf-8"))["n_sentences"] == 24000
    for init in ("pretrained", "random"):  # the head and the encoder each at the plan's rate
        recorded = yaml.safe_load((ner_run_dir(out, init, 0) / "config.yaml").read_text(encoding="utf-8"))
        # The demo suite's 64-token windows (the CharBERT encoder numbers 64 positions; the NER recipe has 128)
        assert recorded["data"]["train_docs"] == QUICK.labelled_sentences and recorded["data"]["max_len"] == 64
        recorded = recorded["train"]
        assert (recorded["lr"], recorded["encoder_lr"]) == (
            QUICK.ner_lr,
            QUICK.ner_encoder_lr,
        ) and QUICK.ner_encoder_lr < QUICK.ner_lr
    assert set(run["wall_seconds"]) == {"pretrain", "ner", "total"}
    # A frozen arm trains the head only: its exported encoder is the pretrained one, weight for weight.
    from safetensors.torch import load_file

    frozen, encoder = (
        load_file(ner_run_dir(out, "pretrained-frozen", 0) / "model" / "model.safetensors"),
        load_file(out / "encoder" / "model.safetensors"),
    )
    # The default encoder is CharBERT: both channels, under the same names in its export and the NER model's.
    assert frozen.keys() == encoder.keys() and any(name.startswith("char_encoder.") for name in encoder)
    assert all(tensor.equal(encoder[name]) for name, tensor in frozen.items())
    recorded = yaml.safe_load((ner_run_dir(out, "random-frozen", 0) / "config.yaml").read_text(encoding="utf-8"))
    recorded = recorded["model"]
    assert (recorded["init"], recorded["frozen"]) == ("random", True)

    page = (out / "report.html").read_text(encoding="utf-8")
    assert "500 labelled sentences; learning rate 0.003 for the head, 0.001 for the encoder" in page
    assert f"the first dev sentences: {QUICK.dev_sentences}" in page
    for section in (
        "<h2>Summary</h2>",
        "<h2>Run</h2>",
        "pretrained vs random init",
        "seen / unseen",
        "unigram baseline",
        "Fill-mask",
        "Entities found in example sentences",
        "pretrain/report.html",
        "eval/cells/germeval2014/random/fine-tuned/seed-0/run/report.html",
        "eval/cells/germeval2014/pretrained/frozen/seed-0/run/report.html",
        "eval/report.html",
        "frozen (head only)",
    ):
        assert section in page, section
    assert "Interrupted" not in page
    for image in (
        "ner_f1_curves.png",
        "ner_f1_seen_unseen.png",
        "ner_f1_per_type.png",
        "mlm_accuracy.png",
        "pretrain/loss.png",
    ):
        assert (out / image).stat().st_size > 1000 and image in page
    # The exported encoder is a plain Hugging Face directory.
    from transformers import AutoModel

    AutoModel.from_pretrained(str(out / "encoder"))


@pytest.mark.slow
def test_sigterm_in_the_ner_stage_reports_the_steps_that_ran(tmp_path):
    """SIGTERM once the first NER run has logged: the running NER cells stop after their step, the frozen arms
    never start, and summary.json and the page say so with the steps that ran, not the planned ones."""
    out = tmp_path / "demo"
    planned = 2000  # far more than run before the signal lands

    def signal_when_training(line: str) -> None:
        if line.startswith("[2/3]"):
            threading.Thread(target=send_sigterm_after_first_record, daemon=True).start()

    def send_sigterm_after_first_record() -> None:
        run = ner_run_dir(out, "pretrained", 0)
        while not ((run / "metrics.jsonl").is_file() and any(r["kind"] == "train" for r in read_metrics(run))):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    # A few dev sentences: the runs are stopped near their random start, whose many spans are slow to score
    plan = DemoPlan(
        pretrain_steps=4, pretrain_eval_every=4, ner_steps=planned, ner_eval_every=1000, eval_docs=20, dev_sentences=20
    )
    summary = run_demo(tmp_path / "demo", plan=plan, log=signal_when_training)
    stages = summary["stages"]
    assert summary["interrupted"] is True and stages["pretrain"] == {"planned": 4, "ran": 4, "complete": True}
    ran = stages["ner_pretrained"]["ran"]
    assert 10 <= ran < planned and stages["ner_pretrained"]["complete"] is False
    assert stages["ner_random"]["ran"] < planned and stages["ner_random"]["complete"] is False  # ran beside it
    for frozen in ("ner_pretrained-frozen", "ner_random-frozen"):
        assert stages[frozen] == {"planned": planned, "ran": 0, "complete": False}
    # a run cut short is not scored: its model would pass for the plan's
    assert summary["ner_f1_random_frozen"] is None and summary["ner_f1_pretrained"] is None
    assert json.loads((out / "summary.json").read_text(encoding="utf-8"))["stages"] == stages
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "Interrupted run" in page and f"ner_pretrained: {ran} of {planned} steps" in page
    assert f"{ran} of {planned} steps" in page and "ner_random-frozen: 0 of" in page


def test_a_plan_needs_labelled_sentences_the_data_has():
    from spanlm.errors import ConfigError

    for bad in (0, 3001):
        with pytest.raises(ConfigError, match="labelled_sentences must be 1..3000"):
            DemoPlan(labelled_sentences=bad)
    with pytest.raises(ConfigError, match="dev_sentences must be at least 1"):
        DemoPlan(dev_sentences=0)


def test_readme_puts_spanlm_on_path():
    """The Quickstart's activate line, run from the directory holding the venv the tests run in, finds its spanlm."""
    import subprocess
    import sys
    from pathlib import Path

    from helpers import doc_section

    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix) or venv.name != ".venv":
        pytest.skip("the tests do not run in a .venv like the one make creates")
    (block,) = [b for b in doc_section("README.md", "Quickstart", language="bash") if "activate" in b]
    activate = next(line.split("#")[0].strip() for line in block.splitlines() if "activate" in line)
    found = subprocess.run(
        ["bash", "-c", f'{activate} && echo "$VIRTUAL_ENV" && command -v spanlm'],
        cwd=venv.parent,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, found
    activated, spanlm = found.stdout.split()  # the venv the script activates (a copied venv's names its origin)
    assert Path(spanlm) == Path(activated) / "bin" / "spanlm", found


def test_seeds_are_aggregated_for_every_arm(tmp_path):
    from spanlm.demo import F1_KEYS, _aggregate, seeds_table

    def run(seed, f1s, interrupted=False, failed=()):
        return {
            "seeds": [seed],
            "mlm_accuracy": 0.1,
            "unigram_accuracy": 0.04,
            "interrupted": interrupted,
            "failed": list(failed),
            **dict(zip(F1_KEYS, f1s)),
        }

    runs = [
        run(0, (20.0, 18.0, 9.0, 1.0)),
        run(1, (22.0, 21.0, 11.0, 2.0)),
        run(2, (5.0, 1.0, 1.0, 0.0), interrupted=True),
        run(3, (0.0, 0.0, 0.0, 0.0), failed=["ner_random"]),
    ]
    summary = _aggregate(tmp_path, runs, (0, 1, 2, 3))
    assert summary["interrupted"] is True and [row["seed"] for row in summary["per_seed"]] == [0, 1, 2, 3]
    assert summary["failed"] == ["ner_random"]  # a failed seed is left out of the means too
    # Means over the complete seeds only; the gaps per pair of arms.
    assert summary["ner_f1_pretrained_frozen"] == 10.0 and summary["ner_f1_random_frozen"] == 1.5
    assert summary["ner_f1_gap"]["mean"] == 1.5 and summary["ner_f1_frozen_gap"]["mean"] == 8.5
    table = seeds_table(summary)
    assert "frozen: F1 pretrained" in table and "+8.50 ± 0.71" in table and "2 (interrupted)" in table
    assert "3 (failed)" in table


@pytest.mark.slow
def test_another_shipped_recipe_runs_with_its_fill_mask_and_a_failed_ner_run_is_reported_as_failed(
    tmp_path, capsys, monkeypatch
):
    """SpanBERT: another objective, exported as BertForMaskedLM (the fill-mask pipeline's guesses). Its NER cells
    fail here (a stand-in suite): the demo says FAILED with their error, not "interrupted"."""
    import spanlm.evaluate

    asked = {}

    def failing_suite(suite, encoders, out, seeds, log, settings):
        asked.update(suite=suite, settings=settings)
        cells = [
            {
                "encoder": encoder.split("=")[0],
                "arm": arm,
                "seed": seeds[0],
                "status": "failed",
                "error": "exit 2: boom",
            }
            for encoder in encoders
            for arm in ("fine-tuned", "frozen")
        ]
        return {"cells": cells, "stopped": None}

    monkeypatch.setattr(spanlm.evaluate, "run_suite", failing_suite)
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--pretrain-recipe", "pretrain/spanbert"]) == 1
    captured = capsys.readouterr()
    printed = json.loads(captured.out.strip().splitlines()[-1])
    assert printed["interrupted"] is False and printed["failed"] == [f"ner_{arm}" for arm in ARMS]
    assert "FAILED" in captured.err and "exit 2: boom" in captured.err and "INTERRUPTED" not in captured.err
    assert "spanlm demo: ner_pretrained, ner_random" in captured.err.splitlines()[-1]

    # The demo's suite, with its own windows for every encoder
    assert asked["suite"] == "demo" and "data.max_len" not in asked["settings"]
    assert json.loads((out / "encoder" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["plan"]["pretrain_recipe"] == "pretrain/spanbert" and summary["stages"]["pretrain"]["complete"]
    assert summary["failed"] == [f"ner_{arm}" for arm in ARMS]
    assert [item["text"] for item in summary["fill_mask"]] == FILL_MASK and summary["run"]["encoder_parameters"] > 0
    assert all(len(item["top"]) == 3 for item in summary["fill_mask"])
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "Failed runs." in page and "Interrupted run." not in page
    assert "Fill-mask" in page and "<code>spanbert</code> objective" in page and "pretrain/spanbert" in page


def test_a_charbert_export_fills_the_blanks_with_its_own_mlm_head(embedded_prepared, tmp_path):
    """CharBERT keeps its MLM head in heads.safetensors, where no pipeline looks: the demo's guesses come from that
    head over the token channel. A head whose bias favours one word must guess that word at every blank."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    from helpers import tiny_charbert_export
    from spanlm.demo.run import _fill_mask
    from spanlm.heads.hf import HEADS_FILE
    from spanlm.models.backbone import mlm_head
    from spanlm.models.modeling_charbert import CharBertModel

    export = tiny_charbert_export(embedded_prepared, tmp_path / "charbert")
    model = CharBertModel.from_pretrained(str(export), config=AutoConfig.from_pretrained(str(export)))
    tokenizer = AutoTokenizer.from_pretrained(str(export))
    assert _fill_mask(export) == ([], model.num_parameters())  # a fine-tuning save: no MLM head, no guesses
    word = next(t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]) if t.isalpha())
    head = mlm_head(model.backbone)
    with torch.no_grad():
        head.decoder.bias[tokenizer.convert_tokens_to_ids(word)] = 50.0
    save_file({f"mlm_head.{name}": tensor for name, tensor in head.state_dict().items()}, str(export / HEADS_FILE))

    guesses, parameters = _fill_mask(export)
    assert [item["text"] for item in guesses] == FILL_MASK and parameters == model.num_parameters()
    for item in guesses:
        assert len(item["top"]) == 3 and item["top"][0] == {"token": word, "score": 1.0}, item


def test_an_export_without_a_masked_lm_head_has_no_guesses(tmp_path):
    """An encoder exported bare (as ELECTRA-GDES exports its discriminator): a fill-mask pipeline would guess from
    a freshly initialised head, so the demo shows none; the parameters are counted from the weights."""
    from transformers import BertConfig, BertModel

    from spanlm.demo.run import _fill_mask

    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    model = BertModel(config, add_pooling_layer=False)
    model.save_pretrained(tmp_path / "bare")
    assert _fill_mask(tmp_path / "bare") == ([], model.num_parameters())


def test_a_demo_recipe_must_be_a_shipped_pretraining_recipe(tmp_path, capsys):
    for name, reason in (("ner/germeval2014", "not a pretraining recipe"), ("pretrain/nope", "no recipe named")):
        assert main(["demo", "--quick", "--out", str(tmp_path / "d"), "--pretrain-recipe", name]) == 2
        err = capsys.readouterr().err
        assert reason in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()
