"""Benchmark: one SpanBERT training step of spanlm on a ModernBERT against transformers' ModernBertForMaskedLM,
and against spanlm's own BERT path per FLOP, in one process.

Three sides, one optimiser step each (forward, backward, clipping at 1.0, AdamW step, ``zero_grad``), on the
same blocks of exactly ``--seq`` tokens, no dropout (ModernBERT's pretraining has none):

    spanlm      ``build_objective`` of a SpanBERT recipe (``masking.scheme: span`` at ``--rate``, MLM + SBO heads
                at their target rows only) with ``model.family: modernbert``, the speed backend applied as the
                Trainer applies it (``train.accel: auto``), ``build_optimizer`` and ``clip_gradients``
                (train_step.py's ``build_spanlm`` / ``make_step``).
    peer        ``transformers.ModernBertForMaskedLM`` of the same config with ``sparse_prediction`` on (its
                head projects only the labelled rows), SDPA, fed by ``DataCollatorForLanguageModeling``
                (``mlm_probability`` = ``--rate``, so as many masked tokens in expectation) over the same
                blocks; fused AdamW with the HF Trainer's parameter groups.
    bert        spanlm's SpanBERT on ``model.family: bert`` of the same width and depth (BERT's 4×hidden
                feed-forward), the path bench/train_step.py measures: compared per FLOP, not per token.

FLOPs per token of a step: ``6·(N_encoder + N_head) + 12·layers·seq·hidden`` with ModernBERT's
``N_encoder = layers·(4H² + 3H·I)`` (GeGLU: Wi is H → 2I), BERT's ``layers·(4H² + 2H·I)``, and the heads at their
rows only (spanlm: MLM + SBO targets; peer: its labelled rows): ``(n / T)·(H² + H·V)`` plus SBO's
``(n_sbo / T)·((2H + 200)·H + H²)``. Sliding-window layers are counted as global (SDPA computes the masked
scores anyway). ``ratio`` = spanlm ÷ peer tokens/s (median step times, steps alternating A B B A …);
``flops_ratio_vs_bert`` = spanlm-ModernBERT ÷ spanlm-BERT executed FLOP/s.

    python bench/train_step_modern.py [--seq 128] [--steps 10] [--warmup 2] [--batch 16] [--data data/corpus]
                                      [--objective spanbert|mlm]   # mlm: spanlm's MLM objective, the peer's work
                                      [--compile]   # torch.compile every side's forward (``train.compile``)

With ``--compile`` the warm-up is at least ``--batches`` + 1 steps (the target counts differ between batches, so
spanlm's forward recompiles once with a dynamic target count during the warm-up).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step  # noqa: E402  (its book inputs, block picking, spanlm side and step)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "bench/train_step_modern.py"
SBO_POSITION_SIZE = 200  # spanlm.heads.sbo.POSITION_SIZE


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=4, help="distinct batches per side, cycled")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=384, help="ModernBERT's GeGLU width (1.5 × hidden)")
    parser.add_argument("--window", type=int, default=64, help="ModernBERT's local_attention")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--rate", type=float, default=0.3)
    parser.add_argument(
        "--objective", choices=("spanbert", "mlm"), default="spanbert", help="mlm: the peer's own work, no SBO head"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile every side's forward")
    parser.add_argument("--data", default="data/corpus")
    parser.add_argument("--work", default=str(REPO / "runs" / "bench" / "train_step_modern"))
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def recipe_dict(args, inputs: list[str], work: Path, family: str) -> dict:
    model = {
        "family": family,
        "hidden_size": args.hidden,
        "num_layers": args.layers,
        "num_heads": args.heads,
        "intermediate_size": args.intermediate if family == "modernbert" else 4 * args.hidden,
        "max_position_embeddings": max(512, args.seq),
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
    }
    if family == "modernbert":
        model["local_attention"] = args.window
    return {
        "seed": 0,
        "data": {"inputs": inputs, "prepared_dir": str(work / "prepared"), "max_len": args.seq},
        "tokenizer": {"kind": "wordpiece", "vocab_size": args.vocab, "min_frequency": 1, "lowercase": True},
        "model": model,
        "masking": {"scheme": "span", "span": {"rate": args.rate}}
        if args.objective == "spanbert"
        else {"scheme": "mlm", "mlm": {"rate": args.rate}},
        "objective": {"name": args.objective},
        "train": {"batch_size": args.batch, "max_grad_norm": 1.0},
    }


def build_peer(args, corpus, recipe):
    from transformers import ModernBertConfig, ModernBertForMaskedLM
    from transformers.trainer_pt_utils import get_parameter_names

    special = corpus.special_ids
    config = ModernBertConfig(
        vocab_size=corpus.vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate,
        max_position_embeddings=512,
        local_attention=args.window,
        pad_token_id=special["pad"],
        bos_token_id=special["cls"],
        eos_token_id=special["sep"],
        cls_token_id=special["cls"],
        sep_token_id=special["sep"],
        sparse_prediction=True,
    )
    torch.manual_seed(args.seed)
    model = ModernBertForMaskedLM(config)
    model.set_attn_implementation("sdpa")
    model.train()
    forbidden = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], forbidden))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": recipe.train.weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(
        groups, lr=recipe.train.lr, betas=tuple(recipe.train.betas), eps=recipe.train.eps, fused=True
    )
    return model, optimizer


def flops_per_token(args, family: str, rows_per_token: float, sbo_per_token: float, vocab: int) -> float:
    hidden, layers = args.hidden, args.layers
    if family == "modernbert":
        encoder = layers * (4 * hidden**2 + 3 * hidden * args.intermediate)
    else:
        encoder = layers * (4 * hidden**2 + 2 * hidden * 4 * hidden)
    head = rows_per_token * (hidden**2 + hidden * vocab)
    head += sbo_per_token * ((2 * hidden + SBO_POSITION_SIZE) * hidden + hidden**2 + hidden * vocab)
    return 6 * (encoder + head) + 12 * layers * args.seq * hidden


def main(argv=None) -> None:
    args = parse_args(argv)
    from transformers import DataCollatorForLanguageModeling

    from spanlm.config import from_dict
    from spanlm.data.blocks import BlockDataset, collate_blocks
    from spanlm.data.prepare import prepare
    from spanlm.data.shards import PreparedCorpus
    from spanlm.pretrain.recipe import Recipe
    from spanlm.train.optim import clip_gradients

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    inputs = train_step.book_inputs(args.data, work)
    recipes = {family: from_dict(Recipe, recipe_dict(args, inputs, work, family)) for family in ("modernbert", "bert")}
    corpus = PreparedCorpus(prepare(recipes["modernbert"], log=lambda *_: None))
    blocks = BlockDataset(corpus, args.seq)
    chosen, full = train_step.pick_blocks(blocks, args.seq, args.batch * args.batches, args.seed)
    groups = [chosen[i * args.batch : (i + 1) * args.batch] for i in range(args.batches)]
    pad = corpus.special_ids["pad"]

    sides, batches, targets = {}, {}, {}
    for family in ("modernbert", "bert"):
        objective, optimizer, norm = train_step.build_spanlm(recipes[family], corpus, args.seed)
        clip = lambda o, p, m, norm=norm: clip_gradients(o, p, m, norm=norm)  # noqa: E731
        forward = torch.compile(objective.forward) if args.compile else objective.forward
        sides[family] = train_step.make_step(objective, optimizer, lambda b, f=forward: f(b)["loss"], False, 1.0, clip)
        masked = [
            objective.masker(collate_blocks([blocks[int(i)] for i in g], pad), np.random.default_rng([args.seed, n]))
            for n, g in enumerate(groups)
        ]
        batches[family] = [m.to_torch(objective.batch_fields) for m in masked]
        targets[family] = (
            statistics.mean(len(m.target_index) for m in masked),
            statistics.mean(len(m.extras.get("sbo_index", ())) for m in masked),  # none without SBO
        )
    peer, peer_optimizer = build_peer(args, corpus, recipes["modernbert"])
    peer_forward = torch.compile(peer.forward) if args.compile else peer.forward
    sides["peer"] = train_step.make_step(peer, peer_optimizer, lambda b: peer_forward(**b).loss, False, 1.0)
    collator = DataCollatorForLanguageModeling(corpus.tokenizer, mlm_probability=args.rate, return_tensors="pt")
    torch.manual_seed(args.seed)
    batches["peer"] = [
        collator(
            [
                {"input_ids": ids.tolist(), "special_tokens_mask": [1] + [0] * (len(ids) - 2) + [1]}
                for ids in (blocks[int(i)].ids for i in g)  # exactly --seq tokens unless the corpus has too few
            ]
        )
        for g in groups
    ]
    targets["peer"] = (statistics.mean(int((b["labels"] != -100).sum()) for b in batches["peer"]), 0.0)

    order = ["modernbert", "peer", "bert"]
    times = {name: [] for name in order}
    losses = {name: [] for name in order}
    warmup = max(args.warmup, args.batches + 1) if args.compile else args.warmup
    for step in range(warmup + args.steps):
        for name in order if step % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            loss = sides[name](batches[name][step % args.batches])
            elapsed = time.perf_counter() - start
            if step >= warmup:
                times[name].append(elapsed)
                losses[name].append(loss)

    tokens = args.batch * args.seq
    results = {}
    for name in order:
        family = "bert" if name == "bert" else "modernbert"
        rows, sbo = targets[name]
        median = statistics.median(times[name])
        per_token = flops_per_token(args, family, rows / tokens, sbo / tokens, corpus.vocab_size)
        results[name] = {
            "tokens_per_s": tokens / median,
            "median_step_s": median,
            "targets_mlm": rows,
            "targets_sbo": sbo,
            "flops_per_s": per_token * tokens / median,
            "loss_first_last": [losses[name][0], losses[name][-1]],
        }
    print(
        json.dumps(
            {
                "bench": "train_step_modern",
                "objective": args.objective,
                "seq": args.seq,
                "batch": args.batch,
                "full_blocks": full,
                "vocab": corpus.vocab_size,
                "threads": torch.get_num_threads(),
                "compile": args.compile,
                "ratio": results["modernbert"]["tokens_per_s"] / results["peer"]["tokens_per_s"],
                "flops_ratio_vs_bert": results["modernbert"]["flops_per_s"] / results["bert"]["flops_per_s"],
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
