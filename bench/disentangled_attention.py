"""Benchmark: a DeBERTa-V3 encoder's forward and backward with spanlm's disentangled attention
(spanlm.accel.disentangled) against the same model with transformers' own ``DisentangledSelfAttention``.

Two copies of one ``DebertaV2Model`` (DeBERTa-V3's layout: 256 log buckets, both relative terms, shared
keys), one with its attention modules made ``FusedDisentangledSelfAttention``; each step a forward over full rows
and a backward of the states' sum, alternating A B B A … ; ``ratio`` = transformers' median step time ÷
spanlm's (above 1: spanlm faster). With ``--dropout 0`` on CUDA spanlm's path is FlexAttention, else SDPA with the
relative bias. One JSON line per ``--seq``.

    python bench/disentangled_attention.py [--device cpu] [--seq 128 512] [--batch 16] [--hidden 128] [--heads 2]
                                           [--layers 2] [--dropout 0.1] [--steps 10] [--bf16]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from transformers import DebertaV2Config, DebertaV2Model

from spanlm.accel.disentangled import use_fused_disentangled_attention


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=16, help="rows at the first --seq; the same tokens at the others")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1, help="attention dropout (DeBERTa-V3's is 0.1)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    return parser.parse_args(argv)


def measure(args, seq: int, batch: int) -> dict:
    device = torch.device(args.device)
    config = DebertaV2Config(
        vocab_size=8000,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=max(512, seq),
        attention_probs_dropout_prob=args.dropout,
        relative_attention=True,
        position_buckets=256,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
    )
    torch.manual_seed(0)
    theirs = DebertaV2Model(config).to(device).train()
    ours = copy.deepcopy(theirs)
    use_fused_disentangled_attention(ours)
    ids = torch.randint(5, 8000, (batch, seq), device=device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)

    def step(model) -> float:
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        hidden.float().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    times = {"transformers": [], "spanlm": []}
    for _ in range(2):  # warm-up (FlexAttention compiles here on CUDA)
        step(theirs), step(ours)
    for i in range(args.steps):
        order = [("transformers", theirs), ("spanlm", ours)]
        for name, model in order if i % 2 == 0 else order[::-1]:
            times[name].append(step(model))
    medians = {name: statistics.median(values) for name, values in times.items()}
    path = "flex" if device.type == "cuda" and args.dropout == 0 else "sdpa"
    return {
        "bench": "disentangled_attention",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "seq": seq,
        "batch": batch,
        "hidden": args.hidden,
        "heads": args.heads,
        "layers": args.layers,
        "dropout": args.dropout,
        "bf16": args.bf16,
        "spanlm_path": path,
        "median_step_s": {name: round(value, 5) for name, value in medians.items()},
        "ratio": round(medians["transformers"] / medians["spanlm"], 3),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tokens = args.batch * args.seq[0]
    for seq in args.seq:
        print(json.dumps(measure(args, seq, max(1, tokens // seq))), flush=True)


if __name__ == "__main__":
    main()
