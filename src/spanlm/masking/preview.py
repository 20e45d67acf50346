"""`spanlm preview`: a few masked blocks decoded in the terminal, then masking statistics as JSON.

The blocks come from the recipe's prepared corpus (prepared first when needed), in the seeded block
order, and are masked with ``np.random.default_rng(recipe.seed)`` — so a preview shows exactly the
kind of batch pretraining with that recipe produces. Under a masking-rate schedule the budget is the one a
training batch of optimiser step ``step`` has (numbered from 1, as metrics.jsonl numbers them; 1 unless given): the
schedule's rate after the steps before it (``step - 1``, the run's steps also in a phase).
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np

from spanlm.data.blocks import BlockDataset, BlockSampler, collate_blocks
from spanlm.data.prepare import prepare
from spanlm.data.shards import PreparedCorpus, ShardedCorpus, resolve_shards
from spanlm.errors import ConfigError, InputError
from spanlm.masking.base import KIND_NAMES, MASK, RANDOM, SIMILAR, MaskedBatch, build_masker, with_rate

# What every target shows; a masker that marks more (its ``mark``) explains it in its ``legend``.
LEGEND = (
    "legend: [M:x] x masked · [R:y<x] x replaced by random y · [K:x] x kept as target · "
    "[S:y<x] x replaced by similar word y"
)


def render_block(
    tokens: list[str], masked: MaskedBatch, row: int, originals: list[str], terms: list[str] | None = None, mark=None
) -> str:
    """Row ``row`` of ``masked`` as its tokens, with every target marked, then what the masker's ``mark`` adds
    (CharBERT's noised words).

    ``tokens`` are the row's (corrupted) tokens, ``originals[i]`` the original token of target i.
    """
    width = masked.input_ids.shape[1]
    length = int(masked.attention_mask[row].sum())
    shown = list(tokens[:length])
    low = row * width
    for i in np.flatnonzero((masked.target_index >= low) & (masked.target_index < low + length)).tolist():
        column, kind, original = int(masked.target_index[i] - low), masked.target_kind[i], originals[i]
        current = shown[column]
        shown[column] = (
            f"[M:{original}]"
            if kind == MASK
            else f"[R:{current}<{original}]"
            if kind == RANDOM
            else f"[S:{current}<{original}]"
            if kind == SIMILAR
            else f"[K:{original}]"
        )
    if mark is not None:
        mark(shown, masked, row, low, length, terms)
    return " ".join(shown)


def statistics(pairs: list[tuple[object, MaskedBatch]], scheme: str, masker=None) -> dict:
    """Masking statistics over (block batch, masked batch) pairs, and the masker's own (its ``statistics``)."""
    blocks = sum(m.batch_size for _, m in pairs)
    # Content tokens of the masked layout ([CLS] and [SEP] excluded; noise can change lengths).
    content = sum(int(m.attention_mask.sum()) - 2 * int(m.attention_mask.any(axis=1).sum()) for _, m in pairs)
    targets = sum(len(m.target_index) for _, m in pairs)
    kinds = np.bincount(np.concatenate([m.target_kind for _, m in pairs]).astype(np.int64), minlength=len(KIND_NAMES))
    span_words = np.concatenate([m.span_words for _, m in pairs])
    span_tokens = np.concatenate([m.span_end - m.span_start for _, m in pairs])
    counters: Counter[str] = Counter()
    runs = 0
    for _, m in pairs:
        counters.update(m.counters)
        runs += int((np.diff(m.target_index) != 1).sum() + 1) if len(m.target_index) else 0
    stats = {
        "scheme": scheme,
        "blocks": blocks,
        "content_tokens": content,
        "targets": targets,
        "mask_ratio": round(targets / max(content, 1), 5),
        "replacement": {name: round(int(k) / max(targets, 1), 4) for name, k in zip(KIND_NAMES, kinds)},
        "target_runs_per_block": round(runs / max(blocks, 1), 3),
    }
    if len(span_words):
        stats["mean_span_words"] = round(float(span_words.mean()), 4)
        stats["mean_span_tokens"] = round(float(span_tokens.mean()), 4)
        histogram = np.bincount(span_words)[1:] / len(span_words)
        stats["span_words_histogram"] = {str(n + 1): round(float(p), 4) for n, p in enumerate(histogram)}
    if hasattr(masker, "statistics"):
        stats.update(masker.statistics(pairs, counters))
    if counters:
        stats["counters"] = dict(sorted(counters.items()))
    return stats


def preview(
    recipe,
    n: int = 4,
    stats_blocks: int = 256,
    batch_size: int = 32,
    jsonl: str | None = None,
    out=None,
    log=None,
    step: int = 1,
) -> dict:
    """Prepare (if needed), mask ``max(n, stats_blocks)`` blocks as at optimiser ``step`` (from 1) of the run, print
    ``n`` of them and the statistics."""

    if n < 0 or stats_blocks < 1 or batch_size < 1 or step < 1:
        raise ConfigError("preview needs --n >= 0, --stats-blocks >= 1 and --step >= 1")
    out = out or sys.stdout
    log = log or (lambda message: print(message, file=sys.stderr))
    if recipe.data.prepared_shards:  # what pretraining reads: the shards as one corpus, nothing prepared
        corpus = ShardedCorpus(resolve_shards(recipe.data.prepared_shards))
    else:
        corpus = PreparedCorpus(prepare(recipe, log=log))
    masker = build_masker(recipe.masking, corpus)
    schedule = recipe.masking.rate_schedule
    rate = schedule.rate_at(step - 1) if schedule.active else None  # the schedule counts the run's steps done
    if rate is not None:
        masker = with_rate(masker, rate)
    dataset = BlockDataset(corpus, recipe.data.max_len)
    if len(dataset) == 0:
        raise InputError(f"{corpus.directory}: no blocks")
    order = BlockSampler(len(dataset), seed=recipe.seed).order(0, 0, max(n, stats_blocks))
    rng = np.random.default_rng(recipe.seed)
    pad = corpus.special_ids["pad"]
    pairs = []
    for start in range(0, len(order), batch_size):
        batch = collate_blocks([dataset[int(i)] for i in order[start : start + batch_size]], pad)
        pairs.append((batch, masker(batch, rng)))

    tokenizer = corpus.tokenizer
    terms = getattr(masker, "terms", None)
    print(" · ".join([LEGEND, *([masker.legend] if hasattr(masker, "legend") else [])]), file=out)
    shown = 0
    for _, masked in pairs:
        if shown == n:
            break
        originals = tokenizer.convert_ids_to_tokens(masked.target_labels.tolist())
        for row in range(min(masked.batch_size, n - shown)):
            tokens = tokenizer.convert_ids_to_tokens(masked.input_ids[row].tolist())
            print(f"\n[block {order[shown]}]", file=out)
            print(render_block(tokens, masked, row, originals, terms, getattr(masker, "mark", None)), file=out)
            shown += 1
    if jsonl:
        with open(jsonl, "w", encoding="utf-8") as handle:
            for _, masked in pairs:
                handle.write(json.dumps(masked.to_json_dict()) + "\n")
    stats = statistics(pairs, recipe.masking.scheme, masker)
    if rate is not None:
        stats["scheduled_rate"] = {"step": step, "rate": rate}
    print(json.dumps(stats, ensure_ascii=False), file=out)
    return stats
