"""Benchmark: `spanlm prepare` against transformers' run_mlm.py data pipeline, in one process.

What is compared
    spanlm      ``spanlm.data.prepare.prepare(recipe, force=True)`` on configs/prepare/english.yaml with
                ``data.inputs`` = the corpus and ``tokenizer.path`` = an already trained tokenizer (so
                tokenizer training is not timed), into a fresh output directory every repetition.
    peer        the data path of transformers/examples/pytorch/language-modeling/run_mlm.py (the default,
                not --line_by_line): ``load_dataset("text", data_files=...)``, ``AutoTokenizer.from_pretrained``,
                ``map(tokenize_function, batched=True)`` with ``return_special_tokens_mask=True``, then
                ``map(group_texts, batched=True)`` into blocks of ``--block-size`` tokens, with a fresh
                ``cache_dir`` every repetition (so nothing is reused from an earlier one).

Both sides load the SAME tokenizer directory: the WordPiece tokenizer (english.yaml settings) that an
untimed first `spanlm prepare` trains on the corpus; that run also warms up imports for spanlm, and
one untimed peer run does the same for the peer. Then the two alternate (peer, spanlm, peer, ...)
``--repeats`` times each and the median wall time of each side is taken.

Tokens: both rates use the corpus's *content* tokens (no [CLS]/[SEP]): spanlm's ``n_tokens`` from its
meta.json, and for the peer the tokens of its tokenized output whose ``special_tokens_mask`` is 0. The
two counts agree (``same_ids`` reports whether the id sequences are identical); the peer's grouped
output also holds one [CLS] and one [SEP] per input line (blank lines included) and drops each
1000-line batch's remainder, so it is reported separately as ``peer_grouped_tokens``. ``tokens``
varies slightly between invocations because WordPiece training in `tokenizers` is not
deterministic (huggingface/tokenizers#1794); within one invocation both sides share one tokenizer.

Corpus: every ``*.txt`` under ``--data`` (default external/english_text of the repository
root: six Gutenberg books and tinyshakespeare), except LICENSE files, in sorted order for both sides.

Output: progress bars are disabled for both sides and anything printed while the pipelines run goes
to stderr, so stdout carries exactly one JSON line; ``ratio`` = spanlm tokens/s ÷ peer tokens/s.

    python bench/prepare.py [--data DIR] [--repeats 3] [--num-proc 1] [--block-size 512]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from itertools import chain
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "prepare" / "english.yaml"

# What each side writes that the other does not (for reading the ratio).
SPANLM_STORES = [
    "word_starts.npy (whole-word boundaries per token)",
    "sentence_offsets.npy",
    "document_offsets.npy",
    "token_counts.npy (unigram frequencies)",
    "tokenizer copy + config.yaml + meta.json (fingerprints for reuse)",
    "fsync + atomic rename of the output directory",
]
PEER_STORES = [
    "token_type_ids, attention_mask, special_tokens_mask columns",
    "[CLS]/[SEP] per line (blank lines included)",
    "three Arrow caches: raw text, tokenized, grouped",
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data",
        default=str(REPO / "external" / "english_text"),
        help="directory searched recursively for *.txt (default: external/english_text, see data/README.md)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side (alternating)")
    parser.add_argument(
        "--num-proc", type=int, default=1, help="data.num_proc for spanlm, num_proc for the peer's maps"
    )
    parser.add_argument("--block-size", type=int, default=512, help="run_mlm's max_seq_length for group_texts")
    return parser.parse_args()


def corpus_files(data_dir: str) -> list[str]:
    root = Path(data_dir)
    if not root.is_absolute():
        root = REPO / root
    files = sorted(str(p) for p in root.rglob("*.txt") if not p.name.upper().startswith("LICENSE"))
    if not files:
        sys.exit(f"bench/prepare.py: no .txt files under {root}")
    return files


# ---------------------------------------------------------------- spanlm side


def spanlm_recipe(files: list[str], prepared_dir: Path, tokenizer_path: Path | None, num_proc: int):
    """english.yaml with the corpus, output directory, tokenizer and num_proc overridden (as on the CLI)."""
    from spanlm.pretrain.recipe import load_recipe

    overrides = [
        f"data.inputs={json.dumps(files)}",  # JSON is YAML: quotes every path
        f"data.prepared_dir={json.dumps(str(prepared_dir))}",
        f"data.num_proc={num_proc}",
        f"tokenizer.path={json.dumps(str(tokenizer_path)) if tokenizer_path else 'null'}",
    ]
    return load_recipe(RECIPE, overrides)


def run_spanlm(recipe) -> Path:
    from spanlm.data.prepare import prepare

    return prepare(recipe, force=True, log=lambda message: print(message, file=sys.stderr))


def spanlm_tokens(prepared: Path) -> int:
    from spanlm.data.shards import read_meta

    return int(read_meta(prepared)["n_tokens"])


# ---------------------------------------------------------------- peer side (run_mlm.py)


def run_peer(files: list[str], tokenizer_dir: Path, cache_dir: Path, block_size: int, num_proc: int):
    """run_mlm.py's data path, statement for statement (no validation split: spanlm makes none either).

    Returns the tokenized and the grouped train datasets.
    """
    from datasets import load_dataset
    from transformers import AutoTokenizer

    raw_datasets = load_dataset("text", data_files={"train": files}, cache_dir=str(cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    column_names = raw_datasets["train"].column_names
    text_column_name = "text" if "text" in column_names else column_names[0]
    max_seq_length = min(block_size, tokenizer.model_max_length)

    def tokenize_function(examples):
        return tokenizer(examples[text_column_name], return_special_tokens_mask=True)

    tokenized_datasets = raw_datasets.map(
        tokenize_function,
        batched=True,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=column_names,
        load_from_cache_file=True,
        desc="Running tokenizer on every text in dataset",
    )

    def group_texts(examples):
        # Concatenate all texts.
        concatenated_examples = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated_examples[list(examples.keys())[0]])
        # Drop the small remainder (run_mlm keeps a batch shorter than one block as it is).
        if total_length >= max_seq_length:
            total_length = (total_length // max_seq_length) * max_seq_length
        # Split by chunks of max_len.
        result = {
            k: [t[i : i + max_seq_length] for i in range(0, total_length, max_seq_length)]
            for k, t in concatenated_examples.items()
        }
        return result

    grouped_datasets = tokenized_datasets.map(
        group_texts,
        batched=True,
        num_proc=num_proc if num_proc > 1 else None,
        load_from_cache_file=True,
        desc=f"Grouping texts in chunks of {max_seq_length}",
    )
    return tokenized_datasets["train"], grouped_datasets["train"]


def peer_counts(tokenized, grouped) -> tuple[int, int, int]:
    """(content tokens of the tokenized output, tokens of the grouped output, number of blocks)."""
    import pyarrow.compute as pc

    table = tokenized.with_format("arrow")[:]
    all_tokens = pc.sum(pc.list_value_length(table.column("input_ids"))).as_py()
    special = pc.sum(pc.list_flatten(table.column("special_tokens_mask"))).as_py()
    grouped_table = grouped.with_format("arrow")[:]
    grouped_tokens = pc.sum(pc.list_value_length(grouped_table.column("input_ids"))).as_py()
    return all_tokens - special, grouped_tokens, grouped_table.num_rows


def same_ids(tokenized, prepared: Path) -> bool:
    """Do the peer's non-special ids equal spanlm's ids.npy, token for token?"""
    import numpy as np
    import pyarrow.compute as pc

    table = tokenized.with_format("arrow")[:]
    ids = pc.list_flatten(table.column("input_ids")).to_numpy()
    special = pc.list_flatten(table.column("special_tokens_mask")).to_numpy().astype(bool)
    ours = np.load(prepared / "ids.npy", mmap_mode="r")
    content = ids[~special]
    return len(content) == len(ours) and bool(np.array_equal(content, ours))


# ---------------------------------------------------------------- harness


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(function, *args):
    gc.collect()
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def main() -> None:
    args = parse_args()
    files = corpus_files(args.data)
    # The same environment for both sides: offline, no progress bars, and spanlm's own choice of
    # tokenizer threading (threads when one process, none when several would fork).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true" if args.num_proc == 1 else "false")
    import datasets
    import tokenizers
    import transformers

    datasets.disable_progress_bars()
    stdout = sys.stdout
    work = Path(tempfile.mkdtemp(prefix="spanlm-bench-prepare-"))
    try:
        with contextlib.redirect_stdout(sys.stderr):
            # Untimed: train the shared tokenizer (and warm up spanlm), then warm up the peer once.
            setup = run_spanlm(spanlm_recipe(files, work / "setup", None, args.num_proc))
            tokenizer_dir = setup / "tokenizer"
            run_peer(files, tokenizer_dir, work / "peer-warmup", args.block_size, args.num_proc)
            shutil.rmtree(work / "peer-warmup")

            peer_s, spanlm_s = [], []
            for rep in range(args.repeats):
                cache_dir = work / f"peer-{rep}"
                seconds, (tokenized, grouped) = timed(
                    run_peer, files, tokenizer_dir, cache_dir, args.block_size, args.num_proc
                )
                peer_s.append(seconds)
                recipe = spanlm_recipe(files, work / f"spanlm-{rep}", tokenizer_dir, args.num_proc)
                seconds, prepared = timed(run_spanlm, recipe)
                spanlm_s.append(seconds)
                print(f"rep {rep}: peer {peer_s[-1]:.2f}s  spanlm {spanlm_s[-1]:.2f}s", file=sys.stderr)
                if rep == 0:  # counts and sizes are the same every repetition
                    tokens = spanlm_tokens(prepared)
                    peer_tokens, peer_grouped_tokens, peer_blocks = peer_counts(tokenized, grouped)
                    identical = same_ids(tokenized, prepared)
                    spanlm_bytes, peer_bytes = directory_bytes(prepared), directory_bytes(cache_dir)
                del tokenized, grouped
                shutil.rmtree(cache_dir)
                shutil.rmtree(prepared)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    spanlm_tps = tokens / statistics.median(spanlm_s)
    peer_tps = peer_tokens / statistics.median(peer_s)
    result = {
        "bench": "prepare",
        "ratio": round(spanlm_tps / peer_tps, 3),
        "spanlm_tokens_per_s": round(spanlm_tps),
        "peer_tokens_per_s": round(peer_tps),
        "tokens": tokens,
        "peer_tokens": peer_tokens,
        "token_basis": (
            "content tokens (no [CLS]/[SEP]): spanlm meta.json n_tokens; "
            "peer tokenized output minus special_tokens_mask"
        ),
        "same_ids": identical,
        "peer_grouped_tokens": peer_grouped_tokens,
        "peer_blocks": peer_blocks,
        "block_size": args.block_size,
        "spanlm_s": [round(s, 3) for s in spanlm_s],
        "peer_s": [round(s, 3) for s in peer_s],
        "repeats": args.repeats,
        "num_proc": args.num_proc,
        "cpus": len(os.sched_getaffinity(0)),
        "files": len(files),
        "spanlm_output_bytes": spanlm_bytes,
        "peer_cache_bytes": peer_bytes,
        "stores": SPANLM_STORES,
        "peer_stores": PEER_STORES,
        "versions": {
            "datasets": datasets.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }
    print(json.dumps(result), file=stdout)


if __name__ == "__main__":
    main()
