"""GPU benchmark: spanlm's bf16 pretraining step and its CLI run against BertForMaskedLM, ModernBertForMaskedLM.

The strongest transformers setup a user would pick is the bar; every arm runs in one process.

Arms (``--arms``; each one optimiser step per batch: bf16 autocast forward, backward, clipping at 1.0, fused AdamW,
``zero_grad(set_to_none=True)``; weights and optimiser states fp32; every arm trains on blocks of the same corpus
and tokenizer (WordPiece of ``--vocab`` entries, BERT's 30,522 by default)). Names are KIND-LAYOUT-MODE, MODE
``eager`` or ``compiled``:

BERT-base (hidden 768, 12 layers, 12 heads, intermediate 3,072, 512 positions, dropout 0.1)
    mlm-packed-*, spanbert-packed-*, spanbert-padded-*
                spanlm's MLM or SpanBERT (``build_objective``: the heads at the target rows), its blocks (whole
                sentences, at most ``--seq`` tokens) packed into one stream (``data.packing``) or one per row padded
                to the longest, with the device's speed backend as the trainer applies it (``spanlm.accel.apply``),
                ``build_optimizer``'s fused AdamW and ``clip_gradients``; compiled as the trainer compiles
                (``spanlm.train.parallel.compile_forward``: once, the batch's lengths symbolic).
    gdes-padded-* (gdes-packed-* by ``--arms`` only)
                ELECTRA with DeBERTa-V3's gradient-disentangled embedding sharing
                (configs/pretrain/deberta_v3_gdes.yaml's objective at these sizes), padded: what ``data.packing:
                auto`` runs for DeBERTa; its attention spanlm.accel.disentangled's (SDPA with the relative bias:
                the recipe has attention dropout).
    gdesflex-padded-*, gdeshf-padded-*
                the same without attention dropout (FlexAttention with the relative terms in its score
                modification), and with transformers' own DisentangledSelfAttention (``train.accel: off``).
    peer-blocks-*
                ``transformers.BertForMaskedLM`` (``sdpa``) fed full blocks of exactly ``--seq`` tokens cut from the
                blocks' token stream, the way ``run_mlm.py``'s ``group_texts`` builds them (no padding at all), 15%
                masked by ``DataCollatorForLanguageModeling``, ``labels`` given (its head decodes every position);
                ``torch.optim.AdamW(fused=True)`` without decay on biases and norms (the HF Trainer's default),
                ``clip_grad_norm_``.
    peer-sdpa-* the same model fed the spanlm arms' blocks, padded to the longest by the same collator.
    peer-flash-flattened
                the same model with ``flash_attention_2`` on ``DataCollatorWithFlattening``'s rows (transformers'
                padding-free training); where flash-attn is not installed the arm says why.
ModernBERT-base (hidden 768, 22 layers, 12 heads, GeGLU 1,152, sliding window 128 on two of every three layers,
global every third, no dropout; 30% MLM)
    modern-packed-*
                spanlm's MLM on ``model.family: modernbert``, packed (its local layers through the varlen kernel's
                own window).
    modernpeer-sdpa-*
                ``transformers.ModernBertForMaskedLM`` (``sdpa``, ``sparse_prediction``: its head decodes the
                labelled rows only) on the same blocks, padded, 30% masked.
    modernpeer-flash-flattened
                the same with ``flash_attention_2`` on ``DataCollatorWithFlattening``'s rows, where installed.
The run itself
    cli-mlm-compiled, cli-modern-compiled
                ``python -m spanlm pretrain`` on the recipe of the mlm / modern arm (the same corpus, tokenizer,
                model, masking, batch size and length, ``train.compile: true``, ``train.precision: auto``, the
                recipe's own data loading) for ``--cli-steps`` steps; its figures are what its metrics.jsonl says of
                itself: the median ``tokens_per_s``, ``mfu`` and ``data_wait`` of its log windows after the first
                (which holds the compile), ``first_step_s`` (tracing and compiling) and ``recompiles``.

Data: the *.txt files under ``--data`` (default: the first of external/english_text (data/README.md),
shared/data/english_text and the embedded data/corpus), one document per file; ``--batches`` batches of
``--batch`` blocks, built before timing and cycled.

Per arm: ``--warmup`` untimed steps (compiled arms: at least every batch once, so that any recompile happens
there), then one step under ``torch.profiler`` (the attention kernels it saw; ``top_kernels``: the costliest
kernels, each with its share), one under ``torch.cuda.set_sync_debug_mode("warn")`` (``host_syncs`` and the
Python line of each, ``host_sync_sites``), then ``--steps`` timed steps between two device synchronisations.
``tokens_per_s`` counts real tokens (no padding); ``max_memory_gib`` is the arm's peak allocation; compiled arms
report dynamo's counters (``recompiles``: frames compiled after the first step).

FLOPs and MFU: every arm is credited by the formula the run logs (``spanlm.models.flops.training_flops`` of its
own model, on its own real tokens and blocks): ``6·N`` per token, N the encoders' dense weights (embeddings and a
tied decoder excluded), and ``12·d·n·r`` per attention layer and block of n tokens, r = n, or at most the window
in ModernBERT's local layers; DeBERTa's relative-position terms are not credited. ``mfu`` = those FLOPs per second
÷ the bf16 matmul peak measured in the same run (``torch.mm`` of two ``--peak-size``² bf16 matrices, best of 10,
before and after the arms; the best sample is used).

Ratios (tokens/s): ``headline`` = the CLI's MLM run ÷ the strongest BERT peer arm that ran; ``modern_headline``
likewise for ModernBERT; ``cli_vs_bench_step`` = each CLI arm ÷ the bench's own step of the same recipe (goal:
within 5%).

``--budget`` seconds: an arm is not started once they are spent (it records why); the GPU check passes the time its
tests left. An arm that raises records the error and the others still run. ``--tiny --device cpu`` runs the same
code on tiny models and the embedded corpus: a dry run where no GPU is at hand (its figures mean nothing). Output:
one JSON line on stdout (anything printed meanwhile goes to stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import step_inputs
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "bench/train_step_gpu.py"
IGNORE_INDEX = -100
# In this order (the headline first, so that a --budget that runs out cuts the least telling)
ARMS = [
    "cli-mlm-compiled",
    "mlm-packed-compiled",
    "peer-blocks-compiled",
    "peer-sdpa-compiled",
    "peer-flash-flattened",
    "cli-modern-compiled",
    "modern-packed-compiled",
    "modernpeer-sdpa-compiled",
    "modernpeer-flash-flattened",
    "spanbert-packed-compiled",
    "gdes-padded-compiled",
    "gdesflex-padded-compiled",
    "gdeshf-padded-compiled",
    "peer-blocks-eager",
    "mlm-packed-eager",
    "spanbert-padded-compiled",
]
# What a dry run on the CPU runs by default (compiling the others takes minutes there)
TINY_ARMS = ["mlm-packed-eager", "spanbert-padded-eager", "peer-blocks-eager", "peer-sdpa-compiled"]
TINY_ARMS += ["peer-flash-flattened", "gdes-padded-eager", "modern-packed-eager", "modernpeer-sdpa-eager"]
# Named with --arms only
EXTRA_ARMS = ["gdes-packed-eager", "gdes-packed-compiled", "spanbert-packed-eager", "spanbert-padded-eager"]
EXTRA_ARMS += ["peer-sdpa-eager", "modern-packed-compiled", "modernpeer-sdpa-compiled", "modern-packed-eager"]
EXTRA_ARMS += ["modernpeer-sdpa-eager", "gdes-padded-eager", "cli-mlm-eager", "cli-modern-eager"]
EXTRA_ARMS += ["gdesflex-padded-eager", "gdeshf-padded-eager"]
BERT_PEERS = ("peer-blocks-", "peer-sdpa-", "peer-flash-")
MODERN_PEERS = ("modernpeer-",)
KERNEL_WORDS = ("flash", "efficient", "fmha", "cudnn", "math", "attention")


@dataclasses.dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    positions: int


BERT_BASE = Size(hidden=768, layers=12, heads=12, intermediate=3072, vocab=30522, positions=512)
MODERNBERT_BASE = Size(hidden=768, layers=22, heads=12, intermediate=1152, vocab=30522, positions=8192)
TINY = Size(hidden=64, layers=2, heads=2, intermediate=128, vocab=1000, positions=128)
TINY_MODERN = Size(hidden=64, layers=3, heads=2, intermediate=96, vocab=1000, positions=128)
MODERN_WINDOW = 128  # ModernBERT's local_attention (a half-width of 64 each side)
MODERN_RATE = 0.3  # ModernBERT's masking rate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny: a dry run)")
    parser.add_argument("--tiny", action="store_true", help="tiny models on the embedded corpus (dry run)")
    parser.add_argument("--arms", help=f"comma-separated, in order (default: {ARMS}; --tiny: {TINY_ARMS})")
    parser.add_argument("--seq", type=int, default=None, help="block max_len (default 512; --tiny: 64)")
    parser.add_argument("--batch", type=int, default=None, help="blocks per step (default 32; --tiny: 2)")
    parser.add_argument("--vocab", type=int, default=None, help="WordPiece entries (default BERT's 30,522)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per arm")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per arm (compiled: >= --batches + 1)")
    parser.add_argument("--batches", type=int, default=3, help="distinct pre-built batches, cycled")
    parser.add_argument("--cli-steps", type=int, default=60, help="steps of a cli-* arm's run (logged every 10)")
    parser.add_argument("--budget", type=float, default=math.inf, help="seconds after which no arm is started")
    parser.add_argument("--peak-size", type=int, default=8192, help="matrix size of the bf16 matmul-peak measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partial", help="a JSON file rewritten after every arm with the figures so far")
    parser.add_argument("--data", default=None, help="directory searched recursively for *.txt")
    parser.add_argument(
        "--work", default=str(REPO / "runs" / "bench" / "train_step_gpu"), help="where the prepared corpus is kept"
    )
    args = parser.parse_args(argv)
    args.arms = [a for a in args.arms.split(",") if a] if args.arms else TINY_ARMS if args.tiny else ARMS
    unknown = [a for a in args.arms if a not in ARMS + EXTRA_ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS + EXTRA_ARMS)}")
    args.size = TINY if args.tiny else BERT_BASE
    args.modern_size = TINY_MODERN if args.tiny else MODERNBERT_BASE
    args.vocab = args.vocab or args.size.vocab
    args.seq = args.seq or (64 if args.tiny else 512)
    args.batch = args.batch or (2 if args.tiny else 32)
    if args.data is None:
        candidates = [REPO / "external" / "english_text", REPO / "shared" / "data" / "english_text"]
        args.data = str(next((p for p in candidates if p.is_dir() and not args.tiny), REPO / "data" / "corpus"))
    return args


# ---------------------------------------------------------------- recipes and data (untimed)


def base_recipe(inputs: list[str], size: Size, vocab: int, work: Path, seq: int, batch: int) -> dict:
    """The BERT-base SpanBERT recipe every BERT arm derives from (the tokenizer and corpus all arms share)."""
    return {
        "seed": 0,
        "data": {"inputs": inputs, "prepared_dir": str(work / f"prepared-{vocab}"), "max_len": seq},
        "tokenizer": {"kind": "wordpiece", "vocab_size": vocab, "min_frequency": 1, "lowercase": True},
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
        "train": {"max_grad_norm": 1.0, "precision": "bf16", "batch_size": batch},
    }


def kind_recipe(kind: str, recipe: dict, modern: Size) -> dict:
    """The recipe of a spanlm arm's ``kind`` (spanbert, mlm, gdes, modern) from the BERT-base SpanBERT one."""
    import yaml

    derived = json.loads(json.dumps(recipe))
    if kind == "mlm":
        derived["masking"], derived["objective"] = {"scheme": "mlm"}, {"name": "mlm"}
    elif kind in ("gdes", "gdesflex", "gdeshf"):  # configs/pretrain/deberta_v3_gdes.yaml's objective, these sizes
        path = REPO / "configs" / "pretrain" / "deberta_v3_gdes.yaml"
        shipped = yaml.safe_load(path.read_text(encoding="utf-8"))
        derived["model"]["family"] = shipped["model"]["family"]
        derived["masking"], derived["objective"] = shipped["masking"], shipped["objective"]
        if kind == "gdesflex":
            derived["model"]["attention_dropout"] = 0.0
        if kind == "gdeshf":
            derived["train"]["accel"] = "off"
    elif kind == "modern":
        derived["model"] = {
            "family": "modernbert",
            "hidden_size": modern.hidden,
            "num_layers": modern.layers,
            "num_heads": modern.heads,
            "intermediate_size": modern.intermediate,
            "max_position_embeddings": modern.positions,
            "local_attention": MODERN_WINDOW,
            "global_attention_every": 3,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
        }
        derived["masking"], derived["objective"] = {"scheme": "mlm", "mlm": {"rate": MODERN_RATE}}, {"name": "mlm"}
    return derived


def choose_blocks(blocks, count: int, seed: int) -> list[np.ndarray]:
    """``count`` block indices (drawn again where the corpus has fewer blocks: only speed is measured)."""
    rng = np.random.default_rng(seed)
    return rng.choice(len(blocks), count, replace=len(blocks) < count)


# ---------------------------------------------------------------- models and steps


def build_spanlm(recipe_dict: dict, corpus, device: torch.device, seed: int, packed: bool):
    from spanlm import accel
    from spanlm.config import from_dict
    from spanlm.objectives import build_objective
    from spanlm.pretrain.recipe import Recipe
    from spanlm.train.optim import build_optimizer

    recipe = from_dict(Recipe, recipe_dict)
    torch.manual_seed(seed)
    objective = build_objective(recipe, corpus).to(device)
    objective.train()
    # As the trainer does (its CPU kernels are a CPU-only speed-up: a dry run stays on plain PyTorch); a packed
    # run's attention is the device's varlen path under either mode
    accel.apply(objective, device, recipe.train.accel if device.type == "cuda" else "off", packed=packed)
    return objective, build_optimizer(objective, recipe.train)


def trainer_optimizer(model, weight_decay: float, device: torch.device) -> torch.optim.Optimizer:
    """The HF Trainer's default optimiser: fused AdamW, no decay on biases and norms (get_decay_parameter_names)."""
    from transformers.trainer_pt_utils import get_parameter_names

    forbidden = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], forbidden))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    fused = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=1e-4, **fused)


def build_peer(corpus, family: str, size: Size, device: torch.device, seed: int, attention: str):
    """transformers' ``BertForMaskedLM`` or ``ModernBertForMaskedLM`` (sparse prediction) of ``size``."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    special = corpus.special_ids
    common = {
        "vocab_size": corpus.vocab_size,
        "hidden_size": size.hidden,
        "num_hidden_layers": size.layers,
        "num_attention_heads": size.heads,
        "intermediate_size": size.intermediate,
        "max_position_embeddings": size.positions,
        "pad_token_id": special["pad"],
    }
    if family == "modernbert":
        common |= {
            "local_attention": MODERN_WINDOW,
            "global_attn_every_n_layers": 3,
            "sparse_prediction": True,
            "bos_token_id": special["cls"],
            "eos_token_id": special["sep"],
            "cls_token_id": special["cls"],
            "sep_token_id": special["sep"],
        }
    config = AutoConfig.for_model(family, **common)
    torch.manual_seed(seed)
    # flash-attn's check at init wants a half-precision model; the weights then go back to fp32, as in every arm
    dtype = {"dtype": torch.bfloat16} if attention == "flash_attention_2" else {}
    model = AutoModelForMaskedLM.from_config(config, attn_implementation=attention, **dtype).float().to(device)
    model.train()
    return model, trainer_optimizer(model, 0.01, device)


def make_step(module, optimizer, forward: Callable, device: torch.device, clip: Callable):
    """One optimiser step under bf16 autocast; returns the loss as a tensor (read after timing)."""
    parameters = [p for p in module.parameters() if p.requires_grad]

    def step(batch) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = forward(batch)
        loss.backward()
        clip(optimizer, parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def to_device(batch: dict, device: torch.device) -> dict:
    """Tensors to the device; host ints (a packed stream's longest segment) stay host ints."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def spanlm_arm(kind: str, packed: bool, compiled: bool, setting: dict) -> tuple[Callable, list[dict], float]:
    """The step, the batches and the mean model FLOPs of a batch (``training_flops``, as the run logs them)."""
    from spanlm.models.flops import training_flops
    from spanlm.pretrain.batches import MaskedBatches
    from spanlm.train.optim import clip_gradients
    from spanlm.train.parallel import compile_forward

    device = setting["device"]
    recipe = kind_recipe(kind, setting["recipe"], setting["modern_size"])
    objective, optimizer = build_spanlm(recipe, setting["corpus"], device, setting["seed"], packed)
    data = MaskedBatches(
        setting["blocks"], objective.masker, setting["pad"], seed=setting["seed"], rank=0, packed=packed
    )
    batches = [to_device(data[(0, k, group)], device) for k, group in enumerate(setting["groups"])]
    flops = training_flops(objective)
    forward = compile_forward(objective.forward, device) if compiled else objective.forward
    step = make_step(objective, optimizer, lambda b: forward(b)["loss"], device, clip_gradients)
    return step, batches, float(np.mean([float(flops(b)) for b in batches]))


def peer_arm(family: str, layout: str, compiled: bool, setting: dict) -> tuple[Callable, list[dict], float]:
    """transformers' model of ``family`` fed by its collators: ``blocks`` (group_texts: full rows of --seq tokens),
    ``sdpa`` (the arms' blocks padded) or ``flash`` (the same blocks flattened, flash_attention_2)."""
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithFlattening

    from spanlm.models.flops import training_flops

    device, corpus, blocks = setting["device"], setting["corpus"], setting["blocks"]
    size = setting["modern_size"] if family == "modernbert" else setting["size"]
    attention = "flash_attention_2" if layout == "flash" else "sdpa"
    model, optimizer = build_peer(corpus, family, size, device, setting["seed"], attention)
    rate = MODERN_RATE if family == "modernbert" else 0.15
    collator = DataCollatorForLanguageModeling(corpus.tokenizer, mlm_probability=rate, seed=setting["seed"])
    if layout == "blocks":  # run_mlm.py's group_texts: the token stream of the same blocks cut into full rows
        seq, rows = setting["seq"], len(setting["groups"][0])
        stream = np.concatenate([blocks[int(i)].ids for g in setting["groups"] for i in g])
        stream = np.resize(stream, len(setting["groups"]) * rows * seq)  # wrapped around where it falls short
        examples = [stream[k * seq : (k + 1) * seq] for k in range(len(setting["groups"]) * rows)]
        batches = [
            dict(collator([{"input_ids": x.tolist()} for x in examples[k * rows : (k + 1) * rows]]))
            for k in range(len(setting["groups"]))
        ]
    else:
        batches = [dict(collator([{"input_ids": blocks[int(i)].ids.tolist()} for i in g])) for g in setting["groups"]]
    lengths = [b["attention_mask"].sum(-1) for b in batches]
    if layout == "flash":  # the same masked blocks without their padding, one row, with flash-attn's bounds
        flatten = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
        batches = [
            flatten(
                [
                    {"input_ids": ids[mask.bool()].tolist(), "labels": labels[mask.bool()].tolist()}
                    for ids, labels, mask in zip(b["input_ids"], b["labels"], b["attention_mask"])
                ]
            )
            for b in batches
        ]
    batches = [to_device(b, device) for b in batches]
    flops = training_flops(model)
    mean_flops = float(np.mean([float(flops.of(n.sum(), n)) for n in lengths]))
    forward = torch.compile(model.forward) if compiled else model.forward
    step = make_step(
        model,
        optimizer,
        lambda b: forward(**b).loss,
        device,
        lambda _, params, norm: torch.nn.utils.clip_grad_norm_(params, norm),
    )
    return step, batches, mean_flops


def flash_unavailable(device: torch.device) -> str | None:
    """Why a flattened peer cannot run here (None: it can)."""
    from transformers.utils import is_flash_attn_2_available

    if device.type != "cuda":
        return "flash attention needs a CUDA device"
    if not is_flash_attn_2_available():
        return "flash-attn is not installed (transformers.utils.is_flash_attn_2_available() is False)"
    return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


# ---------------------------------------------------------------- the CLI's own run


def cli_arm(kind: str, compiled: bool, setting: dict, args) -> dict:
    """``python -m spanlm pretrain`` on the recipe of the bench's ``kind`` arm for ``--cli-steps`` steps, in a
    subprocess on the same device; what its metrics.jsonl says of itself."""
    import statistics
    import subprocess

    import yaml

    work = Path(args.work)
    recipe = kind_recipe(kind, setting["recipe"], setting["modern_size"])
    output = work / f"cli-{kind}"
    if output.exists():
        import shutil

        shutil.rmtree(output)
    recipe["train"] = {
        **recipe["train"],
        "precision": "auto",
        "compile": compiled,
        "device": setting["device"].type,
        "output_dir": str(output),
        "max_steps": args.cli_steps,
        "log_every": max(1, args.cli_steps // 6),
        "eval_every": 0,
        "save_every": args.cli_steps,
        "keep_last": 1,
    }
    recipe["logging"] = {"report_to": [], "progress": False}
    path = work / f"cli-{kind}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "spanlm", "pretrain", str(path)], stdout=sys.stderr, timeout=900)
    if done.returncode:
        return {"error": f"spanlm pretrain exited {done.returncode}"}
    from spanlm.train.metrics import read_metrics

    records = [r for r in read_metrics(output) if r["kind"] == "train"]
    steady = records[1:] or records

    def median(key: str) -> float | None:
        values = [r[key] for r in steady if isinstance(r.get(key), (int, float))]
        return statistics.median(values) if values else None

    return {
        "tokens_per_s": round(median("tokens_per_s"), 1),
        "mfu_logged": round(median("mfu"), 4) if median("mfu") is not None else None,
        "data_wait": round(median("data_wait"), 4),
        "first_step_s": records[0].get("first_step_s"),
        "recompiles": records[-1].get("recompiles"),
        "tokens_per_s_windows": [round(r["tokens_per_s"], 1) for r in records],
        "steps": args.cli_steps,
        "arm_s": round(time.perf_counter() - started, 1),
    }


# ---------------------------------------------------------------- what a step does


def profiled_step(step: Callable, batch: dict, device: torch.device, top: int = 12) -> tuple[list[str], list[list]]:
    """One step under the profiler: the attention-looking kernel and operator names it saw, and where the time
    went: the ``top`` kernels (CPU: operators) by self time, each [name, ms, share of the step's self time]."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        step(batch)
        synchronize(device)
    events = profiler.key_averages()
    names = {event.key for event in events}
    kernels = sorted(name[:120] for name in names if any(word in name.lower() for word in KERNEL_WORDS))[:30]
    if device.type == "cuda":  # kernels only: an operator's self device time is its kernels'
        timed = [(e.key, e.self_device_time_total) for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        timed = [(e.key, e.self_cpu_time_total) for e in events]
    total = sum(t for _, t in timed) or 1.0
    timed.sort(key=lambda kt: kt[1], reverse=True)
    return kernels, [[name[:100], round(t / 1000, 3), round(t / total, 4)] for name, t in timed[:top]]


def host_syncs(step: Callable, batch: dict, device: torch.device) -> tuple[int | None, list[str] | None]:
    """Host synchronisations in one step, as CUDA's sync debug mode warns of them, and where the Python code
    that caused each one stands (``file:line``, as the warning names it); (None, None) off CUDA."""
    if device.type != "cuda":
        return None, None
    synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    synchronize(device)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    return len(syncs), [f"{Path(w.filename).name}:{w.lineno}" for w in syncs][:10]


def dynamo_counts() -> dict:
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    return {
        "graph_breaks": sum(breaks.values()),
        "graph_break_reasons": [reason.splitlines()[0][:200] for reason, _ in breaks.most_common(3)],
        "compiled_frames": counters["frames"]["ok"],
        "unique_graphs": counters["stats"]["unique_graphs"],
    }


# ---------------------------------------------------------------- harness


def run_arm(name: str, setting: dict, args) -> dict:
    device = setting["device"]
    kind, layout, mode = name.split("-")
    compiled = mode == "compiled"
    if layout == "flash" and (reason := flash_unavailable(device)):
        return {"skipped": reason}
    if kind == "cli":
        return cli_arm(layout, compiled, setting, args)
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    if kind in ("peer", "modernpeer"):
        family = "modernbert" if kind == "modernpeer" else "bert"
        step, batches, flops = peer_arm(family, layout, compiled, setting)
    else:
        step, batches, flops = spanlm_arm(kind, layout == "packed", compiled, setting)
    tokens = float(np.mean([float(b["attention_mask"].sum()) for b in batches]))
    warmup = max(args.warmup, args.batches + 1) if compiled else args.warmup
    losses = [step(batches[0])]
    first = dynamo_counts()
    for i in range(1, warmup):
        losses.append(step(batches[i % args.batches]))
    synchronize(device)
    kernels, top = profiled_step(step, batches[warmup % args.batches], device)
    syncs, sync_sites = host_syncs(step, batches[(warmup + 1) % args.batches], device)
    synchronize(device)
    start = time.perf_counter()
    for i in range(args.steps):
        losses.append(step(batches[(warmup + 2 + i) % args.batches]))
    synchronize(device)
    seconds = (time.perf_counter() - start) / args.steps
    result = {
        "tokens_per_s": round(tokens / seconds, 1),
        "step_ms": round(1000 * seconds, 2),
        "tokens_per_step": round(tokens, 1),
        "_flops_per_s": flops / seconds,
        "loss_first_last": [round(float(losses[0]), 3), round(float(losses[-1]), 3)],
        "attention_kernels": kernels,
        "top_kernels": top,
        "host_syncs": syncs,
        "host_sync_sites": sync_sites,
        "arm_s": round(time.perf_counter() - started, 1),
    }
    if device.type == "cuda":
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    if compiled:
        counts = dynamo_counts()
        counts["recompiles"] = counts["compiled_frames"] - first["compiled_frames"]
        result["dynamo"] = counts
    del step, batches
    return result


def ratios(arms: dict) -> dict:
    """The headline ratios of tokens/s (None where an arm did not run)."""

    def rate(name: str) -> float | None:
        return arms.get(name, {}).get("tokens_per_s")

    def strongest(prefixes: tuple[str, ...]) -> str | None:
        ran = [name for name in arms if name.startswith(prefixes) and rate(name)]
        return max(ran, key=rate) if ran else None

    def ratio(a: str | None, b: str | None) -> float | None:
        return round(rate(a) / rate(b), 3) if a and b and rate(a) and rate(b) else None

    bert_peer, modern_peer = strongest(BERT_PEERS), strongest(MODERN_PEERS)
    return {
        "strongest_peer": bert_peer,
        "headline": ratio("cli-mlm-compiled", bert_peer),
        "bench_mlm_vs_strongest_peer": ratio("mlm-packed-compiled", bert_peer),
        "spanbert_vs_strongest_peer": ratio("spanbert-packed-compiled", bert_peer),
        "strongest_modern_peer": modern_peer,
        "modern_headline": ratio("cli-modern-compiled", modern_peer),
        "bench_modern_vs_strongest_peer": ratio("modern-packed-compiled", modern_peer),
        "cli_vs_bench_step": {
            "mlm": ratio("cli-mlm-compiled", "mlm-packed-compiled"),
            "modern": ratio("cli-modern-compiled", "modern-packed-compiled"),
        },
        "packed_vs_padded_eager": ratio("spanbert-packed-eager", "spanbert-padded-eager"),
        # spanlm's disentangled attention against transformers' own, the whole GDES step
        "gdes_vs_transformers_attention": ratio("gdes-padded-compiled", "gdeshf-padded-compiled"),
        "gdesflex_vs_transformers_attention": ratio("gdesflex-padded-compiled", "gdeshf-padded-compiled"),
    }


def summary(arms: dict, peaks: list[float], lengths: list[list[int]], corpus, args, began: float) -> dict:
    """The bench's output: every arm's figures, MFU against the best peak measured so far, the ratios."""
    import transformers

    peak = max(peaks)
    arms = {name: dict(arm) for name, arm in arms.items()}
    for arm in arms.values():
        if "_flops_per_s" in arm:
            arm["mfu"] = round(arm.pop("_flops_per_s") / peak, 4)
    device = torch.device(args.device)
    tokens = float(np.mean([sum(g) for g in lengths]))
    return {
        "bench": "train_step_gpu",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        "mfu": {name: arm["mfu"] for name, arm in arms.items() if "mfu" in arm},
        "tokens_per_s": {name: arm["tokens_per_s"] for name, arm in arms.items() if "tokens_per_s" in arm},
        "ratios": ratios(arms),
        "arms": arms,
        "seq": args.seq,
        "batch": args.batch,
        "tokens_per_step": round(tokens, 1),
        # of the padded arms (each batch padded to its longest block)
        "padding_share": round(1 - tokens / float(np.mean([len(g) * max(g) for g in lengths])), 4),
        "peak_bf16_tflops": round(peak / 1e12, 2),
        "peak_samples_tflops": [round(p / 1e12, 2) for p in peaks],
        "peak_method": f"torch.mm {args.peak_size}x{args.peak_size} bf16, best of 10, before and after the arms",
        "vocab": corpus.vocab_size,
        "model": dataclasses.asdict(args.size) | {"dropout": 0.1},
        "modern_model": dataclasses.asdict(args.modern_size) | {"window": MODERN_WINDOW, "rate": MODERN_RATE},
        "steps": args.steps,
        "warmup": args.warmup,
        "batches": args.batches,
        "seconds": round(time.monotonic() - began, 1),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda},
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{SCRIPT}: no CUDA device (--device cpu --tiny runs a dry run)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    began = time.monotonic()
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        from spanlm.config import from_dict
        from spanlm.data.blocks import BlockDataset
        from spanlm.data.prepare import prepare
        from spanlm.data.shards import PreparedCorpus
        from spanlm.pretrain.recipe import Recipe

        work = Path(args.work)
        inputs = step_inputs.book_inputs(
            Path(args.data), work / "books", SCRIPT, skip=lambda path: "hongloumeng" in path.name
        )
        recipe = base_recipe(inputs, args.size, args.vocab, work, args.seq, args.batch)
        corpus = PreparedCorpus(prepare(from_dict(Recipe, recipe), log=lambda message: print(message, file=sys.stderr)))
        blocks = BlockDataset(corpus, args.seq)
        chosen = choose_blocks(blocks, args.batches * args.batch, args.seed)
        groups = [chosen[k * args.batch : (k + 1) * args.batch] for k in range(args.batches)]
        lengths = [[len(blocks[int(i)].ids) for i in g] for g in groups]
        setting = {
            "recipe": recipe,
            "corpus": corpus,
            "device": device,
            "seed": args.seed,
            "size": args.size,
            "modern_size": args.modern_size,
            "seq": args.seq,
            "blocks": blocks,
            "groups": groups,
            "pad": corpus.special_ids["pad"],
        }
        peaks = [matmul_peak(args.peak_size, device)]
        arms = {}
        for name in args.arms:
            if time.monotonic() - began > args.budget:
                arms[name] = {"skipped": f"--budget of {args.budget:.0f} s spent"}
                continue
            print(f"{SCRIPT}: {name}", file=sys.stderr)
            try:
                arms[name] = run_arm(name, setting, args)
            except Exception as error:  # one arm that fails (a compiler error) is a finding: the rest still run
                traceback.print_exc()  # the whole of it on stderr: a compiler error's source line is deep inside
                message = str(error).strip().splitlines()
                arms[name] = {"error": f"{type(error).__name__}: {message[0][:300] if message else ''}"}
                print(f"{SCRIPT}: {name} failed: {arms[name]['error']}", file=sys.stderr)
            if args.partial:  # a check cut short keeps what ran
                Path(args.partial).write_text(json.dumps(summary(arms, peaks, lengths, corpus, args, began)) + "\n")
        peaks.append(matmul_peak(args.peak_size, device))
    output = summary(arms, peaks, lengths, corpus, args, began)
    print(json.dumps(output), file=stdout)


if __name__ == "__main__":
    main()
