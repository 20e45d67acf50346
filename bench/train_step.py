"""Benchmark: one SpanBERT training step of spanlm against transformers' BertForMaskedLM, in one process.

What is compared (one optimiser step each: forward, backward, gradient clipping at 1.0, AdamW step,
``zero_grad(set_to_none=True)``; the same tiny encoder on both sides: BERT, hidden 256, 4 layers,
4 heads, intermediate 1024, vocab 30,522, 512 positions, dropout 0.1, batch 16, seq 128 and 512)
    spanlm      ``build_objective`` on a Recipe with ``objective.name: spanbert``, ``masking.scheme: span``
                and ``model.family: bert`` of those sizes: the bare BertModel (no pooler) as spanlm runs
                it with ``spanlm.accel.apply`` (``train.accel: auto``, what the Trainer does; ``--accel off``
                for none): ``spanlm.accel.dropout``: FastDropout for every dropout; self-attention in training
                = ``spanlm.accel.attention``'s one autograd function, SDPA's math with that dropout on
                the probabilities), the MLM head and the Span Boundary
                Objective head, both computed only at their target rows, decoders tied to the input
                embedding and projected together, projection + cross-entropy fused
                (``spanlm.accel.cross_entropy``). Optimiser ``spanlm.train.optim.build_optimizer`` (AdamW as
                configured by default: no decay on biases / LayerNorm), clipped by
                ``spanlm.train.optim.clip_gradients`` (the clip factor inside fused AdamW's pass; the norm
                from ``spanlm.accel.gradient_norm``). The step
                is the body of ``Trainer._train_step`` + ``optimizer.step()`` of spanlm.train.loop, minus
                the data loader.
    peer        ``transformers.BertForMaskedLM`` with the same config and ``attn_implementation="sdpa"``,
                called with ``labels`` (the MLM head projects every position onto the vocabulary), fed
                by Hugging Face's own whole-word collator
                ``DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, whole_word_mask=True)``.
                Optimiser as the HF Trainer builds it by default on torch ≥ 2.8 (``adamw_torch_fused``:
                ``torch.optim.AdamW(fused=True)``, no decay on biases / LayerNorm), ``max_grad_norm`` 1.0.

Data: the Gutenberg books and tiny-shakespeare under ``--data`` (default external/english_text, see data/README.md)
prepared with spanlm into a WordPiece tokenizer of ``vocab_size`` 30,522 (``min_frequency`` 1, so the
corpus does fill 30,522 entries and both models' embeddings have exactly 30,522 rows; the actual size is
reported as ``vocab``). Each book is given to ``spanlm prepare`` as ONE document (a .jsonl record per
file): read as .txt, every blank line would end a document, and paragraphs would give blocks of ~35
tokens (3 blocks of the 18,530 reach 512). Blocks are spanlm's ``BlockDataset`` at ``max_len`` = seq;
only blocks of exactly seq tokens are used, so there is no padding and both sides process exactly
the same tokens (tokens/s counts non-pad tokens, i.e. B × seq).

Both sides get the SAME blocks: spanlm's batch is ``collate_blocks`` + its span masker; the peer's
batch is the collator called on features as a fast tokenizer would give them
(``input_ids``, ``special_tokens_mask``, ``offset_mapping``): the offsets are synthesised from spanlm's
word starts (a gap of one character before every word start), so the collator sees the same word
segmentation. (The HF whole-word collator replaces 100% of the chosen tokens by [MASK], as its source
forces ``mask_replace_prob = 1``; it does not change the peer's work, which is dense over all positions.)
``--batches`` distinct batches per side are built before timing and cycled: masking and collation are
outside the timed region for both sides.

Timing: fresh models per sequence length (same seed), ``--warmup`` untimed steps per side, then
``--steps`` timed steps per side, alternating step by step (the order flips every step: A B B A …).
tokens/s = tokens per step ÷ median step time; ``ratio`` = spanlm ÷ peer tokens/s at the smallest
sequence length of ``--seqs`` (128 by default; ``ratio_min`` is the smaller ratio over all lengths).
Per length, ``ratio_paired_median`` is the median over steps of peer time ÷ spanlm time of the same
step pair (robust to a load burst on this shared machine hitting a few steps).
``torch.set_num_threads`` is left at its default. The process keeps freed memory for reuse as spanlm's
CPU backend does (``spanlm.accel.host_memory.retain_freed_memory``, process-wide: both sides profit;
``--accel off`` keeps glibc's defaults).

FLOPs and MFU. FLOPs per token of an encoder MLM training step::

    6·(N_encoder + N_head) + 12·layers·seq·hidden,    N_encoder = layers·(4H² + 2H·I)

    dense head (what BertForMaskedLM computes):   N_head = H² + H·V              at every token
    masked-only heads (what spanlm computes):     N_head = (n_mlm / T)·(H² + H·V)
                                                         + (n_sbo / T)·((2H + 200)·H + H² + H·V)

with T the tokens of the batch, n_mlm / n_sbo the MLM / SBO targets (SBO term: the Span Boundary head
of spanlm, a position table of width 200). Embedding lookups, LayerNorms, softmax and the optimiser
are not counted. The matmul peak is measured in the same process: ``torch.mm`` of two
``--peak-size``² matrices (fp32; bf16 too with ``--bf16``, whose MFU is then against the bf16 peak),
best of 10 repetitions before the runs and after each sequence length, and one more product after
every timed step pair (best of 3), so the samples span the whole run. This virtual machine's speed
drifts by ±20% within minutes (the samples of one run range from 170 to 330 GFLOP/s; a peak sampled
only at a slow moment once gave a "dense formula" MFU above 1), so each timed step is compared with
the machine as it was at that moment: ``mfu`` = the median over the timed steps of spanlm's FLOPs
actually executed (masked-only formula) per second ÷ the higher of the two peak samples taken right
before and right after the step's pair, at the ``ratio`` sequence length (per side and length:
``mfu_executed_adjacent_peak``). ``mfu_best_peak`` (per side: ``mfu_executed``) divides the median
step's FLOP/s by the highest sample of the whole run instead — a lower bound. ``mfu_dense_formula``
credits spanlm with the dense-head FLOPs (the work the peer does for the same tokens), against the
highest sample too.

With ``--compile`` the warm-up is at least ``--batches`` + 1 steps (the target counts differ between
batches, so spanlm's forward recompiles once with a dynamic target count during the warm-up).

Output: one JSON line on stdout (anything printed meanwhile goes to stderr).

    python bench/train_step.py [--steps 16,6] [--warmup 2,1] [--seqs 128,512] [--batch 16]
                               [--batches 4] [--compile] [--bf16] [--seed 0] [--data DIR]
                               [--accel auto|off]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import step_inputs
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "bench/train_step.py"
WORK = REPO / "runs" / "bench" / "train_step"

HIDDEN, LAYERS, HEADS, INTERMEDIATE, VOCAB, POSITIONS = 256, 4, 4, 1024, 30522, 512
SBO_POSITION_SIZE = 200  # spanlm.heads.sbo.POSITION_SIZE


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--steps", default="16,6", help="timed steps per side, one number for every length or one per --seqs entry"
    )
    parser.add_argument("--warmup", default="2,1", help="untimed steps per side before timing (same form as --steps)")
    parser.add_argument("--seqs", default="128,512", help="sequence lengths (block max_len, [CLS]/[SEP] included)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=4, help="distinct pre-built batches per side, cycled")
    parser.add_argument("--compile", action="store_true", help="torch.compile both sides' forward")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides (weights stay fp32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--accel",
        choices=["auto", "off"],
        default="auto",
        help="spanlm's speed backend (train.accel; off: the model as built, glibc's malloc defaults)",
    )
    parser.add_argument("--peak-size", type=int, default=2048, help="matrix size of the matmul-peak measurement")
    parser.add_argument(
        "--data",
        default=str(REPO / "external" / "english_text"),
        help="directory searched recursively for *.txt (default: external/english_text, see data/README.md)",
    )
    parser.add_argument("--work", type=Path, default=WORK, help="where the books and prepared corpus are kept")
    args = parser.parse_args(argv)
    args.seqs = [int(s) for s in args.seqs.split(",")]
    args.steps = step_inputs.per_seq(args.steps, args.seqs, "--steps", SCRIPT)
    args.warmup = step_inputs.per_seq(args.warmup, args.seqs, "--warmup", SCRIPT)
    return args


# ---------------------------------------------------------------- data (untimed)


def book_inputs(data_dir: str, work: Path) -> list[str]:
    """Every *.txt under data_dir (relative: to the repository) as a one-record .jsonl: one book = one document."""
    root = Path(data_dir)
    return step_inputs.book_inputs(root if root.is_absolute() else REPO / root, work / "books", SCRIPT)


def base_recipe(inputs: list[str], work: Path) -> dict:
    return {
        "seed": 0,
        "data": {"inputs": inputs, "prepared_dir": str(work / "prepared")},
        "tokenizer": {"kind": "wordpiece", "vocab_size": VOCAB, "min_frequency": 1, "lowercase": True},
        "model": {
            "family": "bert",
            "hidden_size": HIDDEN,
            "num_layers": LAYERS,
            "num_heads": HEADS,
            "intermediate_size": INTERMEDIATE,
            "max_position_embeddings": POSITIONS,
        },
        "masking": {"scheme": "span"},
        "objective": {"name": "spanbert"},
        "train": {"batch_size": 16, "max_grad_norm": 1.0},
    }


def pick_blocks(blocks, seq: int, count: int, seed: int) -> tuple[np.ndarray, bool]:
    """``count`` block indices of exactly ``seq`` tokens (else the longest ones); True when all are full."""
    lengths = np.diff(blocks.index, axis=1)[:, 0] + 2
    full = np.flatnonzero(lengths == seq)
    rng = np.random.default_rng([seed, seq])
    if len(full) >= count:
        return np.sort(rng.choice(full, count, replace=False)), True
    print(f"only {len(full)} blocks of {seq} tokens: using the {count} longest (padded)", file=sys.stderr)
    return np.sort(np.argsort(-lengths, kind="stable")[:count]), False


def peer_features(block) -> dict:
    """What a fast tokenizer returns with return_special_tokens_mask / return_offsets_mapping, for one block.

    Offsets are synthesised from spanlm's word starts: a one-character gap before every word start, so
    the collator's ``_calc_word_ids_and_prob_mask`` finds exactly spanlm's words. Specials are (0, 0).
    """
    n = len(block.ids)
    special = np.zeros(n, dtype=np.int64)
    special[0] = special[-1] = 1
    starts = np.cumsum(block.word_starts.astype(np.int64)) + np.arange(n)
    offsets = np.stack([starts, starts + 1], axis=1)
    offsets[special == 1] = 0
    return {
        "input_ids": block.ids.tolist(),
        "special_tokens_mask": special.tolist(),
        "offset_mapping": offsets.tolist(),
    }


# ---------------------------------------------------------------- models and steps


def build_spanlm(recipe, corpus, seed: int):
    """spanlm's objective with the speed backend recipe.train.accel puts in (as the Trainer does), its optimiser
    and its clipping norm."""
    from spanlm import accel
    from spanlm.objectives import build_objective
    from spanlm.train.optim import build_optimizer, total_norm

    torch.manual_seed(seed)
    objective = build_objective(recipe, corpus)
    backend = accel.apply(objective, torch.device("cpu"), recipe.train.accel)
    objective.train()
    return objective, build_optimizer(objective, recipe.train), accel.gradient_norm(backend, total_norm)


def build_peer(corpus, recipe, seed: int):
    from transformers import AutoConfig, AutoModelForMaskedLM
    from transformers.trainer_pt_utils import get_parameter_names

    special = corpus.special_ids
    config = AutoConfig.for_model(
        "bert",
        vocab_size=corpus.vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        max_position_embeddings=POSITIONS,
        pad_token_id=special["pad"],
    )
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(config, attn_implementation="sdpa")
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


def make_step(module, optimizer, call, bf16: bool, max_norm: float, clip=None):
    """One optimiser step; ``clip(optimizer, parameters, max_norm)`` clips (default: ``clip_grad_norm_``)."""
    parameters = [p for p in module.parameters() if p.requires_grad]
    clip = clip or (lambda _, params, norm: torch.nn.utils.clip_grad_norm_(params, norm))

    def step(batch) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = call(batch)
        loss.backward()
        clip(optimizer, parameters, max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


# ---------------------------------------------------------------- FLOPs and peak


def encoder_flops_per_token(seq: int) -> float:
    n_encoder = LAYERS * (4 * HIDDEN**2 + 2 * HIDDEN * INTERMEDIATE)
    return 6 * n_encoder + 12 * LAYERS * seq * HIDDEN


def head_params(vocab: int) -> int:
    return HIDDEN**2 + HIDDEN * vocab


def sbo_head_params(vocab: int) -> int:
    return (2 * HIDDEN + SBO_POSITION_SIZE) * HIDDEN + HIDDEN**2 + HIDDEN * vocab


def matmul_peak(size: int, dtype: torch.dtype, reps: int = 10) -> float:
    """Best FLOP/s of torch.mm on two size×size matrices of ``dtype``."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


# ---------------------------------------------------------------- harness


def run_length(args, seq: int, steps: int, warmup: int, recipe_dict: dict, corpus, sample_peak) -> dict:
    from transformers import DataCollatorForLanguageModeling

    from spanlm.config import from_dict
    from spanlm.data.blocks import BlockDataset, collate_blocks
    from spanlm.masking.base import make_rng
    from spanlm.pretrain.recipe import Recipe
    from spanlm.train.optim import clip_gradients

    recipe_dict = json.loads(json.dumps(recipe_dict))
    recipe_dict["data"]["max_len"] = seq
    recipe_dict["train"]["batch_size"] = args.batch
    recipe_dict["train"]["accel"] = args.accel
    recipe = from_dict(Recipe, recipe_dict)

    blocks = BlockDataset(corpus, seq)
    chosen, full = pick_blocks(blocks, seq, args.batches * args.batch, args.seed)
    groups = [[blocks[int(i)] for i in chosen[k * args.batch : (k + 1) * args.batch]] for k in range(args.batches)]

    torch._dynamo.reset()
    objective, spanlm_optimizer, gradient_norm = build_spanlm(recipe, corpus, args.seed)
    model, peer_optimizer = build_peer(corpus, recipe, args.seed)

    pad = corpus.special_ids["pad"]
    spanlm_batches = [
        objective.masker(collate_blocks(g, pad), make_rng(args.seed, seq, k)).to_torch() for k, g in enumerate(groups)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Random token replacement is not supported with whole word masking"
        collator = DataCollatorForLanguageModeling(
            corpus.tokenizer, mlm_probability=0.15, whole_word_mask=True, seed=args.seed
        )
    peer_batches = [dict(collator([peer_features(b) for b in g])) for g in groups]

    spanlm_forward = objective.forward
    peer_forward = model.forward
    if args.compile:
        spanlm_forward = torch.compile(spanlm_forward)
        peer_forward = torch.compile(peer_forward)
    sides = {
        "spanlm": (
            make_step(
                objective,
                spanlm_optimizer,
                lambda b: spanlm_forward(b)["loss"],
                args.bf16,
                1.0,
                functools.partial(clip_gradients, norm=gradient_norm),
            ),
            spanlm_batches,
        ),
        "peer": (make_step(model, peer_optimizer, lambda b: peer_forward(**b).loss, args.bf16, 1.0), peer_batches),
    }
    tokens = {
        "spanlm": [int(b["attention_mask"].sum()) for b in spanlm_batches],
        "peer": [int(b["attention_mask"].sum()) for b in peer_batches],
    }
    assert tokens["spanlm"] == tokens["peer"], "both sides must see the same number of tokens"

    if args.compile:  # every distinct batch once (target counts vary: recompiles happen here)
        warmup = max(warmup, args.batches + 1)
    started = time.perf_counter()
    for i in range(warmup):
        for name, (step, batches) in sides.items():
            step(batches[i % args.batches])
    warmup_s = time.perf_counter() - started

    times = {name: [] for name in sides}
    losses = {name: [] for name in sides}
    order = list(sides)
    pair_peaks = [sample_peak()]  # one sample before the first pair, then one after every pair
    for i in range(steps):
        k = (warmup + i) % args.batches
        for name in order if i % 2 == 0 else order[::-1]:
            step, batches = sides[name]
            start = time.perf_counter()
            losses[name].append(step(batches[k]))
            times[name].append(time.perf_counter() - start)
        print(f"seq {seq} step {i}: spanlm {times['spanlm'][-1]:.3f}s  peer {times['peer'][-1]:.3f}s", file=sys.stderr)
        pair_peaks.append(sample_peak())  # untimed: one matmul-peak sample between pairs

    step_tokens = statistics.mean(tokens["spanlm"])
    n_mlm = statistics.mean(len(b["target_index"]) for b in spanlm_batches)
    n_sbo = statistics.mean(len(b["sbo_labels"]) for b in spanlm_batches)
    n_peer = statistics.mean(int((b["labels"] != -100).sum()) for b in peer_batches)
    vocab = corpus.vocab_size
    encoder = encoder_flops_per_token(seq)
    dense = encoder + 6 * head_params(vocab)
    spanlm_masked = encoder + 6 * (n_mlm * head_params(vocab) + n_sbo * sbo_head_params(vocab)) / step_tokens
    peer_masked = encoder + 6 * n_peer * head_params(vocab) / step_tokens
    result = {
        "seq": seq,
        "full_length_blocks": full,
        "tokens_per_step": step_tokens,
        "steps": steps,
        "warmup": warmup,
        "warmup_s": round(warmup_s, 1),
    }
    for name in sides:
        median = statistics.median(times[name])
        result[name] = {
            "tokens_per_s": round(step_tokens / median, 1),
            "tokens_per_s_mean": round(step_tokens * steps / sum(times[name]), 1),
            "step_ms_median": round(1000 * median, 1),
            "step_s": [round(t, 3) for t in times[name]],
            "loss_first_last": [round(losses[name][0], 3), round(losses[name][-1], 3)],
        }
    result["ratio"] = round(result["spanlm"]["tokens_per_s"] / result["peer"]["tokens_per_s"], 3)
    # Each step's pair ran back to back: the median of the per-pair ratios resists load bursts that hit one pair.
    result["ratio_paired_median"] = round(statistics.median(p / s for s, p in zip(times["spanlm"], times["peer"])), 3)
    result["spanlm"].update(
        targets_mlm=n_mlm,
        targets_sbo=n_sbo,
        flops_per_token_executed=round(spanlm_masked),
        flops_per_token_dense_formula=round(dense),
    )
    result["peer"].update(
        targets_mlm=n_peer, flops_per_token_executed=round(dense), flops_per_token_masked_formula=round(peer_masked)
    )
    result["_flops"] = {"spanlm": (spanlm_masked, dense), "peer": (dense, peer_masked)}
    # The machine's speed drifts within a run: each step is also compared with the matmul peak measured
    # right before and right after its pair (the higher of the two), and the median over steps is taken.
    for name, executed in (("spanlm", spanlm_masked), ("peer", dense)):
        shares = [step_tokens * executed / t / max(pair_peaks[i], pair_peaks[i + 1]) for i, t in enumerate(times[name])]
        result[name]["mfu_executed_adjacent_peak"] = round(statistics.median(shares), 4)
    result["adjacent_peak_gflops"] = [round(v / 1e9, 1) for v in pair_peaks]
    result["params"] = {
        "spanlm": sum(p.numel() for p in objective.parameters()),
        "peer": sum(p.numel() for p in model.parameters()),
    }
    del sides, objective, model, spanlm_optimizer, peer_optimizer
    return result


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        import transformers

        from spanlm.config import from_dict
        from spanlm.data.prepare import prepare
        from spanlm.data.shards import PreparedCorpus
        from spanlm.pretrain.recipe import Recipe

        recipe_dict = base_recipe(book_inputs(args.data, args.work), args.work)
        prepared = prepare(from_dict(Recipe, recipe_dict), log=lambda message: print(message, file=sys.stderr))
        corpus = PreparedCorpus(prepared)

        peak_dtype = torch.bfloat16 if args.bf16 else torch.float32
        peaks = {"fp32": []} | ({"bf16": []} if args.bf16 else {})

        def measure_peaks(reps: int = 10) -> float:
            for name in peaks:
                peaks[name].append(
                    matmul_peak(args.peak_size, torch.float32 if name == "fp32" else torch.bfloat16, reps)
                )
            return peaks["bf16" if args.bf16 else "fp32"][-1]

        measure_peaks()
        results = []
        for seq, steps, warmup in zip(args.seqs, args.steps, args.warmup):
            results.append(run_length(args, seq, steps, warmup, recipe_dict, corpus, lambda: measure_peaks(reps=3)))
            measure_peaks()
    peak = max(peaks["bf16" if args.bf16 else "fp32"])

    for r in results:
        flops = r.pop("_flops")
        for name, (executed, other) in flops.items():
            rate = r[name]["tokens_per_s"]
            r[name]["gflops_executed"] = round(rate * executed / 1e9, 2)
            r[name]["mfu_executed"] = round(rate * executed / peak, 4)
            key = "mfu_dense_formula" if name == "spanlm" else "mfu_masked_formula"
            r[name][key] = round(rate * other / peak, 4)
    headline = min(results, key=lambda r: r["seq"])
    output = {
        "bench": "train_step",
        "ratio": headline["ratio"],
        "mfu": headline["spanlm"]["mfu_executed_adjacent_peak"],
        "mfu_best_peak": headline["spanlm"]["mfu_executed"],
        "mfu_dense_formula": headline["spanlm"]["mfu_dense_formula"],
        "ratio_seq": headline["seq"],
        "ratio_min": min(r["ratio"] for r in results),
        "ratio_paired_median": headline["ratio_paired_median"],
        "spanlm_tokens_per_s": headline["spanlm"]["tokens_per_s"],
        "peer_tokens_per_s": headline["peer"]["tokens_per_s"],
        "results": results,
        "peak_gflops": {
            k: {
                "best": round(max(vs) / 1e9, 1),
                "median": round(statistics.median(vs) / 1e9, 1),
                "worst": round(min(vs) / 1e9, 1),
                "samples": len(vs),
            }
            for k, vs in peaks.items()
        },
        "peak_used_gflops": round(peak / 1e9, 1),
        "peak_method": (
            f"torch.mm {args.peak_size}x{args.peak_size} {peak_dtype}: best of 10 before the runs and "
            "after each length, best of 3 before the first and after every timed step pair; mfu: per "
            "step against the higher sample adjacent to its pair, median over steps; mfu_best_peak "
            "and the dense formula: against the highest sample of the run"
        ),
        "flop_formula": (
            "per token: 6*(N_encoder + N_head) + 12*layers*seq*hidden; N_encoder = layers*(4H^2 + 2H*I); "
            "dense head N_head = H^2 + H*V; masked-only heads N_head = (n_mlm/T)*(H^2 + H*V) "
            "+ (n_sbo/T)*((2H+200)*H + H^2 + H*V) (SBO head, spanlm only); "
            "mfu = spanlm executed (masked-only) FLOP/s / adjacent peak at ratio_seq; "
            "mfu_dense_formula = spanlm tokens/s * dense-head FLOPs / peak"
        ),
        "vocab": corpus.vocab_size,
        "model": {
            "family": "bert",
            "hidden": HIDDEN,
            "layers": LAYERS,
            "heads": HEADS,
            "intermediate": INTERMEDIATE,
            "positions": POSITIONS,
            "dropout": 0.1,
            "attention": "sdpa",
        },
        "batch": args.batch,
        "distinct_batches": args.batches,
        "compile": args.compile,
        "bf16": args.bf16,
        "step": "forward + backward + gradient clipping at 1.0 + AdamW step + zero_grad; masking/collation untimed",
        "optimizers": {
            "spanlm": (
                "spanlm.train.optim.build_optimizer (torch.optim.AdamW(fused=True), no decay on biases / LayerNorm)"
            ),
            "peer": "torch.optim.AdamW(fused=True) (HF Trainer default adamw_torch_fused)",
        },
        "peer_collator": "DataCollatorForLanguageModeling(mlm_probability=0.15, whole_word_mask=True)",
        "data": (
            "gutenberg + tinyshakespeare, one document per book, spanlm WordPiece (min_frequency 1), full-length blocks"
        ),
        "accel": args.accel,
        "threads": torch.get_num_threads(),
        "cpus": len(os.sched_getaffinity(0)),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    print(json.dumps(output), file=stdout)


if __name__ == "__main__":
    main()
