"""bench/packing.py: its --small run prints one JSON line comparing packed with padded batches."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import REPO, measured

pytestmark = pytest.mark.slow  # runs bench/packing.py in a subprocess

SCRIPT = REPO / "bench" / "packing.py"


def test_a_small_run_prints_padding_shares_rates_and_ratios():
    result = subprocess.run([sys.executable, str(SCRIPT), "--small"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    output = json.loads(lines[0])
    assert set(output["pretraining"]) == {"32", "64"} and output["device"] == "cpu"
    parts = [*output["pretraining"].values(), output["ner_wnut17"]]
    for part in parts:
        # the same blocks either way: packing computes no more positions than padding, and fewer where lengths vary
        assert 0 <= part["padding_share_packed"] <= part["padding_share_padded"] < 1
        assert measured(part["ratio"]) and measured(part["ratio_paired_median"])
    assert output["ner_wnut17"]["padding_share_packed"] < output["ner_wnut17"]["padding_share_padded"]
    for part in output["pretraining"].values():
        assert part["padding_share_packed"] == 0.0  # one stream: no padding (MLM has no gap between blocks)
        assert set(part["varlen_attention_cpu"]) == {"per_block_sdpa_ms", "nested_jagged_ms", "padded_again_ms"}
        assert all(map(measured, part["varlen_attention_cpu"].values()))
    rates = output["pretraining"]["32"]
    assert output["ratio_first_seq"] == rates["ratio"]
    assert measured(rates["tokens_per_s_packed"]) and measured(rates["tokens_per_s_padded"])
    # the ratio is the two rates' (computed consistently, whatever the machine's speed)
    assert (
        abs(rates["tokens_per_s_packed"] / rates["tokens_per_s_padded"] - rates["ratio"]) < 0.01 * rates["ratio"] + 0.01
    )
    assert output["ner_ratio"] == output["ner_wnut17"]["ratio"]
