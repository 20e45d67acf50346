"""bench/prepare_scale.py runs (its --small mode) and reports what BENCHMARKS.md records."""

import json
import subprocess
import sys

import pytest

from helpers import REPO, external_data

pytestmark = pytest.mark.slow  # runs bench/prepare_scale.py in a subprocess, or forks


@pytest.mark.skipif(not external_data("english_text").is_dir(), reason="needs external/english_text (data/README.md)")
def test_the_scale_benchmark_small_mode(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "prepare_scale.py"),
            "--small",
            "--processes",
            "2",
            "--work",
            str(tmp_path),
            "--data",
            str(external_data("english_text")),
            "--chinese-data",
            str(external_data("chinese_text")),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sizes_mb"] == [0.3, 1.0]
    for row in result["english"].values():
        # every side tokenized the same lines into the same number of content tokens
        sides = ("bare", "run_mlm", "spanlm_np1_one_thread", "spanlm_np2")
        assert {row[side]["tokens"] for side in sides} == {row["tokens"]} and row["tokens"] > 0
        assert row["np2_wall_speedup_over_one_thread"] > 0 and "spanlm_np3" not in row
        assert 0 < row["spanlm_np2"]["main_cpu_s"] < row["spanlm_np2"]["cpu_s"]
        assert 0 < row["np2_main_cpu_share"] < 1
        assert 0 < row["temp_disk_ratio"] <= 1.3
        assert row["spanlm_np1"]["heap_peak_mb"] > 0 and row["spanlm_np1"]["file_peak_mb"] > 0
        assert row["startup"]["blocks"] > 0 and row["startup"]["startup_s"] >= 0
    assert result["heap_growth"] > 0 and set(result["heap_extrapolated_gb"]) == {"20GB", "200GB"}
    assert result["chinese_jieba"]["0.2"]["tokens"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["corpus-zh", "tokenizer", "tokenizer-sample", "zh-tokenizer"]
    )


def test_the_heap_peak_counts_pages_a_forked_child_shares_once():
    """A worker being spawned is a fork of its parent until it execs: its RssAnon is all of the parent's
    heap, which a plain RssAnon sum would count twice."""
    import importlib.util
    import os
    import time

    import numpy as np

    spec = importlib.util.spec_from_file_location("prepare_scale", REPO / "bench" / "prepare_scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    held = np.ones(64 << 20, dtype=np.uint8)  # 64 MB of heap, touched
    # The whole tree's heap before the fork: the test process may already have children (a forkserver or a
    # worker pool an earlier test in this process started), which the sampler counts too.
    before = sum(bench.heap_share_kb(pid) for pid in bench.tree(os.getpid())) * 1024
    child = os.fork()
    if child == 0:  # shares every heap page with the test process until it exits
        time.sleep(1.0)
        os._exit(0)
    try:
        with bench.PeakSampler() as peaks:
            time.sleep(0.3)
    finally:
        os.waitpid(child, 0)
    assert bench.rss_kb(os.getpid())[0] * 1024 > held.nbytes  # the heap is really there
    assert peaks.heap < before + held.nbytes // 2
