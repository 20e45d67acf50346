"""Benchmark: a suite of small ``spanlm eval`` cells, each started fresh against forked from the preloaded server.

What is compared (the same suite, ``--force`` so that every cell runs, the two ways alternating in one process)
    forked      what ``spanlm eval`` does on Linux (spanlm.evaluate.launch): each cell's ``spanlm cls train`` is
                forked from a server that imported torch, transformers and the tasks' code once.
    fresh       each cell's command started as ``python -m spanlm cls train`` (``subprocess``), what ``spanlm
                eval`` did before the server, and still does where the server cannot run: every cell imports
                torch and transformers again.

Workload: a tiny BERT (hidden 32, 2 layers, the embedded English corpus's WordPiece of 2,000 entries) and its
random init, the embedded SST-2 sample's dev sentences as training and dev data, ``--steps`` steps of batch 8 at
32 tokens, ``--seeds`` seeds: 2 × seeds cells, ``--jobs`` at a time, one thread each. Small cells are what a
suite's rehearsal and a quick comparison run; in a long cell the start-up is a small share.

Output: one JSON line; ``ratio`` = fresh median ÷ forked median (wall seconds of the whole suite).

    python bench/eval_cells.py [--repeats 2] [--seeds 3] [--steps 2] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SST2 = REPO / "data" / "cls" / "sst2" / "dev.tsv"
EMBEDDED = [str(REPO / "data" / "corpus" / name) for name in ("alice_in_wonderland.txt", "frankenstein.txt")]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="suites run each way, alternating")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="fine-tuning steps of a cell")
    parser.add_argument("--jobs", type=int, default=2, help="cells at a time")
    return parser.parse_args()


def tiny_encoder(work: Path) -> Path:
    """The tests' tiny BERT with the embedded corpus's tokenizer, as a Hugging Face directory."""
    import torch

    from spanlm.config import from_dict
    from spanlm.data.prepare import prepare
    from spanlm.data.shards import PreparedCorpus
    from spanlm.models import BackboneConfig, build_backbone
    from spanlm.pretrain.recipe import Recipe

    recipe = {"data": {"inputs": EMBEDDED, "prepared_dir": str(work / "prepared")}, "tokenizer": {"vocab_size": 2000}}
    corpus = PreparedCorpus(prepare(from_dict(Recipe, recipe), log=lambda *_: None))
    torch.manual_seed(0)
    sizes = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}
    model = build_backbone(BackboneConfig(family="bert", max_position_embeddings=128, **sizes), corpus)
    out = work / "encoder"
    model.save_pretrained(str(out))
    corpus.tokenizer.save_pretrained(str(out))
    return out


def suite_file(work: Path, seeds: int, steps: int) -> Path:
    settings = {"data.train": str(SST2), "data.dev": str(SST2), "data.max_length": 32, "train.max_steps": steps}
    settings |= {"train.warmup_steps": 0, "train.batch_size": 8, "train.eval_every": steps}
    settings |= {"train.save_every": steps, "train.num_workers": 0, "train.device": "cpu"}
    task = {"name": "sst2", "kind": "cls", "recipe": "cls/sst2", "metric": "accuracy", "arms": ["fine-tuned"]}
    path = work / "suite.yaml"
    path.write_text(yaml.safe_dump({"seeds": list(range(seeds)), "tasks": [{**task, "settings": settings}]}))
    return path


def quiet(line: str) -> None:
    if "FAILED" in line:
        print(line, file=sys.stderr)


def run_suite(suite: Path, encoder: Path, out: Path, jobs: int, fresh: bool) -> float:
    from spanlm.evaluate import launch, run_suite

    started = launch._server
    if fresh:  # no server: every command as a fresh interpreter
        launch._server = lambda environment: None
    try:
        clock = time.perf_counter()
        run_suite(str(suite), [f"tiny={encoder}", f"random=random:{encoder}"], out, jobs=jobs, force=True, log=quiet)
        return time.perf_counter() - clock
    finally:
        launch._server = started


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        encoder, suite = tiny_encoder(work), suite_file(work, args.seeds, args.steps)
        run_suite(suite, encoder, work / "warm", args.jobs, fresh=False)  # the server's start, once
        times = {"forked": [], "fresh": []}
        for repeat in range(args.repeats):
            for way in ("forked", "fresh") if repeat % 2 == 0 else ("fresh", "forked"):
                times[way].append(run_suite(suite, encoder, work / way, args.jobs, fresh=way == "fresh"))
    forked, fresh = statistics.median(times["forked"]), statistics.median(times["fresh"])
    print(
        json.dumps(
            {
                "bench": "eval_cells",
                "cells": 2 * args.seeds,
                "jobs": args.jobs,
                "steps": args.steps,
                "forked_s": round(forked, 2),
                "fresh_s": round(fresh, 2),
                "seconds": {way: [round(t, 2) for t in values] for way, values in times.items()},
                "ratio": round(fresh / forked, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
