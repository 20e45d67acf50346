"""Benchmark: packed against padded batches (spanlm.data.packing), pretraining and NER fine-tuning, in one process.

Pretraining: the three English books of the embedded corpus (data/corpus) prepared with a WordPiece
tokenizer of 8,000 entries, blocks of ``max_len`` = each of ``--seqs``; a BERT MLM (hidden 256, 4 layers,
4 heads, intermediate 1024, dropout 0.1; ``--small``: hidden 32, 2 layers; ``--family deberta-v2``: a DeBERTa-V3 of
that size, whose packed stream runs every layer on its tokens and the attention on its blocks laid out in rows,
spanlm.models.packed_deberta) trained with spanlm's own
objective, fused AdamW, with the CPU backend as the trainer applies it (``--accel``, ``train.accel``). Both
sides get the SAME blocks and masks: the batches of ``--batch`` blocks that
``spanlm.pretrain.batches.MaskedBatches`` builds for the first batch keys of the run, once with one block per
row padded to the longest (``padded``), once packed into one stream (``packed``; the attention per block:
spanlm's fused CPU self-attention under ``--accel auto``, one SDPA call per block under ``off``). Masking
is outside the timed region.

NER: WNUT-17 (data/ner/wnut17/train.conll; the repository's copy), windows of 128 tokens; a tiny BERT of
the same size with the corpus tokenizer, loaded as a fine-tuning encoder, GlobalPointer head; batches of
``--ner-batch`` windows (sentences), padded to the longest window or packed into one stream.

Attention alone (``varlen_attention_cpu``): forward and backward of the attention over the first packed
batch (heads and head size of the model, attention dropout 0.1) by the CPU ways to keep blocks apart
without a (T, T) mask — one SDPA call per block (``per_block_sdpa``, what spanlm runs without its backend),
SDPA over nested jagged tensors (``nested_jagged``), and one SDPA call over all blocks padded again to the
longest (``padded_again``, what it runs on an accelerator without a varlen kernel) — alternating, median
milliseconds.

A step is forward, backward, AdamW step, ``zero_grad(set_to_none=True)``. Per comparison: ``--warmup``
untimed steps per side, then ``--steps`` timed steps per side alternating (the order flips every pair:
A B B A …), each side cycling through its pre-built batches. A step's time is the process's CPU time
over all its threads by default (``--clock process``: on a shared machine, other processes' load
stretches wall-clock time unevenly between the sides; ``--clock wall`` measures that instead).
Reported per sequence length:

* ``padding_share``: share of the computed positions (rows × row length) that hold no token;
* ``tokens_per_s``: real (non-pad) tokens per step ÷ median step time (NER: ``examples_per_s``, windows;
  per CPU-second of the process under ``--clock process``);
* ``ratio``: packed ÷ padded rate; ``ratio_paired_median``: the median over step pairs of padded time ÷
  packed time (robust to a load burst on a shared machine hitting a few steps).

Output: one JSON line on stdout. ``--small`` runs the same code with a tiny model and a few steps (the
test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
BOOKS = ["alice_in_wonderland.txt", "adventures_of_sherlock_holmes.txt", "frankenstein.txt"]
CLOCKS = {"process": time.process_time, "wall": time.perf_counter}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", default="128,512", help="pretraining block lengths ([CLS]/[SEP] included)")
    parser.add_argument("--batch", type=int, default=16, help="blocks per pretraining batch")
    parser.add_argument("--batches", type=int, default=4, help="distinct pre-built batches per side, cycled")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per side")
    parser.add_argument("--ner-batch", type=int, default=32, help="windows per NER batch")
    parser.add_argument("--ner-steps", type=int, default=20, help="timed NER steps per side (0: no NER comparison)")
    parser.add_argument(
        "--clock",
        choices=["process", "wall"],
        default="process",
        help="step time: the process's CPU time over all its threads (robust to other processes "
        "loading a shared machine), or wall-clock time",
    )
    parser.add_argument(
        "--accel",
        choices=["auto", "off"],
        default="auto",
        help="spanlm's CPU backend on both sides (train.accel; auto: as the trainer runs on a CPU)",
    )
    parser.add_argument(
        "--family",
        choices=["bert", "deberta-v2"],
        default="bert",
        help="the pretraining model's family (deberta-v2: DeBERTa-V3's layout, its attention laid out per segment)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--small", action="store_true", help="a tiny model and a few steps (a smoke run)")
    args = parser.parse_args(argv)
    if args.small:
        args.seqs, args.batch, args.batches, args.steps, args.warmup, args.ner_batch, args.ner_steps = (
            "32,64",
            8,
            2,
            2,
            1,
            8,
            2,
        )
    return args


def model_sizes(small: bool) -> dict:
    if small:
        return {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}
    return {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024}


def prepare_corpus(directory: Path, small: bool):
    from spanlm.config import from_dict
    from spanlm.data.prepare import prepare
    from spanlm.data.shards import PreparedCorpus
    from spanlm.pretrain.recipe import Recipe

    books = BOOKS[:1] if small else BOOKS
    recipe = from_dict(
        Recipe,
        {
            "data": {
                "inputs": [str(REPO / "data" / "corpus" / b) for b in books],
                "prepared_dir": str(directory / "prepared"),
            },
            "tokenizer": {"vocab_size": 1000 if small else 8000},
        },
    )
    return PreparedCorpus(prepare(recipe, log=lambda *_: None))


def timed_pair(steps: dict, warmup: int, count: int, clock=time.process_time) -> dict[str, list[float]]:
    """``steps``: side → a callable running its next step. Median-ready step times per side, alternating."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {side: [] for side in steps}
    sides = list(steps)
    for number in range(count):
        for side in sides if number % 2 == 0 else sides[::-1]:
            start = clock()
            steps[side]()
            times[side].append(clock() - start)
    return times


def training_step(objective, batches: list[dict], accel_mode: str):
    from spanlm import accel

    accel.apply(objective, torch.device("cpu"), accel_mode)
    optimizer = torch.optim.AdamW(objective.parameters(), lr=1e-4, fused=True)
    cycle = {"next": 0}

    def step() -> None:
        batch = batches[cycle["next"] % len(batches)]
        cycle["next"] += 1
        objective(batch)["loss"].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def padding_share(batches: list[dict]) -> float:
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    computed = sum(b["attention_mask"].numel() for b in batches)
    return 1.0 - real / computed


def compare(times: dict[str, list[float]], work: float) -> dict:
    padded, packed = statistics.median(times["padded"]), statistics.median(times["packed"])
    return {
        "padded": work / padded,
        "packed": work / packed,
        "ratio": round(padded / packed, 4),
        "ratio_paired_median": round(statistics.median(a / b for a, b in zip(times["padded"], times["packed"])), 4),
    }


def pretraining(corpus, seq: int, args) -> dict:
    from spanlm.config import from_dict
    from spanlm.data.blocks import BlockDataset
    from spanlm.objectives import build_objective
    from spanlm.pretrain.batches import MaskedBatches
    from spanlm.pretrain.recipe import Recipe
    from spanlm.train.loader import BatchKeySampler

    recipe = from_dict(
        Recipe,
        {
            "data": {"prepared_dir": str(corpus.directory), "max_len": seq},
            "model": {**model_sizes(args.small), "max_position_embeddings": seq, "family": args.family},
            "objective": {"name": "mlm"},
            "masking": {"scheme": "mlm"},
        },
    )
    blocks = BlockDataset(corpus, seq)
    keys = iter(BatchKeySampler(np.arange(len(blocks)), args.batch, seed=0, rank=0, world_size=1))
    keys = [next(keys) for _ in range(args.batches)]
    pad = corpus.special_ids["pad"]
    batches, steps = {}, {}
    for side in ("padded", "packed"):
        torch.manual_seed(0)
        objective = build_objective(recipe, corpus).train()
        data = MaskedBatches(blocks, objective.masker, pad, seed=0, rank=0, packed=side == "packed")
        batches[side] = [data[key] for key in keys]
        steps[side] = training_step(objective, batches[side], args.accel)
    tokens = statistics.mean(int(b["attention_mask"].sum()) for b in batches["padded"])
    rates = compare(timed_pair(steps, args.warmup, args.steps, CLOCKS[args.clock]), tokens)
    sizes = model_sizes(args.small)
    attention = varlen_attention_cpu(
        batches["packed"][0], sizes["num_heads"], sizes["hidden_size"] // sizes["num_heads"], args
    )
    return {
        "padding_share_padded": round(padding_share(batches["padded"]), 4),
        "padding_share_packed": round(padding_share(batches["packed"]), 4),
        "tokens_per_s_padded": round(rates["padded"], 1),
        "tokens_per_s_packed": round(rates["packed"], 1),
        "ratio": rates["ratio"],
        "ratio_paired_median": rates["ratio_paired_median"],
        "varlen_attention_cpu": attention,
    }


def varlen_attention_cpu(batch: dict, heads: int, head_dim: int, args) -> dict:
    """Median ms of forward + backward of the attention over ``batch``'s blocks, each kept to itself, three ways."""
    import torch.nn.functional as F

    from spanlm.accel.varlen import repadded_attention
    from spanlm.models.modeling_charbert import segment_bounds

    bounds = segment_bounds(batch["position_ids"], batch["attention_mask"])
    lengths = (bounds[1:] - bounds[:-1]).tolist()
    generator = torch.Generator().manual_seed(0)
    query, key, value = (
        torch.randn(sum(lengths), heads, head_dim, generator=generator, requires_grad=True) for _ in range(3)
    )
    p = 0.1

    def per_block_sdpa():
        return torch.cat(
            [
                F.scaled_dot_product_attention(
                    q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), dropout_p=p
                ).transpose(0, 1)
                for q, k, v in zip(query.split(lengths), key.split(lengths), value.split(lengths))
            ]
        )

    def nested_jagged():
        def jagged(x):  # (T, heads, d) → (blocks, heads, j, d)
            return torch.nested.nested_tensor_from_jagged(x, bounds.long()).transpose(1, 2)

        return (
            F.scaled_dot_product_attention(jagged(query), jagged(key), jagged(value), dropout_p=p)
            .transpose(1, 2)
            .values()
        )

    def padded_again():
        return repadded_attention(query, key, value, bounds, max(lengths), p, None)

    def step(attention):
        def run():
            attention().sum().backward()
            for x in (query, key, value):
                x.grad = None

        return run

    ways = {"per_block_sdpa": per_block_sdpa, "nested_jagged": nested_jagged, "padded_again": padded_again}
    times = timed_pair({name: step(way) for name, way in ways.items()}, args.warmup, args.steps, CLOCKS[args.clock])
    return {f"{name}_ms": round(1000 * statistics.median(t), 2) for name, t in times.items()}


def ner(corpus, directory: Path, args) -> dict:
    from spanlm.config import load_config
    from spanlm.models import BackboneConfig, build_backbone
    from spanlm.models.encoder import load_encoder
    from spanlm.models.hf_model import EncoderConfig
    from spanlm.ner.config import NerConfig, NerRecipe
    from spanlm.ner.data import read_documents
    from spanlm.ner.model import NerObjective
    from spanlm.ner.windows import make_windows
    from spanlm.train.loader import BatchKeySampler

    max_len = 128
    torch.manual_seed(0)
    backbone = build_backbone(BackboneConfig(**model_sizes(args.small), max_position_embeddings=max_len), corpus)
    backbone.save_pretrained(str(directory / "encoder"))
    corpus.tokenizer.save_pretrained(str(directory / "encoder"))
    train = REPO / "data" / "ner" / "wnut17" / "train.conll"
    recipe = load_config(None, [f"data.train={train}", "data.format=conll"], cls=NerRecipe)
    documents, _ = read_documents(train, recipe.data)
    labels = sorted({e.label for d in documents for e in d.entities})
    windows, _ = make_windows(corpus.tokenizer, documents, labels, max_len, 32)
    sampler = iter(BatchKeySampler(np.arange(len(windows)), args.ner_batch, seed=0, rank=0, world_size=1))
    keys = [next(sampler) for _ in range(args.batches * 4)]
    batches, steps = {}, {}
    for side in ("padded", "packed"):
        torch.manual_seed(0)
        objective = NerObjective(
            load_encoder(EncoderConfig(path=str(directory / "encoder"))), len(labels), NerConfig()
        ).train()
        windows.packed = side == "packed"
        batches[side] = [windows.batch(indices) for _, _, indices in keys]
        steps[side] = training_step(objective, batches[side], args.accel)
    examples = statistics.mean(len(b["token_mask"]) for b in batches["padded"])
    rates = compare(timed_pair(steps, args.warmup, args.ner_steps, CLOCKS[args.clock]), examples)
    return {
        "windows": max_len,
        "padding_share_padded": round(padding_share(batches["padded"]), 4),
        "padding_share_packed": round(padding_share(batches["packed"]), 4),
        "examples_per_s_padded": round(rates["padded"], 1),
        "examples_per_s_packed": round(rates["packed"], 1),
        "ratio": rates["ratio"],
        "ratio_paired_median": rates["ratio_paired_median"],
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="spanlm-bench-packing-") as scratch:
        corpus = prepare_corpus(Path(scratch), args.small)
        seqs = [int(s) for s in args.seqs.split(",")]
        result = {
            "device": "cpu",
            "threads": torch.get_num_threads(),
            "clock": args.clock,
            "accel": args.accel,
            "family": args.family,
            "batch": args.batch,
            "pretraining": {str(seq): pretraining(corpus, seq, args) for seq in seqs},
        }
        if args.ner_steps:
            result["ner_wnut17"] = ner(corpus, Path(scratch), args)
    result["ratio_first_seq"] = result["pretraining"][str(seqs[0])]["ratio"]
    if args.ner_steps:
        result["ner_ratio"] = result["ner_wnut17"]["ratio"]
    print(json.dumps(result), file=sys.stdout)


if __name__ == "__main__":
    main()
