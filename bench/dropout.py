"""Benchmark: spanlm's FastDropout against torch.nn.functional.dropout on CPU, forward + backward.

What is compared (the same input, p = 0.1, training mode, forward then backward of a fixed upstream
gradient; the input's gradient is produced in both cases)
    spanlm      ``spanlm.accel.dropout.fast_dropout``: four 16-bit keep decisions per 64-bit SplitMix64 random
                word, P(drop) = round(p·2¹⁶)/2¹⁶, kept elements scaled by 1/(1 − P(drop)).
    peer        ``torch.nn.functional.dropout`` (one Bernoulli draw per element), what ``nn.Dropout``
                and transformers' SDPA math path run.

Shapes: the dropouts of one BERT layer of the bench/train_step.py model (hidden 256, 4 heads, batch
16): the hidden states (16, 128, 256) and the attention probabilities (16, 4, 128, 128) at seq 128,
and the attention probabilities at seq 512 (16, 4, 512, 512), which grow with seq².

Before timing, both are checked to drop a share within 4 standard deviations of p and to keep the
expectation (mean of the output of an all-ones input within 1%). Then they run alternately (order
flipped every repetition) ``--repeats`` times after one warm-up each; ``ratio`` per shape = peer median
÷ spanlm median. Top-level ``ratio`` is the smallest over the shapes. Output: one JSON line.

    python bench/dropout.py [--repeats 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch.nn import functional as F

from spanlm.accel.dropout import fast_dropout

SHAPES = {"hidden_seq128": (16, 128, 256), "attention_seq128": (16, 4, 128, 128), "attention_seq512": (16, 4, 512, 512)}
P = 0.1


def forward_backward(dropout, x: torch.Tensor, upstream: torch.Tensor) -> None:
    leaf = x.detach().requires_grad_()
    dropout(leaf, P).backward(upstream)


def check(dropout, shape) -> None:
    ones = torch.ones(shape)
    out = dropout(ones, P)
    dropped = (out == 0).float().mean().item()
    tolerance = 4 * (P * (1 - P) / ones.numel()) ** 0.5
    assert abs(dropped - P) < tolerance, (dropout, dropped)
    assert abs(out.mean().item() - 1.0) < 0.01, (dropout, out.mean().item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    sides = {"spanlm": fast_dropout, "peer": lambda x, p: F.dropout(x, p, training=True)}
    results = {}
    for name, shape in SHAPES.items():
        x, upstream = torch.randn(shape), torch.randn(shape)
        for dropout in sides.values():
            check(dropout, shape)
            forward_backward(dropout, x, upstream)  # warm-up
        times = {side: [] for side in sides}
        order = list(sides)
        repeats = max(3, args.repeats // 4) if shape[-1] == 512 else args.repeats
        for i in range(repeats):
            for side in order if i % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                forward_backward(sides[side], x, upstream)
                times[side].append(time.perf_counter() - start)
        medians = {side: statistics.median(t) for side, t in times.items()}
        results[name] = {
            "shape": list(shape),
            "repeats": repeats,
            **{f"{side}_ms": round(1000 * m, 3) for side, m in medians.items()},
            "ratio": round(medians["peer"] / medians["spanlm"], 3),
        }
    print(
        json.dumps(
            {
                "bench": "dropout",
                "ratio": min(r["ratio"] for r in results.values()),
                "p": P,
                "results": results,
                "threads": torch.get_num_threads(),
                "cpus": len(os.sched_getaffinity(0)),
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
