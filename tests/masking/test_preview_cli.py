"""`spanlm preview`: decoded blocks with marked targets, statistics as JSON, raw batches as JSONL."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import REPO
from spanlm.cli import main
from spanlm.masking.base import MaskedBatch
from spanlm.pretrain.recipe import load_recipe


@pytest.fixture
def recipe_file(tmp_path, english_recipe):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**english_recipe, "seed": 3}), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "scheme, marks, keys",
    [
        ("mlm", ["[M:", "[R:", "[K:"], []),
        ("wwm", ["[M:"], ["mean_span_words"]),
        ("span", ["[M:"], ["mean_span_words", "mean_span_tokens", "span_words_histogram"]),
        ("ngram", ["[S:"], ["ngram_mix", "similar_fallback_rate", "word_mask_ratio"]),
        ("noise", ["~"], ["noised_word_ratio", "noise_operations", "nlm_targets_per_block"]),
    ],
)
def test_preview_prints_blocks_and_statistics(scheme, marks, keys, recipe_file, tmp_path, capsys):
    jsonl = tmp_path / "batches.jsonl"
    code = main(
        [
            "preview",
            str(recipe_file),
            f"masking.scheme={scheme}",
            "--n",
            "3",
            "--stats-blocks",
            "64",
            "--jsonl",
            str(jsonl),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("legend:") and ("~y~{x} noised word" in out[0]) == (scheme == "noise")
    assert sum(line.startswith("[block ") for line in out) == 3
    shown = "\n".join(out[1:-1])
    assert all(mark in shown for mark in marks)
    assert "[CLS]" in shown and "[SEP]" in shown
    stats = json.loads(out[-1])
    assert stats["scheme"] == scheme and stats["blocks"] == 64
    expected_rate = 0.10 if scheme == "noise" else 0.15
    assert stats["mask_ratio"] == pytest.approx(expected_rate, abs=0.02)
    assert sum(stats["replacement"].values()) == pytest.approx(1.0, abs=1e-3)
    # A scheme's own statistics come from its masker: SBO targets are SpanBERT's alone.
    assert ("sbo_targets_per_block" in stats) == (scheme == "span")
    assert scheme != "span" or stats["sbo_targets_per_block"] > 0
    for key in keys:
        assert key in stats
    batches = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    assert len(batches) == 2  # 64 blocks in batches of 32
    assert sum(len(b["input_ids"]) for b in batches) == 64
    own = {
        "span": {"sbo_index", "sbo_left", "sbo_right", "sbo_relative", "sbo_labels"},
        "noise": {"nlm_index", "nlm_labels"},
    }
    assert set(batches[0]) == {*MaskedBatch.ARRAYS, "max_seq_len", "counters", *own.get(scheme, ())}


def test_preview_is_reproducible(recipe_file, capsys):
    main(["preview", str(recipe_file), "masking.scheme=span", "--n", "2", "--stats-blocks", "32"])
    first = capsys.readouterr().out
    main(["preview", str(recipe_file), "masking.scheme=span", "--n", "2", "--stats-blocks", "32"])
    assert capsys.readouterr().out == first
    main(["preview", str(recipe_file), "masking.scheme=span", "seed=4", "--n", "2", "--stats-blocks", "32"])
    assert capsys.readouterr().out != first


def test_preview_errors_are_one_line(recipe_file, capsys):
    assert main(["preview", str(recipe_file), "masking.span.geometric_p=0.3"]) == 2
    assert "unknown config key 'masking.span.geometric_p'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as error:  # the argument parser's check, the same bound as preview()'s
        main(["preview", str(recipe_file), "--n", "-1"])
    assert error.value.code == 2 and "argument --n: -1 must be at least 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as error:  # steps are numbered from 1, as in metrics.jsonl
        main(["preview", str(recipe_file), "--step", "0"])
    assert error.value.code == 2 and "argument --step: 0 must be at least 1" in capsys.readouterr().err


def test_masking_recipes_load():
    schemes = {}
    for path in sorted((REPO / "configs" / "masking").glob("*.yaml")):
        recipe = load_recipe(path)
        schemes[path.stem] = recipe.masking.scheme
        assert recipe.data.inputs and all((REPO / p).is_file() for p in recipe.data.inputs)
    assert schemes == {"mlm": "mlm", "wwm": "wwm", "spanbert": "span", "macbert": "ngram", "charbert_noise": "noise"}
    macbert = load_recipe(REPO / "configs" / "masking" / "macbert.yaml")
    assert macbert.data.similar_words == "word2vec" and macbert.data.words == "jieba"


def test_preview_follows_the_masking_rate_schedule_at_the_step_asked(recipe_file, capsys):
    """A 0.30 → 0.15 linear schedule over 100 steps: the budget is 0.30 at step 1 (no step done yet), 0.225 at 51,
    0.15 from 101 — steps numbered as metrics.jsonl numbers them, the schedule counting the steps done before."""
    schedule = [
        "masking.scheme=mlm",
        "masking.rate_schedule.kind=linear",
        "masking.rate_schedule.steps=[0,100]",
        "masking.rate_schedule.rates=[0.30,0.15]",
    ]
    ratios = {}
    for step in (1, 51, 101):
        args = ["preview", str(recipe_file), *schedule, "--n", "0", "--stats-blocks", "64", "--step", str(step)]
        assert main(args) == 0
        stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert stats["scheduled_rate"] == {"step": step, "rate": pytest.approx(0.30 - 0.15 * (step - 1) / 100)}
        ratios[step] = stats["mask_ratio"]
    assert ratios[1] == pytest.approx(0.30, abs=0.02)
    assert ratios[51] == pytest.approx(0.225, abs=0.02)
    assert ratios[101] == pytest.approx(0.15, abs=0.02)
    # Without a schedule the statistics say nothing of one, whatever --step is.
    assert (
        main(["preview", str(recipe_file), "masking.scheme=mlm", "--n", "0", "--stats-blocks", "32", "--step", "7"])
        == 0
    )
    assert "scheduled_rate" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
