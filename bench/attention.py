"""Benchmark: spanlm's training self-attention against transformers' BertSelfAttention on CPU, forward + backward.

What is compared (one self-attention module of the bench/train_step.py model: BERT, hidden 256, 4 heads,
attention dropout 0.1, training mode; the same weights, hidden states and upstream gradient; forward,
then backward into the input and all six projection parameters)
    spanlm      the module as spanlm's encoders run it (``spanlm.accel.apply``):
                ``FusedBertSelfAttention``, hidden states to context in one autograd function
                (``spanlm.accel.attention``).
    unfused     the same module with transformers' own forward and spanlm's ``"spanlm_sdpa"`` attention
                (SDPA's math path with FastDropout): what spanlm ran before the fused function, shown to
                separate the fusion's share from the dropout's.
    peer        transformers' ``BertSelfAttention`` with ``attn_implementation="sdpa"`` and ``nn.Dropout``
                (``torch.nn.functional.scaled_dot_product_attention`` with ``dropout_p``).

Shapes: batch 16 at seq 128, batch 4 at seq 512 (the same 2,048 tokens). Before timing, spanlm's context
is checked against the unfused module's under the same seed (the same dropout draws: equal to 1e-5).
The three run alternately (order reversed every repetition) ``--repeats`` times after one warm-up each;
per shape, ``ratio`` = peer median ÷ spanlm median and ``ratio_vs_unfused`` = unfused ÷ spanlm. Top-level
``ratio`` is the smallest over the shapes. Output: one JSON line.

    python bench/attention.py [--repeats 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch

from spanlm import accel
from spanlm.accel.attention import FUSED

SHAPES = {"seq128": (16, 128), "seq512": (4, 512)}
HIDDEN, HEADS = 256, 4


def build_modules(seed: int) -> dict[str, torch.nn.Module]:
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(
        "bert",
        vocab_size=100,
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN,
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    peer = AutoModel.from_config(config, attn_implementation="sdpa", add_pooling_layer=False).train()
    spanlm = copy.deepcopy(peer)
    accel.apply(spanlm, torch.device("cpu"))
    unfused = copy.deepcopy(spanlm)
    stock = {fused: original for original, fused in FUSED.items()}
    for module in unfused.modules():
        if type(module) in stock:
            module.__class__ = stock[type(module)]
    return {
        name: model.encoder.layer[0].attention.self
        for name, model in (("spanlm", spanlm), ("unfused", unfused), ("peer", peer))
    }


def forward_backward(module: torch.nn.Module, hidden: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    leaf = hidden.detach().requires_grad_()
    context = module(leaf)[0]
    context.backward(upstream)
    return context.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    modules = build_modules(args.seed)
    results = {}
    for name, (batch, length) in SHAPES.items():
        generator = torch.Generator().manual_seed(args.seed)
        hidden = torch.randn(batch, length, HIDDEN, generator=generator)
        upstream = torch.randn(batch, length, HIDDEN, generator=generator)
        torch.manual_seed(args.seed)
        fused = forward_backward(modules["spanlm"], hidden, upstream)
        torch.manual_seed(args.seed)
        torch.testing.assert_close(fused, forward_backward(modules["unfused"], hidden, upstream), atol=1e-5, rtol=1e-5)
        forward_backward(modules["peer"], hidden, upstream)  # warm-up
        times = {side: [] for side in modules}
        order = list(modules)
        for i in range(args.repeats):
            for side in order if i % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                forward_backward(modules[side], hidden, upstream)
                times[side].append(time.perf_counter() - start)
            for module in modules.values():
                module.zero_grad(set_to_none=True)
        medians = {side: statistics.median(t) for side, t in times.items()}
        results[name] = {
            "batch": batch,
            "seq": length,
            "repeats": args.repeats,
            **{f"{side}_ms": round(1000 * m, 3) for side, m in medians.items()},
            "ratio": round(medians["peer"] / medians["spanlm"], 3),
            "ratio_vs_unfused": round(medians["unfused"] / medians["spanlm"], 3),
        }
    print(
        json.dumps(
            {
                "bench": "attention",
                "ratio": min(r["ratio"] for r in results.values()),
                "results": results,
                "threads": torch.get_num_threads(),
                "cpus": len(os.sched_getaffinity(0)),
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
