"""Benchmark: the SBO head at real targets only, against the authors' padded layout and a Python loop.

What is compared (forward + backward of the head and its summed cross-entropy, same parameters)
    spanlm      ``spanlm.heads.SBOHead`` on one gathered row per real target: flat boundary indices
                from ``span_targets``, then the §3.2 MLP and the tied vocabulary projection on M rows.
    padded      the authors' ``BertPairTargetPredictionHead`` layout (facebookresearch/SpanBERT,
                pretraining/fairseq/models/pair_bert.py): pairs padded to the batch's largest pair
                count, every pair expanded to ``max_targets`` slots, the MLP and the vocabulary
                projection on all ``bs × n_pairs × max_targets`` slots, padded slots ignored in the loss.
    loop        a per-position Python loop: for each target, [x_{s-1}; x_{e+1}; p_{i-s+1}] is
                assembled from indexed slices, then the rows are stacked through the MLP, projection
                and summed cross-entropy.

Workload: batch 8 × 512 (hidden 256, vocab 30,522, as BERT's uncased vocabulary), spans from SpanBERT's
masker (Joshi et al. 2020 §3.1) at the token level: budget ceil(0.15 · 510) = 77 tokens per block,
length ℓ ~ Geo(0.2) clipped to 10 and renormalised, anchor uniform over free content positions, a span
stops at the budget, touching or overlapping spans merged. That gives ~77 targets per block in ~19 spans
(77 / 3.8 ≈ 20 before merging; seed 0: 76.8 targets in 18.9 spans).
max_targets = 15 (the authors' pretraining runs; targets beyond it in a long span are not SBO targets).

Before timing, the three are checked to give the same loss and the same gradients w.r.t. the hidden
states and every head parameter (assert allclose). Then they run alternately (rotating the order each
repetition) ``--repeats`` times after one warm-up each, and the medians are compared in the same process.
Output: one JSON line; ``ratio`` = padded median ÷ spanlm median (speed-up over the authors' layout),
``loop_ratio`` = loop median ÷ spanlm median.

    python bench/sbo_head.py [--repeats 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from spanlm.heads import SBOHead, span_targets

BATCH, LENGTH, HIDDEN, VOCAB, MAX_TARGETS = 8, 512, 256, 30522, 15
MASK_RATE, GEOMETRIC_P, MAX_SPAN = 0.15, 0.2, 10
PAD = -100


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each variant (alternating)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


# ---------------------------------------------------------------- workload


def span_mask_block(rng: np.random.Generator, length: int) -> list[tuple[int, int]]:
    """SpanBERT span masking of one [CLS] content [SEP] block, every token a word: merged [s, e] spans."""
    content = np.arange(1, length - 1)
    budget = math.ceil(MASK_RATE * len(content))
    lengths = np.arange(1, MAX_SPAN + 1)
    probabilities = GEOMETRIC_P * (1 - GEOMETRIC_P) ** (lengths - 1)
    probabilities /= probabilities.sum()  # clipped at 10 and renormalised, not resampled
    masked = np.zeros(length, dtype=bool)
    while masked.sum() < budget:
        span = int(rng.choice(lengths, p=probabilities))
        anchor = int(rng.choice(content))
        if masked[anchor]:
            continue
        end = min(anchor + span, length - 1, anchor + budget - int(masked.sum()))  # stop at the budget
        masked[anchor:end] = True
    # maximal runs of masked tokens = spans after merging those that overlap or touch
    edges = np.flatnonzero(np.diff(np.concatenate([[0], masked.astype(np.int8), [0]])))
    return [(int(s), int(e) - 1) for s, e in zip(edges[::2], edges[1::2])]


def make_workload(seed: int):
    rng = np.random.default_rng(seed)
    spans = [(b, s, e) for b in range(BATCH) for s, e in span_mask_block(rng, LENGTH)]
    spans = torch.tensor(spans)
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator)
    hidden = torch.randn(BATCH, LENGTH, HIDDEN, generator=generator)
    return spans, labels, hidden


def padded_layout(spans, labels):
    """The authors' inputs: pairs (bs, n_pairs, 2) and pair_targets (bs, n_pairs, max_targets), PAD-filled."""
    n_pairs = max(int((spans[:, 0] == b).sum()) for b in range(BATCH))
    pairs = torch.zeros(BATCH, n_pairs, 2, dtype=torch.long)
    targets = torch.full((BATCH, n_pairs, MAX_TARGETS), PAD)
    count = [0] * BATCH
    for b, s, e in spans.tolist():
        k = count[b]
        count[b] += 1
        pairs[b, k, 0], pairs[b, k, 1] = s - 1, e + 1
        n = min(e - s + 1, MAX_TARGETS)
        targets[b, k, :n] = labels[b, s : s + n]
    return pairs, targets


# ---------------------------------------------------------------- the three variants


def mlp(head: SBOHead, h0):
    h1 = head.layer_norm1(head.activation(head.dense1(h0)))
    return head.layer_norm2(head.activation(head.dense2(h1)))


def run_spanlm(head, hidden, inputs):
    left, right, relative, labels = inputs
    return F.cross_entropy(head(hidden, left, right, relative), labels, reduction="sum")


def run_padded(head, hidden, inputs):
    """BertPairTargetPredictionHead.forward + the criterion's summed cross-entropy, as the authors wrote them."""
    pairs, pair_targets = inputs
    bs, num_pairs, _ = pairs.size()
    _, _, dim = hidden.size()
    left, right = pairs[:, :, 0], pairs[:, :, 1]
    left_hidden = torch.gather(hidden, 1, left.unsqueeze(2).repeat(1, 1, dim))  # (bs, num_pairs, dim)
    left_hidden = left_hidden.contiguous().view(bs * num_pairs, dim).unsqueeze(1).repeat(1, MAX_TARGETS, 1)
    right_hidden = torch.gather(hidden, 1, right.unsqueeze(2).repeat(1, 1, dim))
    right_hidden = right_hidden.contiguous().view(bs * num_pairs, dim).unsqueeze(1).repeat(1, MAX_TARGETS, 1)
    position_embeddings = head.position_embeddings.weight  # (max_targets, 200)
    states = mlp(
        head, torch.cat((left_hidden, right_hidden, position_embeddings.unsqueeze(0).repeat(bs * num_pairs, 1, 1)), -1)
    )
    scores = head.decoder(states)  # (bs·num_pairs, max_targets, vocab)
    return F.cross_entropy(scores.view(-1, scores.size(-1)), pair_targets.view(-1), reduction="sum", ignore_index=PAD)


def run_loop(head, hidden, inputs):
    """The formula read position by position: each target's h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}] built in a
    Python loop (the common re-implementation), then the MLP and projection on the stacked rows.

    (Running the MLP and the projection per position too is another ~50× slower here: every target's
    backward then adds a full vocab × hidden gradient into the tied embedding.)
    """
    spans, labels = inputs
    rows, targets = [], []
    for b, s, e in spans.tolist():
        for i in range(s, min(e + 1, s + MAX_TARGETS)):
            rows.append(torch.cat([hidden[b, s - 1], hidden[b, e + 1], head.position_embeddings.weight[i - s]]))
            targets.append(labels[b, i])
    logits = head.decoder(mlp(head, torch.stack(rows)))  # (M, vocab)
    return F.cross_entropy(logits, torch.stack(targets), reduction="sum")


def forward_backward(run, head, parameters, hidden, inputs):
    for parameter in parameters:
        parameter.grad = None
    loss = run(head, hidden, inputs)
    loss.backward()
    return loss.detach(), [parameter.grad.clone() for parameter in parameters]


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    spans, labels, hidden = make_workload(args.seed)
    hidden.requires_grad_(True)
    embedding = nn.Embedding(VOCAB, HIDDEN)
    nn.init.normal_(embedding.weight, std=0.02)
    head = SBOHead(HIDDEN, embedding, max_targets=MAX_TARGETS)
    parameters = [hidden, embedding.weight] + list(head.parameters())

    left, right, relative, target = span_targets(spans[:, 0], spans[:, 1], spans[:, 2], LENGTH, MAX_TARGETS)
    pairs, pair_targets = padded_layout(spans, labels)
    variants = {
        "spanlm": (run_spanlm, (left, right, relative, labels.view(-1)[target])),
        "padded": (run_padded, (pairs, pair_targets)),
        "loop": (run_loop, (spans, labels)),
    }

    # Identical outputs: same summed loss and gradients for hidden states, the tied embedding and
    # every head parameter (float32 sums over ~600 rows: relative tolerance 1e-4).
    results = {
        name: forward_backward(run, head, parameters, hidden, inputs) for name, (run, inputs) in variants.items()
    }
    loss, gradients = results["spanlm"]
    for name in ("padded", "loop"):
        other_loss, other_gradients = results[name]
        torch.testing.assert_close(other_loss, loss, rtol=1e-4, atol=1e-3)
        for gradient, other in zip(gradients, other_gradients):
            torch.testing.assert_close(other, gradient, rtol=1e-4, atol=1e-5)

    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for rep in range(args.repeats + 1):  # repetition 0 is the warm-up
        for name in order[rep % 3 :] + order[: rep % 3]:
            run, inputs = variants[name]
            start = time.perf_counter()
            forward_backward(run, head, parameters, hidden, inputs)
            if rep:
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}

    targets = len(target)
    slots = int(pair_targets.numel())
    print(
        json.dumps(
            {
                "bench": "sbo_head",
                "ratio": round(median["padded"] / median["spanlm"], 3),
                "loop_ratio": round(median["loop"] / median["spanlm"], 3),
                "spanlm_ms": round(1000 * median["spanlm"], 1),
                "padded_ms": round(1000 * median["padded"], 1),
                "loop_ms": round(1000 * median["loop"], 1),
                "targets": targets,
                "targets_per_block": round(targets / BATCH, 1),
                "spans_per_block": round(len(spans) / BATCH, 1),
                "padded_slots": slots,
                "padded_slots_per_target": round(slots / targets, 2),
                "identical": True,
                "loss": round(loss.item(), 4),
                "batch": BATCH,
                "length": LENGTH,
                "hidden": HIDDEN,
                "vocab": VOCAB,
                "max_targets": MAX_TARGETS,
                "repeats": args.repeats,
                "spanlm_s": [round(t, 4) for t in times["spanlm"]],
                "padded_s": [round(t, 4) for t in times["padded"]],
                "loop_s": [round(t, 4) for t in times["loop"]],
                "threads": torch.get_num_threads(),
                "cpus": len(os.sched_getaffinity(0)),
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
