"""Benchmark on a GPU: where a bf16 pretraining step's time goes, spanlm against transformers' BertForMaskedLM.

Arms (``--arms``; each one optimiser step per batch: bf16 autocast forward, backward, clipping at 1.0,
fused AdamW, ``zero_grad(set_to_none=True)``; weights and optimiser states fp32; every arm trains on the
same blocks; BERT-base by default: hidden 768, 12 layers, 12 heads, intermediate 3072, 512 positions,
dropout 0.1, vocab 30,522)
    spanbert-padded-eager / -compiled, spanbert-packed-eager / -compiled
                spanlm's SpanBERT (``build_objective``: MLM and SBO heads at the target rows), its blocks
                one per row padded to the longest, or packed into one stream (``MaskedBatches(packed=)``,
                what ``data.packing`` does), with the device's speed backend as the trainer applies it
                (``spanlm.accel.apply``), ``build_optimizer``'s fused AdamW and ``clip_gradients``;
                compiled as the trainer compiles (``torch.compile(objective.forward)``).
    gdes-padded-eager / -compiled
                spanlm's ELECTRA with DeBERTa-V3's gradient-disentangled embedding sharing
                (configs/pretrain/deberta_v3_gdes.yaml's objective at the BERT-base sizes: a generator of
                half the depth), padded: what ``data.packing: auto`` runs for DeBERTa, and ``true`` under
                compile; ``gdes-packed-eager / -compiled`` (by ``--arms`` only) packed.
    peer-sdpa-eager / -compiled
                ``transformers.BertForMaskedLM`` (``attn_implementation="sdpa"``) with ``labels`` (its head
                projects every position onto the vocabulary), fed by ``DataCollatorForLanguageModeling
                (mlm_probability=0.15)`` (padded to the longest); ``torch.optim.AdamW(fused=True)`` (the HF
                Trainer's default) without decay on biases and LayerNorm, ``clip_grad_norm_`` at 1.0.
    peer-flash-flattened
                the same model with ``attn_implementation="flash_attention_2"``, its masked blocks
                flattened into one row by ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``
                (transformers' padding-free training); where flash-attn is not installed the arm records why.

Data: the *.txt files under ``--data`` (default: the first of external/english_text (data/README.md),
shared/data/english_text and the embedded data/corpus), one document per file, prepared with a WordPiece
of 30,522 entries; ``--batches`` batches of ``--batch`` blocks of at most ``--seq`` tokens (whole
sentences, as training reads them), built before timing and cycled.

Per arm: ``--warmup`` untimed steps (compiled arms: at least every batch once, so that recompiles happen
there), then one step under ``torch.profiler`` (the attention kernels it saw: names containing flash,
efficient, fmha, cudnn, math or attention), one step under ``torch.cuda.set_sync_debug_mode("warn")``
(``host_syncs``: the warnings it raised, ``host_sync_sites``: the Python line each names; a non-logging step
should raise none), then ``--steps`` timed
steps between two device synchronisations. ``tokens_per_s`` counts real tokens (no padding);
``max_memory_gib`` is the arm's peak allocation; compiled arms report dynamo's counters: ``graph_breaks``
(with the first reasons), ``compiled_frames`` and ``recompiles`` (frames compiled after the first step).

FLOPs and MFU: every arm is credited with the same dense-formula FLOPs for its blocks (padding and
spanlm's sparse heads do not count), per block of n tokens ``6·N·n + 12·L·H·n²``, N the matmul weights
a dense model runs per token (SpanBERT and the peer: the encoder's ``L·(4H² + 2H·I)`` and BertForMaskedLM's
head ``H² + H·V``; GDES: its generator's and discriminator's encoders, the generator's MLM head and the
discriminator's head; DeBERTa's relative-position terms are not credited). ``mfu`` = those FLOPs per
second ÷ the bf16 matmul peak measured in the same run (``torch.mm`` of two ``--peak-size``² bf16
matrices, best of 10, before and after the arms; the best sample is used and printed beside it).

``--budget`` seconds: an arm is not started once they are spent (it records why); the GPU check passes
the time its tests left. An arm that raises (a compiler error) records the error and the others still run.
``--tiny --device cpu`` runs the same code on a tiny model and the embedded corpus: a dry run where no GPU
is at hand (its figures mean nothing). Output: one JSON line on stdout (anything
printed meanwhile goes to stderr).
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
    "spanbert-packed-compiled",
    "peer-sdpa-eager",
    "peer-sdpa-compiled",
    "spanbert-packed-eager",
    "spanbert-padded-eager",
    "spanbert-padded-compiled",
    "peer-flash-flattened",
    "gdes-padded-compiled",
    "gdes-padded-eager",
]
# What a dry run on the CPU runs by default (compiling the others takes minutes there)
TINY_ARMS = ["spanbert-packed-eager", "spanbert-padded-eager", "peer-sdpa-eager", "peer-sdpa-compiled"]
TINY_ARMS += ["peer-flash-flattened", "gdes-padded-eager"]
# Named with --arms only: DeBERTa-V3 packed, which data.packing: true runs eager (auto and train.compile pad it)
EXTRA_ARMS = ["gdes-packed-eager", "gdes-packed-compiled"]
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
TINY = Size(hidden=64, layers=2, heads=2, intermediate=128, vocab=1000, positions=128)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny: a dry run)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the embedded corpus (dry run)")
    parser.add_argument("--arms", help=f"comma-separated, in order (default: {ARMS}; --tiny: {TINY_ARMS})")
    parser.add_argument("--seq", type=int, default=None, help="block max_len (default 512; --tiny: 64)")
    parser.add_argument("--batch", type=int, default=None, help="blocks per step (default 32; --tiny: 2)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per arm")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per arm (compiled: >= --batches + 1)")
    parser.add_argument("--batches", type=int, default=3, help="distinct pre-built batches, cycled")
    parser.add_argument("--budget", type=float, default=math.inf, help="seconds after which no arm is started")
    parser.add_argument("--peak-size", type=int, default=8192, help="matrix size of the bf16 matmul-peak measurement")
    parser.add_argument("--seed", type=int, default=0)
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
    args.seq = args.seq or (64 if args.tiny else 512)
    args.batch = args.batch or (2 if args.tiny else 32)
    if args.data is None:
        candidates = [REPO / "external" / "english_text", REPO / "shared" / "data" / "english_text"]
        args.data = str(next((p for p in candidates if p.is_dir() and not args.tiny), REPO / "data" / "corpus"))
    return args


# ---------------------------------------------------------------- data (untimed)


def base_recipe(inputs: list[str], size: Size, work: Path, seq: int, batch: int) -> dict:
    return {
        "seed": 0,
        "data": {"inputs": inputs, "prepared_dir": str(work / f"prepared-{size.vocab}"), "max_len": seq},
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
        "train": {"max_grad_norm": 1.0, "precision": "bf16", "batch_size": batch},
    }


def gdes_recipe(recipe: dict) -> dict:
    """configs/pretrain/deberta_v3_gdes.yaml's model family and objective at ``recipe``'s sizes."""
    import yaml

    shipped = yaml.safe_load((REPO / "configs" / "pretrain" / "deberta_v3_gdes.yaml").read_text(encoding="utf-8"))
    gdes = json.loads(json.dumps(recipe))
    gdes["model"]["family"] = shipped["model"]["family"]
    gdes["masking"] = shipped["masking"]
    gdes["objective"] = shipped["objective"]
    return gdes


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
    accel.apply(objective, device, "auto" if device.type == "cuda" else "off", packed=packed)
    return objective, build_optimizer(objective, recipe.train)


def build_peer(corpus, recipe_dict: dict, size: Size, device: torch.device, seed: int, attention: str):
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
    # flash-attn's check at init wants a half-precision model; the weights then go back to fp32, as in every arm
    dtype = {"dtype": torch.bfloat16} if attention == "flash_attention_2" else {}
    model = AutoModelForMaskedLM.from_config(config, attn_implementation=attention, **dtype).float().to(device)
    model.train()
    # Trainer.get_decay_parameter_names + create_optimizer with the default optim (adamw_torch_fused).
    forbidden = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], forbidden))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    train = recipe_dict["train"]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": train.get("weight_decay", 0.01)},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    fused = {"fused": True} if device.type == "cuda" else {}
    return model, torch.optim.AdamW(groups, lr=1e-4, **fused)


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


def spanlm_arm(kind: str, packed: bool, compiled: bool, setting: dict) -> tuple[Callable, list[dict]]:
    from spanlm.pretrain.batches import MaskedBatches
    from spanlm.train.optim import clip_gradients

    recipe = setting["recipe"] if kind == "spanbert" else gdes_recipe(setting["recipe"])
    objective, optimizer = build_spanlm(recipe, setting["corpus"], setting["device"], setting["seed"], packed)
    data = MaskedBatches(
        setting["blocks"], objective.masker, setting["pad"], seed=setting["seed"], rank=0, packed=packed
    )
    batches = [to_device(data[(0, k, group)], setting["device"]) for k, group in enumerate(setting["groups"])]
    forward = torch.compile(objective.forward) if compiled else objective.forward
    step = make_step(objective, optimizer, lambda b: forward(b)["loss"], setting["device"], clip_gradients)
    return step, batches


def peer_arm(compiled: bool, flattened: bool, setting: dict) -> tuple[Callable, list[dict]]:
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithFlattening

    device, corpus = setting["device"], setting["corpus"]
    attention = "flash_attention_2" if flattened else "sdpa"
    model, optimizer = build_peer(corpus, setting["recipe"], setting["size"], device, setting["seed"], attention)
    collator = DataCollatorForLanguageModeling(corpus.tokenizer, mlm_probability=0.15, seed=setting["seed"])
    blocks = setting["blocks"]
    batches = [dict(collator([{"input_ids": blocks[int(i)].ids.tolist()} for i in g])) for g in setting["groups"]]
    if flattened:  # the same masked blocks without their padding, one row, with flash-attn's sequence bounds
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
    forward = torch.compile(model.forward) if compiled else model.forward
    step = make_step(
        model,
        optimizer,
        lambda b: forward(**b).loss,
        device,
        lambda _, params, norm: torch.nn.utils.clip_grad_norm_(params, norm),
    )
    return step, batches


def flash_unavailable(device: torch.device) -> str | None:
    """Why the flattened peer cannot run here (None: it can)."""
    from transformers.utils import is_flash_attn_2_available

    if device.type != "cuda":
        return "flash attention needs a CUDA device"
    if not is_flash_attn_2_available():
        return "flash-attn is not installed (transformers.utils.is_flash_attn_2_available() is False)"
    return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- FLOPs and peak


def dense_flops(lengths: list[int], encoders: list[tuple[int, int, int]], head_weights: int) -> float:
    """Dense-formula FLOPs of one step on blocks of ``lengths`` tokens, for encoders of (layers, hidden,
    intermediate) and ``head_weights`` matmul weights per token: 6·N·n + 12·L·H·n² per block."""
    weights = sum(layers * (4 * hidden**2 + 2 * hidden * inter) for layers, hidden, inter in encoders) + head_weights
    attention = sum(12 * layers * hidden for layers, hidden, _ in encoders)
    return float(sum(6 * weights * n + attention * n * n for n in lengths))


def credited_flops(kind: str, lengths: list[int], size: Size, vocab: int, recipe: dict) -> float:
    bert_head = size.hidden**2 + size.hidden * vocab
    encoder = (size.layers, size.hidden, size.intermediate)
    if kind != "gdes":
        return dense_flops(lengths, [encoder], bert_head)
    electra = gdes_recipe(recipe)["objective"]["electra"]
    width = electra.get("generator_width", 1.0)
    generator = (
        max(1, round(size.layers * electra.get("generator_depth", 1.0))),
        round(size.hidden * width),
        round(size.intermediate * width),
    )
    heads = generator[1] ** 2 + generator[1] * vocab + size.hidden**2 + size.hidden  # generator MLM + RTD
    return dense_flops(lengths, [generator, encoder], heads)


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
    if name == "peer-flash-flattened" and (reason := flash_unavailable(device)):
        return {"skipped": reason}
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    if kind == "peer":
        step, batches = peer_arm(compiled, layout == "flattened", setting)
    else:
        step, batches = spanlm_arm(kind, layout == "packed", compiled, setting)
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
    flops = setting["flops"]["gdes" if kind == "gdes" else "bert"]
    result = {
        "tokens_per_s": round(setting["tokens"] / seconds, 1),
        "step_ms": round(1000 * seconds, 2),
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
        import transformers

        from spanlm.config import from_dict
        from spanlm.data.blocks import BlockDataset
        from spanlm.data.prepare import prepare
        from spanlm.data.shards import PreparedCorpus
        from spanlm.pretrain.recipe import Recipe

        work = Path(args.work)
        inputs = step_inputs.book_inputs(
            Path(args.data), work / "books", SCRIPT, skip=lambda path: "hongloumeng" in path.name
        )
        recipe = base_recipe(inputs, args.size, work, args.seq, args.batch)
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
            "blocks": blocks,
            "groups": groups,
            "pad": corpus.special_ids["pad"],
            "tokens": float(np.mean([sum(g) for g in lengths])),
            "flops": {
                kind: float(np.mean([credited_flops(kind, g, args.size, corpus.vocab_size, recipe) for g in lengths]))
                for kind in ("bert", "gdes")
            },
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
        peaks.append(matmul_peak(args.peak_size, device))
    peak = max(peaks)
    for arm in arms.values():
        if "_flops_per_s" in arm:
            arm["mfu"] = round(arm.pop("_flops_per_s") / peak, 4)

    def rate(name: str) -> float | None:
        return arms.get(name, {}).get("tokens_per_s")

    def ratio(a: str, b: str) -> float | None:
        return round(rate(a) / rate(b), 3) if rate(a) and rate(b) else None

    output = {
        "bench": "train_step_gpu",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        "mfu": {name: arm["mfu"] for name, arm in arms.items() if "mfu" in arm},
        "tokens_per_s": {name: arm["tokens_per_s"] for name, arm in arms.items() if "tokens_per_s" in arm},
        "ratio_packed_compiled_vs_peer_eager": ratio("spanbert-packed-compiled", "peer-sdpa-eager"),
        "ratio_packed_compiled_vs_peer_compiled": ratio("spanbert-packed-compiled", "peer-sdpa-compiled"),
        "ratio_packed_vs_padded_eager": ratio("spanbert-packed-eager", "spanbert-padded-eager"),
        "arms": arms,
        "seq": args.seq,
        "batch": args.batch,
        "tokens_per_step": round(setting["tokens"], 1),
        # of the padded arms (each batch padded to its longest block)
        "padding_share": round(1 - setting["tokens"] / float(np.mean([len(g) * max(g) for g in lengths])), 4),
        "dense_flops_per_step": {kind: f"{flops:.4g}" for kind, flops in setting["flops"].items()},
        "peak_bf16_tflops": round(peak / 1e12, 2),
        "peak_samples_tflops": [round(p / 1e12, 2) for p in peaks],
        "peak_method": f"torch.mm {args.peak_size}x{args.peak_size} bf16, best of 10, before and after the arms",
        "vocab": corpus.vocab_size,
        "model": dataclasses.asdict(args.size) | {"dropout": 0.1},
        "steps": args.steps,
        "warmup": args.warmup,
        "batches": args.batches,
        "seconds": round(time.monotonic() - began, 1),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda},
    }
    print(json.dumps(output), file=stdout)


if __name__ == "__main__":
    main()
