"""Start-up memory and time of the pretraining sampler as the corpus grows, and a batch's indices vs masking it.

Prints one JSON line. For each corpus size (in blocks; lengths are computed, not stored): the traced peak
(``tracemalloc``) and seconds to hold out ``eval_blocks``, build rank 1 of 4's sampler and draw its first
batch, with fixed batches and with a token budget; the same for the earlier scheme (two NumPy
permutations of 8 bytes per block) as the peer; then the seconds per batch of drawing the next keys
(rank 1 of 4: a token budget cuts four ranks' batches a step) vs masking a batch of as many blocks with
the ``mlm`` masker, and vs collating, masking and converting it as a DataLoader worker does.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np

from spanlm.data.blocks import Block, collate_blocks
from spanlm.masking.base import MlmConfig, Vocabulary
from spanlm.objectives.mlm.masker import MlmMasker
from spanlm.pretrain.batches import split_blocks
from spanlm.train.loader import BatchKeySampler


class ComputedLengths:
    """Block lengths of a corpus of any size, computed from the block number instead of stored."""

    def __getitem__(self, indices) -> np.ndarray:
        return 3 + (np.asarray(indices) * 7919) % 126

    def max(self) -> int:
        return 128


def traced(build) -> dict:
    tracemalloc.start()
    began = time.perf_counter()
    build()
    seconds = time.perf_counter() - began
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"peak_kb": round(peak / 1024, 1), "seconds": round(seconds, 4)}


def sampler(n_blocks: int, batch_size: int, tokens: int) -> BatchKeySampler:
    train, _ = split_blocks(n_blocks, 64, seed=0)
    return BatchKeySampler(
        train, batch_size, seed=0, rank=1, world_size=4, lengths=ComputedLengths(), tokens_per_batch=tokens
    )


def permutations(n_blocks: int) -> None:
    """The earlier start-up: a held-out permutation, the sorted training blocks, the first epoch's permutation."""
    order = np.random.default_rng([0, 7919]).permutation(n_blocks)
    train = np.sort(order[64:])
    train[np.random.default_rng([0, 0]).permutation(len(train))[1::4]]


def per_batch(draw, repeats: int) -> float:
    began = time.perf_counter()
    for _ in range(repeats):
        draw()
    return (time.perf_counter() - began) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**6, 10**7, 10**8])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=128)
    args = parser.parse_args()
    tokens = args.batch_size * args.max_len
    traced(lambda: next(iter(sampler(10**5, args.batch_size, tokens))))  # first calls' one-off allocations
    report = {"bench": "sampler_scale", "batch_size": args.batch_size, "tokens_per_batch": tokens, "start_up": {}}
    for n in args.sizes:
        report["start_up"][n] = {
            "fixed": traced(lambda n=n: next(iter(sampler(n, args.batch_size, 0)))),
            "tokens": traced(lambda n=n: next(iter(sampler(n, args.batch_size, tokens)))),
            "numpy_permutations": traced(lambda n=n: permutations(n)),
        }
    keys = {
        mode: iter(sampler(args.sizes[-1], args.batch_size, budget))
        for mode, budget in (("fixed", 0), ("tokens", tokens))
    }
    rng = np.random.default_rng(0)
    blocks = [
        Block(ids=rng.integers(5, 30000, args.max_len), word_starts=np.ones(args.max_len, dtype=bool))
        for _ in range(args.batch_size)
    ]
    batch = collate_blocks(blocks, pad_id=0)
    masker = MlmMasker(MlmConfig(), Vocabulary(size=30000, mask_id=4, special_ids=(0, 1, 2, 3, 4)))
    mask_s = per_batch(lambda: masker(batch, rng), 200)
    report["per_batch_s"] = {
        "mlm_masking": round(mask_s, 6),  # the cheapest masker; a worker also collates and converts
        "collate_mask_to_torch": round(per_batch(lambda: masker(collate_blocks(blocks, 0), rng).to_torch(), 200), 6),
    }
    for mode, iterator in keys.items():
        seconds = per_batch(lambda iterator=iterator: next(iterator), 200)
        report["per_batch_s"][f"keys_{mode}"] = round(seconds, 6)
        report["per_batch_s"][f"keys_{mode}_vs_masking"] = round(seconds / mask_s, 3)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
