"""bench/train_step_gpu.py: its options, and a dry run of the whole script on the CPU with a tiny model."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from helpers import REPO, measured

pytestmark = pytest.mark.slow  # every test runs bench/train_step_gpu.py in a subprocess

SCRIPT = REPO / "bench" / "train_step_gpu.py"


def test_help_names_the_comparison_and_options():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "BertForMaskedLM" in result.stdout and "ModernBertForMaskedLM" in result.stdout
    assert all(f"--{o}" in result.stdout for o in ("device", "tiny", "arms", "seq", "vocab", "cli-steps", "budget"))


def test_a_tiny_cpu_dry_run_prints_one_json_line_with_every_arms_figures(tmp_path):
    arms = ["mlm-packed-eager", "spanbert-padded-eager", "peer-blocks-eager", "peer-sdpa-compiled"]
    arms += ["peer-flash-flattened", "gdes-packed-eager", "modern-packed-eager", "modernpeer-sdpa-eager"]
    arms += ["cli-mlm-eager"]
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--arms", ",".join(arms), "--steps", "2"]
    command += ["--warmup", "1", "--batches", "2", "--peak-size", "128", "--cli-steps", "4", "--work", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    output = json.loads(lines[0])
    assert output["bench"] == "train_step_gpu" and output["device"] == "cpu (dry run)"
    assert list(output["arms"]) == arms
    assert measured(output["peak_bf16_tflops"]) and len(output["peak_samples_tflops"]) == 2
    # without flash-attn (and without CUDA) the flattened peer says why it did not run
    assert "flash" in output["arms"].pop("peer-flash-flattened")["skipped"]
    # the CLI's own run, as its metrics.jsonl tells it
    cli = output["arms"].pop("cli-mlm-eager")
    assert measured(cli["tokens_per_s"]) and measured(cli["mfu_logged"]) and 0 <= cli["data_wait"] < 1
    assert cli["steps"] == 4 and len(cli["tokens_per_s_windows"]) >= 2 and cli["recompiles"] is None  # eager
    for name, arm in output["arms"].items():
        assert measured(arm["tokens_per_s"]) and measured(arm["mfu"]) and measured(arm["step_ms"]), name
        assert all(math.isfinite(loss) for loss in arm["loss_first_last"]), name
        assert arm["host_syncs"] is None and arm["host_sync_sites"] is None  # syncs: counted on CUDA
        assert isinstance(arm["attention_kernels"], list)
        # where the time went: the costliest operators first, each with its share of the step
        shares = [share for _, _, share in arm["top_kernels"]]
        assert shares and shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0001, name
        assert output["mfu"][name] == arm["mfu"] and output["tokens_per_s"][name] == arm["tokens_per_s"]
    # the group_texts peer trains on full rows: every position a real token
    assert output["arms"]["peer-blocks-eager"]["tokens_per_step"] == 2 * 64
    # SDPA's kernel as the profiler names it on the CPU
    assert any("scaled_dot_product" in k for k in output["arms"]["peer-blocks-eager"]["attention_kernels"])
    dynamo = output["arms"]["peer-sdpa-compiled"]["dynamo"]
    assert dynamo["graph_breaks"] >= 0 and dynamo["compiled_frames"] >= 1 and dynamo["recompiles"] >= 0
    ratios = output["ratios"]
    # the strongest peer is the fastest of those that ran; a headline whose arm did not run is None
    fastest = max(("peer-blocks-eager", "peer-sdpa-compiled"), key=output["tokens_per_s"].get)
    assert ratios["strongest_peer"] == fastest and ratios["strongest_modern_peer"] == "modernpeer-sdpa-eager"
    assert ratios["headline"] is None and ratios["cli_vs_bench_step"] == {"mlm": None, "modern": None}
    assert 0 <= output["padding_share"] < 1 and output["tokens_per_step"] > 0


def test_an_unknown_arm_is_named(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--arms", "spanbert-packed-eager,fast"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "unknown arm(s) fast" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(
        "bench/train_step_gpu.py: no CUDA device"
    )
