"""Benchmark: spanlm's maskers against transformers' MLM collators, 32 × 512 blocks, in one process.

What is compared (sequences per second; everything from a list of blocks to torch tensors)
    spanlm      for every masker (mlm, wwm, span, ngram, noise): ``collate_blocks(blocks)`` → the masker
                with its paper defaults → ``MaskedBatch.to_torch()``.
    hf_wwm      ``DataCollatorForLanguageModeling(tokenizer, whole_word_mask=True)`` (transformers 5.x:
                whole words from ``offset_mapping``; it masks 100% [MASK], no 80/10/10, and builds a
                B × L × L same-word matrix) on the same blocks as run_mlm-style dicts with
                ``input_ids``, ``attention_mask``, ``special_tokens_mask`` and ``offset_mapping``.
    hf_mlm      ``DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)`` on the same blocks
                as run_mlm-style dicts (``input_ids``, ``attention_mask``, ``special_tokens_mask``).
    hf_mlm_ids  the same collator on bare id lists (its fastest input; it then derives the special
                tokens mask itself).

Same blocks, same word boundaries: the HF whole-word collator finds a new word where a token's start
offset differs from the previous token's end, so each block gets offsets with a one-character gap
before every word start of spanlm's prepared shards — both sides mask exactly the same words.

Corpus: every ``*.txt`` under ``--data`` (default external/english_text of the repository
root), one document per file so that blocks are full 512-token blocks; prepared once into a temporary
directory (``--prepared DIR`` keeps and reuses it) with a new WordPiece tokenizer of vocab 30,522 (at
the default min_frequency the corpus fills about 26,640 of them: the JSON's ``vocab_size``) and
a word2vec similar-word table for MacBERT. The batch is 32 blocks of exactly 512 tokens.

Timing: after one warm-up call each, the contenders alternate ``--repeats`` times, each repetition
timing ``--calls`` consecutive calls of every contender; torch uses one thread. Output: one JSON line
on stdout with sequences/s, each masker's ratio against hf_wwm and hf_mlm, and ``ratio`` = the
smallest masker ratio against hf_wwm (the issue's goal: ≥ 10 on one core).

    taskset -c 0 python bench/masking.py [--data DIR] [--prepared DIR] [--repeats 20] [--calls 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SCHEMES = ("mlm", "wwm", "span", "ngram", "noise")
BATCH, WIDTH = 32, 512


def prepare_corpus(data: Path, out: Path) -> Path:
    """One JSONL record per book (long documents → full blocks), prepared with a 30,522 WordPiece."""
    from spanlm.config import from_dict
    from spanlm.data.prepare import prepare
    from spanlm.pretrain.recipe import Recipe

    files = sorted(p for p in data.rglob("*.txt") if "LICENSE" not in p.name)
    if not files:
        sys.exit(f"no .txt files under {data}")
    out.mkdir(parents=True, exist_ok=True)
    books = out / "books.jsonl"
    if not books.exists():
        with open(books, "w", encoding="utf-8") as handle:
            for path in files:
                handle.write(json.dumps({"text": path.read_text(encoding="utf-8-sig")}) + "\n")
    recipe = from_dict(
        Recipe,
        {
            "data": {"inputs": [str(books)], "prepared_dir": str(out / "prepared"), "similar_words": "word2vec"},
            "tokenizer": {"kind": "wordpiece", "vocab_size": 30522},
        },
    )
    return prepare(recipe, log=lambda message: print(message, file=sys.stderr))


def hf_examples(blocks) -> tuple[list[dict], list[dict], list[list[int]]]:
    """The blocks as the HF collators' inputs: (whole-word dicts, run_mlm dicts, id lists)."""
    wwm, mlm, ids = [], [], []
    for block in blocks:
        input_ids = block.ids.tolist()
        special = [1] + [0] * (len(input_ids) - 2) + [1]
        # One character per token plus a one-character gap before every word start: HF's
        # `token_start != previous_token_end` then finds exactly spanlm's words.
        starts = np.cumsum(1 + block.word_starts.astype(np.int64)) - 1
        offsets = [[int(s), int(s) + 1] for s in starts]
        attention = [1] * len(input_ids)
        mlm.append({"input_ids": input_ids, "attention_mask": attention, "special_tokens_mask": special})
        wwm.append({**mlm[-1], "offset_mapping": offsets})
        ids.append(input_ids)
    return wwm, mlm, ids


def measure(corpus, args) -> dict:
    import torch
    import transformers
    from transformers import DataCollatorForLanguageModeling

    from spanlm.data.blocks import BlockDataset, collate_blocks
    from spanlm.masking.base import MaskingConfig, build_masker

    dataset = BlockDataset(corpus, WIDTH)
    full = np.flatnonzero(np.diff(dataset.index, axis=1).ravel() == WIDTH - 2)
    chosen = np.random.default_rng(0).permutation(full)[:BATCH]
    blocks = [dataset[int(i)] for i in chosen]
    tokenizer = corpus.tokenizer
    pad = corpus.special_ids["pad"]
    maskers = {scheme: build_masker(MaskingConfig(scheme=scheme), corpus) for scheme in SCHEMES}

    hf_wwm_input, hf_mlm_input, hf_ids_input = hf_examples(blocks)
    hf_wwm = DataCollatorForLanguageModeling(tokenizer, whole_word_mask=True)
    hf_mlm = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    rng = np.random.default_rng(0)

    def ours(masker):
        return lambda: masker(collate_blocks(blocks, pad), rng).to_torch()

    contenders = {
        "hf_wwm": lambda: hf_wwm(hf_wwm_input),
        "hf_mlm": lambda: hf_mlm(hf_mlm_input),
        "hf_mlm_ids": lambda: hf_mlm(hf_ids_input),
        **{scheme: ours(masker) for scheme, masker in maskers.items()},
    }
    # Same words on both sides: where HF's whole-word ids change is exactly where spanlm's words start.
    special = np.array([e["special_tokens_mask"] for e in hf_wwm_input], dtype=bool)  # (B, L)
    word_ids, _ = DataCollatorForLanguageModeling._calc_word_ids_and_prob_mask(
        np.array([e["offset_mapping"] for e in hf_wwm_input]), special.astype(np.int64)
    )
    hf_starts = (word_ids >= 0) & np.concatenate(
        [np.ones((len(blocks), 1), bool), word_ids[:, 1:] != word_ids[:, :-1]], axis=1
    )
    spanlm_starts = np.stack([np.asarray(b.word_starts, dtype=bool) for b in blocks]) & ~special
    assert np.array_equal(hf_starts, spanlm_starts), int((hf_starts != spanlm_starts).sum())

    elapsed = dict.fromkeys(contenders, 0.0)
    for run in contenders.values():
        run()  # warm-up
    for repeat in range(args.repeats):
        names = list(contenders)
        names = names[repeat % len(names) :] + names[: repeat % len(names)]  # rotate who goes first
        for name in names:
            start = time.perf_counter()
            for _ in range(args.calls):
                contenders[name]()
            elapsed[name] += time.perf_counter() - start
        print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr)

    calls = args.repeats * args.calls
    rate = {name: round(BATCH * calls / seconds, 1) for name, seconds in elapsed.items()}
    ratio_wwm = {scheme: round(rate[scheme] / rate["hf_wwm"], 2) for scheme in SCHEMES}
    ratio_mlm = {scheme: round(rate[scheme] / rate["hf_mlm"], 2) for scheme in SCHEMES}
    return {
        "benchmark": "masking",
        "batch": [BATCH, WIDTH],
        "vocab_size": corpus.vocab_size,
        "words_per_batch": int(spanlm_starts.sum()),
        "seq_per_s": rate,
        "ratio_vs_hf_wwm": ratio_wwm,
        "ratio_vs_hf_mlm": ratio_mlm,
        "ratio": min(ratio_wwm.values()),
        "repeats": args.repeats,
        "calls_per_repeat": args.calls,
        "cpus": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(REPO / "external" / "english_text"))
    parser.add_argument("--prepared", default=None, help="keep the prepared corpus here (reused when up to date)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10, help="consecutive calls timed per contender and repetition")
    args = parser.parse_args()

    import torch

    from spanlm.data.shards import PreparedCorpus

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # HF warns that whole-word masking sets mask_replace_prob to 1
    with tempfile.TemporaryDirectory() as scratch:
        corpus = PreparedCorpus(prepare_corpus(Path(args.data), Path(args.prepared or scratch)))
        print(json.dumps(measure(corpus, args)))


if __name__ == "__main__":
    main()
