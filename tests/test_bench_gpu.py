"""bench/train_step_gpu.py: its options, and a dry run of the whole script on the CPU with a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from helpers import REPO, measured

SCRIPT = REPO / "bench" / "train_step_gpu.py"


def test_help_names_the_comparison_and_options():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "BertForMaskedLM" in result.stdout and all(
        f"--{o}" in result.stdout for o in ("device", "tiny", "seqs", "compile")
    )


def test_a_tiny_cpu_dry_run_prints_one_json_line_with_ratio_and_mfu(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--tiny",
            "--seqs",
            "64,32",
            "--batch",
            "2",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--peak-size",
            "128",
            "--work",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    output = json.loads(lines[0])
    assert output["bench"] == "train_step_gpu" and output["device"] == "cpu (dry run)"
    assert set(output["ratio"]) == set(output["mfu"]) == {"64", "32"}
    assert measured(output["peak_bf16_tflops"]) and len(output["peak_samples_tflops"]) == 3
    for run in output["results"]:
        assert run["tokens_per_step"] == 2 * run["seq"]  # full-length blocks, no padding
        for side in ("spanlm", "peer"):
            assert measured(run[side]["tokens_per_s"]) and measured(run[side]["mfu"])
            assert len(run[side]["step_ms"]) == 2 and all(map(measured, run[side]["step_ms"]))
        assert measured(run["ratio"]) and measured(run["ratio_paired_median"])
        assert run["spanlm"]["targets_mlm"] > 0 and run["spanlm"]["targets_sbo"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(
        "bench/train_step_gpu.py: no CUDA device"
    )
