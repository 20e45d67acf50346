"""Benchmark on a GPU: one SpanBERT training step of spanlm against transformers' BertForMaskedLM, bf16.

What is compared (one optimiser step each: bf16 autocast forward, backward, gradient clipping at 1.0,
fused AdamW step, ``zero_grad(set_to_none=True)``; weights and optimiser states fp32 on both sides; the
same BERT-base encoder on both sides: hidden 768, 12 layers, 12 heads, intermediate 3072, vocab 30,522,
512 positions, dropout 0.1; seq 512 and 128)
    spanlm      ``build_objective`` on a Recipe with ``objective.name: spanbert``, ``masking.scheme: span``,
                ``model.family: bert`` of those sizes and ``train.precision: bf16``: the MLM and Span
                Boundary heads at their target rows only; ``spanlm.train.optim.build_optimizer`` (fused
                AdamW) clipped by ``spanlm.train.optim.clip_gradients`` — the body of the loop's step
                minus the data loader.
    peer        ``transformers.BertForMaskedLM`` (``attn_implementation="sdpa"``) called with ``labels``
                (its head projects every position onto the vocabulary), fed by
                ``DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)`` on the same blocks;
                ``torch.optim.AdamW(fused=True)`` (the HF Trainer's default), no decay on biases / LayerNorm,
                ``clip_grad_norm_`` at 1.0.

Data: the *.txt files under ``--data`` (default: the first of external/english_text (data/README.md),
shared/data/english_text (the device machine's copy) and the embedded data/corpus that exists), one
document per file, prepared
with a WordPiece of 30,522 entries (``min_frequency`` 1); only blocks of exactly seq tokens are used, so
both sides process the same tokens with no padding. ``--batches`` batches per side are built before
timing and cycled (masking and collation untimed).

Timing: fresh models per length (same seed), ``--warmup`` untimed steps per side, then ``--steps`` timed
steps per side, alternating (A B B A …); each step ends with a device synchronisation. tokens/s = tokens
per step ÷ median step time; ``ratio`` = spanlm ÷ peer tokens/s.

FLOPs and MFU. Dense-formula FLOPs per token of an encoder MLM training step (what BertForMaskedLM
computes; spanlm is credited with the same for the same tokens)::

    6·(N_encoder + N_head) + 12·layers·seq·hidden,   N_encoder = layers·(4H² + 2H·I),   N_head = H² + H·V

``mfu`` = tokens/s × those FLOPs ÷ the bf16 matmul peak, measured in the same run (``torch.mm`` of two
``--peak-size``² bf16 matrices, best of 10, before the runs and after each length; the best sample is
used and printed beside it). ``mfu_executed`` credits spanlm only with the FLOPs it executes (its heads
at the target rows).

``--tiny --device cpu`` runs the same code on a tiny model and the embedded corpus: a dry run of this
script where no GPU is at hand (its figures mean nothing).

Output: one JSON line on stdout (anything printed meanwhile goes to stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import step_inputs
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "bench/train_step_gpu.py"
IGNORE_INDEX = -100


@dataclasses.dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    positions: int


BERT_BASE = Size(hidden=768, layers=12, heads=12, intermediate=3072, vocab=30522, positions=512)
TINY = Size(hidden=64, layers=2, heads=2, intermediate=128, vocab=1000, positions=128)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny: a dry run)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the embedded corpus (dry run)")
    parser.add_argument("--seqs", default="512,128", help="sequence lengths (block max_len, [CLS]/[SEP] included)")
    parser.add_argument("--batch", default="32,128", help="blocks per step, one number or one per --seqs entry")
    parser.add_argument("--steps", default="20", help="timed steps per side (one number or one per --seqs entry)")
    parser.add_argument("--warmup", default="5", help="untimed steps per side (same form as --steps)")
    parser.add_argument("--batches", type=int, default=4, help="distinct pre-built batches per side, cycled")
    parser.add_argument("--compile", action="store_true", help="torch.compile both sides' forward")
    parser.add_argument("--peak-size", type=int, default=8192, help="matrix size of the bf16 matmul-peak measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="directory searched recursively for *.txt")
    parser.add_argument(
        "--work", default=str(REPO / "runs" / "bench" / "train_step_gpu"), help="where the prepared corpus is kept"
    )
    args = parser.parse_args(argv)
    args.seqs = [int(s) for s in args.seqs.split(",")]
    for name in ("batch", "steps", "warmup"):
        setattr(args, name, step_inputs.per_seq(getattr(args, name), args.seqs, f"--{name}", SCRIPT))
    args.size = TINY if args.tiny else BERT_BASE
    if args.data is None:
        candidates = (
            [REPO / "data" / "corpus"]
            if args.tiny
            else [
                REPO / "external" / "english_text",
                REPO / "shared" / "data" / "english_text",
                REPO / "data" / "corpus",
            ]
        )
        args.data = str(next(p for p in candidates if p.is_dir()))
    return args


# ---------------------------------------------------------------- data (untimed)


def book_inputs(data_dir: str, work: Path) -> list[str]:
    """Every *.txt under ``data_dir`` (Chinese text left out) as a one-record .jsonl: one file = one document."""
    return step_inputs.book_inputs(Path(data_dir), work / "books", SCRIPT, skip=lambda path: "hongloumeng" in path.name)


def base_recipe(inputs: list[str], size: Size, work: Path) -> dict:
    return {
        "seed": 0,
        "data": {"inputs": inputs, "prepared_dir": str(work / f"prepared-{size.vocab}")},
        "tokenizer": {"kind": "wordpiece", "vocab_size": size.vocab, "min_frequency": 1, "lowercase": True},
        "model": {
            "family": "bert",
            "hidden_size": size.hidden,
            "num_layers": size.layers,
            "num_heads": size.heads,
            "intermediate_size": size.intermediate,
            "max_position_embeddings": size.positions,
        },
        "masking": {"scheme": "span"},
        "objective": {"name": "spanbert"},
        "train": {"max_grad_norm": 1.0, "precision": "bf16"},
    }


def full_blocks(blocks, seq: int, count: int, seed: int) -> np.ndarray:
    """``count`` indices of blocks of exactly ``seq`` tokens (both sides then see the same tokens, unpadded)."""
    lengths = np.diff(blocks.index, axis=1)[:, 0] + 2  # + [CLS] and [SEP]
    full = np.flatnonzero(lengths == seq)
    if len(full) < count:
        sys.exit(f"{SCRIPT}: {len(full)} blocks of {seq} tokens, {count} needed (--data, --batch, --batches)")
    return np.sort(np.random.default_rng([seed, seq]).choice(full, count, replace=False))


# ---------------------------------------------------------------- models and steps


def build_spanlm(recipe, corpus, device: torch.device, seed: int):
    from spanlm.objectives import build_objective
    from spanlm.train.optim import build_optimizer

    torch.manual_seed(seed)
    objective = build_objective(recipe, corpus).to(device)
    objective.train()
    return objective, build_optimizer(objective, recipe.train)


def build_peer(corpus, recipe, size: Size, device: torch.device, seed: int):
    from transformers import AutoConfig, AutoModelForMaskedLM
    from transformers.trainer_pt_utils import get_parameter_names

    config = AutoConfig.for_model(
        "bert",
        vocab_size=corpus.vocab_size,
        hidden_size=size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        intermediate_size=size.intermediate,
        max_position_embeddings=size.positions,
        pad_token_id=corpus.special_ids["pad"],
    )
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(config, attn_implementation="sdpa").to(device)
    model.train()
    # Trainer.get_decay_parameter_names + create_optimizer with the default optim (adamw_torch_fused).
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


def make_step(module, optimizer, call, device: torch.device, clip):
    """One optimiser step under bf16 autocast; returns the loss as a tensor (read after timing)."""
    parameters = [p for p in module.parameters() if p.requires_grad]

    def step(batch) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = call(batch)
        loss.backward()
        clip(optimizer, parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- FLOPs and peak


def encoder_flops_per_token(size: Size, seq: int) -> float:
    n_encoder = size.layers * (4 * size.hidden**2 + 2 * size.hidden * size.intermediate)
    return 6 * n_encoder + 12 * size.layers * seq * size.hidden


def head_params(size: Size, vocab: int) -> int:
    return size.hidden**2 + size.hidden * vocab


def sbo_head_params(size: Size, vocab: int) -> int:
    from spanlm.heads.sbo import POSITION_SIZE

    return (2 * size.hidden + POSITION_SIZE) * size.hidden + size.hidden**2 + size.hidden * vocab


def matmul_peak(size: int, device: torch.device, reps: int = 10) -> float:
    """Best FLOP/s of torch.mm on two size×size bf16 matrices on ``device``."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    torch.mm(a, b)
    synchronize(device)
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


# ---------------------------------------------------------------- harness


def run_length(args, seq: int, batch: int, steps: int, warmup: int, recipe_dict: dict, corpus, device) -> dict:
    from transformers import DataCollatorForLanguageModeling

    from spanlm.config import from_dict
    from spanlm.data.blocks import BlockDataset, collate_blocks
    from spanlm.masking.base import make_rng
    from spanlm.pretrain.recipe import Recipe
    from spanlm.train.optim import clip_gradients

    recipe_dict = json.loads(json.dumps(recipe_dict))
    recipe_dict["data"]["max_len"] = seq
    recipe_dict["train"]["batch_size"] = batch
    recipe = from_dict(Recipe, recipe_dict)

    blocks = BlockDataset(corpus, seq)
    chosen = full_blocks(blocks, seq, args.batches * batch, args.seed)
    groups = [[blocks[int(i)] for i in chosen[k * batch : (k + 1) * batch]] for k in range(args.batches)]

    torch._dynamo.reset()
    objective, spanlm_optimizer = build_spanlm(recipe, corpus, device, args.seed)
    model, peer_optimizer = build_peer(corpus, recipe, args.size, device, args.seed)

    pad = corpus.special_ids["pad"]
    spanlm_batches = [
        objective.masker(collate_blocks(g, pad), make_rng(args.seed, seq, k)).to_torch() for k, g in enumerate(groups)
    ]
    collator = DataCollatorForLanguageModeling(corpus.tokenizer, mlm_probability=0.15, seed=args.seed)
    peer_batches = [dict(collator([{"input_ids": b.ids.tolist()} for b in g])) for g in groups]
    tokens = [int(b["attention_mask"].sum()) for b in spanlm_batches]
    assert tokens == [int(b["attention_mask"].sum()) for b in peer_batches], "both sides must see the same tokens"
    n_mlm = statistics.mean(len(b["target_index"]) for b in spanlm_batches)
    n_sbo = statistics.mean(len(b["sbo_labels"]) for b in spanlm_batches)
    n_peer = statistics.mean(int((b["labels"] != IGNORE_INDEX).sum()) for b in peer_batches)
    # (max_seq_len, a packed stream's longest segment, is a host int and stays one)
    spanlm_batches = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in spanlm_batches]
    peer_batches = [{k: v.to(device) for k, v in b.items()} for b in peer_batches]

    spanlm_forward, peer_forward = objective.forward, model.forward
    if args.compile:
        spanlm_forward, peer_forward = torch.compile(spanlm_forward), torch.compile(peer_forward)
    sides = {
        "spanlm": (
            make_step(objective, spanlm_optimizer, lambda b: spanlm_forward(b)["loss"], device, clip_gradients),
            spanlm_batches,
        ),
        "peer": (
            make_step(
                model,
                peer_optimizer,
                lambda b: peer_forward(**b).loss,
                device,
                lambda _, params, norm: torch.nn.utils.clip_grad_norm_(params, norm),
            ),
            peer_batches,
        ),
    }
    if args.compile:  # every distinct batch once (target counts vary: recompiles happen here)
        warmup = max(warmup, args.batches + 1)
    started = time.perf_counter()
    for i in range(warmup):
        for step, batches in sides.values():
            step(batches[i % args.batches])
    synchronize(device)
    warmup_s = time.perf_counter() - started

    times, losses, order = {name: [] for name in sides}, {name: [] for name in sides}, list(sides)
    for i in range(steps):
        k = (warmup + i) % args.batches
        for name in order if i % 2 == 0 else order[::-1]:
            step, batches = sides[name]
            synchronize(device)
            start = time.perf_counter()
            losses[name].append(step(batches[k]))
            synchronize(device)
            times[name].append(time.perf_counter() - start)
        print(f"seq {seq} step {i}: spanlm {times['spanlm'][-1]:.4f}s  peer {times['peer'][-1]:.4f}s", file=sys.stderr)

    step_tokens = statistics.mean(tokens)
    vocab = corpus.vocab_size
    encoder = encoder_flops_per_token(args.size, seq)
    dense = encoder + 6 * head_params(args.size, vocab)
    executed = (
        encoder + 6 * (n_mlm * head_params(args.size, vocab) + n_sbo * sbo_head_params(args.size, vocab)) / step_tokens
    )
    result = {
        "seq": seq,
        "batch": batch,
        "tokens_per_step": step_tokens,
        "steps": steps,
        "warmup": warmup,
        "warmup_s": round(warmup_s, 1),
        "flops_per_token_dense": round(dense),
        "_executed": executed,
    }
    for name in sides:
        median = statistics.median(times[name])
        result[name] = {
            "tokens_per_s": round(step_tokens / median, 1),
            "step_ms_median": round(1000 * median, 2),
            "step_ms": [round(1000 * t, 2) for t in times[name]],
            "loss_first_last": [round(float(losses[name][0]), 3), round(float(losses[name][-1]), 3)],
        }
    result["spanlm"].update(targets_mlm=n_mlm, targets_sbo=n_sbo)
    result["peer"].update(targets_mlm=n_peer)
    result["ratio"] = round(result["spanlm"]["tokens_per_s"] / result["peer"]["tokens_per_s"], 3)
    result["ratio_paired_median"] = round(statistics.median(p / s for s, p in zip(times["spanlm"], times["peer"])), 3)
    if device.type == "cuda":
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    del sides, objective, model, spanlm_optimizer, peer_optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{SCRIPT}: no CUDA device (--device cpu --tiny runs a dry run)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        import transformers

        from spanlm.config import from_dict
        from spanlm.data.prepare import prepare
        from spanlm.data.shards import PreparedCorpus
        from spanlm.pretrain.recipe import Recipe

        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = (
                True  # fp32 matmuls outside autocast (none on either side's hot path)
            )
        work = Path(args.work)
        recipe_dict = base_recipe(book_inputs(args.data, work), args.size, work)
        corpus = PreparedCorpus(
            prepare(from_dict(Recipe, recipe_dict), log=lambda message: print(message, file=sys.stderr))
        )
        peaks = [matmul_peak(args.peak_size, device)]
        results = []
        for seq, batch, steps, warmup in zip(args.seqs, args.batch, args.steps, args.warmup):
            results.append(run_length(args, seq, batch, steps, warmup, recipe_dict, corpus, device))
            peaks.append(matmul_peak(args.peak_size, device))
    peak = max(peaks)
    for r in results:
        executed = r.pop("_executed")
        for name in ("spanlm", "peer"):
            r[name]["mfu"] = round(r[name]["tokens_per_s"] * r["flops_per_token_dense"] / peak, 4)
        r["spanlm"]["mfu_executed"] = round(r["spanlm"]["tokens_per_s"] * executed / peak, 4)
    by_seq = {r["seq"]: r for r in results}
    output = {
        "bench": "train_step_gpu",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        "ratio": {seq: r["ratio"] for seq, r in by_seq.items()},
        "mfu": {seq: r["spanlm"]["mfu"] for seq, r in by_seq.items()},
        "peer_mfu": {seq: r["peer"]["mfu"] for seq, r in by_seq.items()},
        "spanlm_tokens_per_s": {seq: r["spanlm"]["tokens_per_s"] for seq, r in by_seq.items()},
        "peer_tokens_per_s": {seq: r["peer"]["tokens_per_s"] for seq, r in by_seq.items()},
        "peak_bf16_tflops": round(peak / 1e12, 2),
        "peak_samples_tflops": [round(p / 1e12, 2) for p in peaks],
        "peak_method": (
            f"torch.mm {args.peak_size}x{args.peak_size} bf16, best of 10, before the runs and after each length"
        ),
        "flop_formula": "per token: 6*(N_encoder + N_head) + 12*layers*seq*hidden; N_encoder = layers*(4H^2 + 2H*I); "
        "N_head = H^2 + H*V (dense, both sides); mfu_executed: spanlm's heads at its target rows only",
        "results": results,
        "vocab": corpus.vocab_size,
        "model": dataclasses.asdict(args.size) | {"dropout": 0.1, "attention": "sdpa"},
        "compile": args.compile,
        "step": (
            "bf16 autocast forward + backward + clipping at 1.0 + fused AdamW step + zero_grad; "
            "masking/collation untimed"
        ),
        "peer_collator": "DataCollatorForLanguageModeling(mlm_probability=0.15)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda},
    }
    print(json.dumps(output), file=stdout)


if __name__ == "__main__":
    main()
