"""Benchmark: GlobalPointer / Efficient GlobalPointer heads + ZLPR loss against bert4torch's.

What is compared (forward + backward of head and loss, the same parameters and inputs)
    spanlm      ``spanlm.heads.GlobalPointer`` (kind standard / efficient) + ``global_pointer_loss`` with
                the default ``ZlprConfig`` (auto: the sparse loss above 128 tokens, so sparse at both shapes),
                gold spans as (B, N, 3) rows.
    bert4torch  ``bert4torch.layers.GlobalPointer`` / ``EfficientGlobalPointer`` +
                ``bert4torch.losses.MultilabelCategoricalCrossentropy`` on the (B·T, L·L) view with dense
                0/1 labels — the pairing of bert4torch's own GlobalPointer NER example.

Workload: hidden 256, 10 types, head size 64, RoPE; batch 16 × 256 and 4 × 512; each row's length uniform
in [L/2, L] (the rest padding, masked by both heads), L/32 gold spans per row of 1-8 tokens and random
types. bert4torch's dense labels are built before anything is measured (as a collator would).

Before timing, both sides are checked to give the same loss and the same gradients w.r.t. the hidden
states and every head parameter: spanlm's weights are copied from bert4torch's with the layout mapped
(bert4torch's EGP splits q|k in halves and orders the type bias (start, end); Su's original, followed by
spanlm, interleaves q/k and orders it (end, start)). Then the variants run alternately (rotating the
order each repetition) ``--repeats`` times after one warm-up, and medians are compared in one process.

Peak memory (CPU). ``tracemalloc`` does not see torch's allocations, so each (side, head, shape) runs in
a fresh subprocess with ``MALLOC_MMAP_THRESHOLD_=65536``: every tensor buffer above 64 KiB then gets its
own mmap and is unmapped when freed (the fixed threshold also stops glibc from raising it after frees),
so the process's resident size follows the live tensors. After one warm-up step the subprocess resets
the kernel's high-water mark (``/proc/self/clear_refs`` ← 5), reads VmRSS, runs one forward + backward
and reads VmHWM: peak = VmHWM − VmRSS, the extra memory the step needed on top of inputs, weights and
(for bert4torch) its prebuilt dense labels, which are therefore not charged to it.

Output: one JSON line; ``ratio`` = the smallest bert4torch ÷ spanlm median time over the four
(head, shape) cells (speed-up, ≥ 1 = spanlm no slower), ``memory_ratio`` = the largest spanlm ÷ bert4torch
peak memory at 4 × 512 over GP and EGP. Without bert4torch only spanlm's numbers are printed and both
ratios are null (a message on stderr says why).

    python bench/global_pointer.py [--repeats 5] [--seed 0]
    # bert4torch lives in a separate benchmark venv (torch pinned by constraints.txt):
    python3 -m venv /tmp/benchvenv && /tmp/benchvenv/bin/pip install -c constraints.txt -e . bert4torch
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import types

import torch

from spanlm.heads.global_pointer import GlobalPointer, GlobalPointerConfig
from spanlm.heads.zlpr import ZlprConfig, global_pointer_loss, span_labels

HIDDEN, TYPES, HEAD_SIZE = 256, 10, 64
SHAPES = ((16, 256), (4, 512))
KINDS = ("standard", "efficient")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each variant (alternating)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--memory", nargs=4, metavar=("SIDE", "KIND", "BATCH", "LENGTH"), help=argparse.SUPPRESS
    )  # internal: one peak-memory measurement in this process
    return parser.parse_args()


def import_bert4torch():
    """bert4torch's GlobalPointer layers and losses, or the reason they cannot be imported.

    ``import bert4torch`` pulls in every model of the package (torchvision, PIL, httpx ...); only two
    modules are needed, so the package and its ``layers`` subpackage are registered as bare namespaces
    and the two modules (and what they import) load on their own.
    """
    try:
        spec = importlib.util.find_spec("bert4torch")
        if spec is None or not spec.submodule_search_locations:
            return None, "bert4torch is not installed in this environment"
        root = spec.submodule_search_locations[0]
        for name, path in (("bert4torch", root), ("bert4torch.layers", os.path.join(root, "layers"))):
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = [path]
                sys.modules[name] = package
        from bert4torch.layers.global_point import EfficientGlobalPointer
        from bert4torch.layers.global_point import GlobalPointer as B4TGlobalPointer
        from bert4torch.losses import MultilabelCategoricalCrossentropy
    except Exception as error:  # any import failure means: no peer, say why
        return None, f"bert4torch not importable: {type(error).__name__}: {error}"
    return (B4TGlobalPointer, EfficientGlobalPointer, MultilabelCategoricalCrossentropy), None


# ---------------------------------------------------------------- workload


def make_workload(batch: int, length: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, length, HIDDEN, generator=generator)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=generator)
    mask = torch.arange(length) < lengths[:, None]  # (B, L) padding mask
    n = length // 32
    kinds = torch.randint(0, TYPES, (batch, n), generator=generator)
    spans = torch.randint(1, 9, (batch, n), generator=generator)
    starts = (torch.rand(batch, n, generator=generator) * (lengths[:, None] - spans + 1)).long()
    entity_spans = torch.stack([kinds, starts, starts + spans - 1], dim=-1)  # (B, N, 3)
    return hidden, mask, entity_spans


def build(side: str, kind: str, peer, seed: int):
    """(module, loss function) of one side, with weights from the same seeded bert4torch-layout init."""
    torch.manual_seed(seed)
    if side == "bert4torch":
        gp_class, egp_class, mcce = peer
        module = (gp_class if kind == "standard" else egp_class)(HIDDEN, TYPES, HEAD_SIZE, RoPE=True)
        criterion = mcce()

        def run(hidden, mask, entity_spans, labels):
            logits = module(hidden, mask.long())  # (B, T, L, L)
            return criterion(logits.reshape(-1, logits.shape[-2] * logits.shape[-1]), labels)

        return module, run
    module = GlobalPointer(HIDDEN, TYPES, GlobalPointerConfig(kind=kind, head_size=HEAD_SIZE, rope=True))
    config = ZlprConfig()

    def run(hidden, mask, entity_spans, labels):
        return global_pointer_loss(module(hidden, mask), entity_spans, config)

    return module, run


def to_spanlm_layout(tensors: list, kind: str) -> list:
    """bert4torch's parameters (or their gradients), in its ``parameters()`` order, rearranged into
    spanlm's ``parameters()`` order and column layout — the same function, different layouts."""
    if kind == "standard":  # both: dense (D → T·2d), per type [q_α; k_α]
        return list(tensors)
    p_weight, p_bias, q_weight, q_bias = tensors
    # p: spanlm interleaves (q_0, k_0, q_1, k_1, ...); bert4torch stores [q_0..q_{d-1}, k_0..k_{d-1}]
    halves = torch.arange(HEAD_SIZE)
    order = torch.stack([halves, halves + HEAD_SIZE], dim=-1).flatten()  # spanlm row c ← bert4torch row order[c]
    # type bias rows: spanlm (end_α, start_α), bert4torch (start_α, end_α); its input p permuted as above
    swap = torch.arange(2 * TYPES).view(TYPES, 2).flip(-1).flatten()
    return [p_weight[order], p_bias[order], q_weight[swap][:, order], q_bias[swap]]


def forward_backward(run, module, hidden, inputs):
    hidden.grad = None
    for parameter in module.parameters():
        parameter.grad = None
    loss = run(hidden, *inputs)
    loss.backward()
    return loss.detach(), [hidden.grad] + [p.grad for p in module.parameters()]


def measure_memory(side: str, kind: str, batch: int, length: int, seed: int) -> int:
    """Bytes the step needs above its inputs (see the module docstring); run in a fresh subprocess."""
    peer = import_bert4torch()[0] if side == "bert4torch" else None
    hidden, mask, entity_spans = make_workload(batch, length, seed)
    hidden.requires_grad_(True)
    labels = (
        span_labels(entity_spans, (batch, TYPES, length, length)).float().view(batch * TYPES, -1)
        if side == "bert4torch"
        else None
    )
    module, run = build(side, kind, peer, seed)
    forward_backward(run, module, hidden, (mask, entity_spans, labels))  # warm-up: lazy inits, caches

    def status(field: str) -> int:
        with open("/proc/self/status") as handle:
            line = next(line for line in handle if line.startswith(field + ":"))
        return int(line.split()[1]) * 1024  # kB

    for parameter in [hidden, *module.parameters()]:
        parameter.grad = None
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset VmHWM to the current resident size
    base = status("VmRSS")
    forward_backward(run, module, hidden, (mask, entity_spans, labels))
    return status("VmHWM") - base


def memory_in_subprocess(side: str, kind: str, batch: int, length: int, seed: int) -> int:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, __file__, "--seed", str(seed), "--memory", side, kind, str(batch), str(length)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(out.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.memory:
        side, kind, batch, length = args.memory
        print(measure_memory(side, kind, int(batch), int(length), args.seed))
        return
    peer, reason = import_bert4torch()
    sides = ("spanlm", "bert4torch") if peer else ("spanlm",)
    if reason:
        print(f"global_pointer bench: peer skipped — {reason}", file=sys.stderr)

    variants = {}
    for batch, length in SHAPES:
        hidden, mask, entity_spans = make_workload(batch, length, args.seed)
        hidden.requires_grad_(True)
        labels = span_labels(entity_spans, (batch, TYPES, length, length)).float().view(batch * TYPES, -1)
        for kind in KINDS:
            modules = {side: build(side, kind, peer, args.seed) for side in sides}
            if peer:
                with torch.no_grad():
                    peer_weights = to_spanlm_layout(list(modules["bert4torch"][0].parameters()), kind)
                    for parameter, weight in zip(modules["spanlm"][0].parameters(), peer_weights, strict=True):
                        parameter.copy_(weight)
                # same loss, same gradients for the hidden states and every head parameter
                (loss, grads), (peer_loss, peer_grads) = (
                    forward_backward(run, module, hidden, (mask, entity_spans, labels))
                    for module, run in modules.values()
                )
                torch.testing.assert_close(loss, peer_loss, rtol=1e-4, atol=1e-5)
                for grad, peer_grad in zip(grads, peer_grads[:1] + to_spanlm_layout(peer_grads[1:], kind), strict=True):
                    torch.testing.assert_close(grad, peer_grad, rtol=1e-3, atol=1e-6)
            for side, (module, run) in modules.items():
                variants[(side, kind, batch, length)] = (run, module, hidden, (mask, entity_spans, labels))

    times: dict[tuple, list[float]] = {key: [] for key in variants}
    order = list(variants)
    for rep in range(args.repeats + 1):  # repetition 0 is the warm-up
        shift = rep % len(order)
        for key in order[shift:] + order[:shift]:
            run, module, hidden, inputs = variants[key]
            start = time.perf_counter()
            forward_backward(run, module, hidden, inputs)
            if rep:
                times[key].append(time.perf_counter() - start)
    median = {key: statistics.median(values) for key, values in times.items()}
    memory = {key: memory_in_subprocess(key[0], key[1], key[2], key[3], args.seed) for key in variants}

    def name(key):
        side, kind, batch, length = key
        return f"{side}_{'gp' if kind == 'standard' else 'egp'}_{batch}x{length}"

    result = {"bench": "global_pointer", "ratio": None, "memory_ratio": None}
    if peer:
        cells = [(kind, batch, length) for kind in KINDS for batch, length in SHAPES]
        result["ratio"] = round(min(median[("bert4torch", *c)] / median[("spanlm", *c)] for c in cells), 3)
        result["memory_ratio"] = round(
            max(memory[("spanlm", kind, *SHAPES[1])] / memory[("bert4torch", kind, *SHAPES[1])] for kind in KINDS), 3
        )
        result["speed_ratios"] = {
            name(("x", *c))[2:]: round(median[("bert4torch", *c)] / median[("spanlm", *c)], 3) for c in cells
        }
        result["memory_ratios"] = {
            name(("x", *c))[2:]: round(memory[("spanlm", *c)] / memory[("bert4torch", *c)], 3) for c in cells
        }
        result["identical"] = True
    else:
        result["skipped"] = reason
    result["ms"] = {name(key): round(1000 * value, 1) for key, value in median.items()}
    result["peak_mib"] = {name(key): round(value / 2**20, 1) for key, value in memory.items()}
    result.update(
        {
            "hidden": HIDDEN,
            "types": TYPES,
            "head_size": HEAD_SIZE,
            "shapes": [list(s) for s in SHAPES],
            "loss": "spanlm: ZLPR sparse (auto, L > 128); bert4torch: MultilabelCategoricalCrossentropy (dense)",
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "cpus": len(os.sched_getaffinity(0)),
            "torch": torch.__version__,
        }
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
