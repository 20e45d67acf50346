"""`spanlm pretrain`: a prepared corpus and a pretraining objective handed to the engine's loop."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from spanlm.data.block_index import share_block_index
from spanlm.data.blocks import BlockDataset
from spanlm.data.prepare import prepare, record_run
from spanlm.data.shards import PreparedCorpus, ShardedCorpus, resolve_shards
from spanlm.errors import ConfigError, InputError
from spanlm.files import read_metadata
from spanlm.models.backbone import shortest_position_table
from spanlm.models.flops import training_flops
from spanlm.models.modern_config import MODERN_FAMILIES, replaced_settings
from spanlm.models.packed import resolve_packing
from spanlm.objectives import build_objective
from spanlm.objectives.pretrained_heads import describe_heads
from spanlm.pretrain.batches import MixedBlocks, build_train_loader, eval_batches, split_held_out_text
from spanlm.pretrain.kept_tokenizer import check_same_tokenizer, checkpoint_tokenizer_dir, keep_tokenizer
from spanlm.pretrain.phases import pretrain_phases
from spanlm.train.dist import DistEnv, barrier
from spanlm.train.loop import StartingPoint, TrainingSetup, train

# Block length, batch layout and size: another value changes every batch.
RESUME_KEEPS = (
    "data.max_len",
    "data.packing",
    "data.tokens_per_batch",
    "data.order_seed",
    "data.shard_weights",
    "data.input_weights",
)


# What usually makes a masked LM that stays at its unigram line learn (spanlm.train.health)
PRETRAINING_HINT = (
    "train.lr and train.warmup_steps, the masking rate (masking.<scheme>.rate), model.hidden_dropout and "
    "model.attention_dropout, tokenizer.vocab_size"
)


def mixture_sources(data, corpus) -> tuple[list[float], list[int]]:
    """The weights of a mixture and the token each of its sources starts at: the shards of
    ``data.prepared_shards`` (``data.shard_weights``) or the entries of ``data.inputs`` (``data.input_weights``)."""
    if data.shard_weights:
        if len(data.shard_weights) != len(corpus.shards):
            raise ConfigError(
                f"data.shard_weights has {len(data.shard_weights)} weights for the {len(corpus.shards)} shards of "
                "data.prepared_shards; give one per shard, in their order"
            )
        return data.shard_weights, list(corpus.token_starts[:-1])
    starts, entries = corpus.meta.get("input_token_starts"), corpus.meta.get("input_entries")
    if starts is None or entries is None:
        raise InputError(
            f"{corpus.directory}: prepared before spanlm recorded where each input starts (or as a shard), so "
            "data.input_weights cannot weigh its inputs; prepare it again (`spanlm prepare RECIPE --force`)"
        )
    if len(data.input_weights) != entries[-1] + 1:
        raise ConfigError(
            f"data.input_weights has {len(data.input_weights)} weights for the {entries[-1] + 1} entries of "
            f"data.inputs {corpus.directory} was prepared from; give one per entry, in their order"
        )
    return data.input_weights, [starts[entries.index(entry)] for entry in range(entries[-1] + 1)]


def pretraining_setup(recipe, env: DistEnv, log=print, start: StartingPoint = StartingPoint()) -> TrainingSetup:
    """Prepared shards → blocks → the objective's masker in DataLoader workers.

    A resumed run keeps the tokenizer its checkpoint was trained with: ``prepare`` is given the
    checkpoint's tokenizer fingerprint and the run's copy of that tokenizer.
    """
    fingerprint = start.tokenizer_fingerprint
    kept_copy = checkpoint_tokenizer_dir(start.checkpoint, fingerprint) if start.checkpoint is not None else None
    # Rank 0 prepares the corpus (or finds it up to date; a sharded one is prepared beforehand) and its
    # block index; the others wait and memory-map both.
    shards = resolve_shards(recipe.data.prepared_shards) if recipe.data.prepared_shards else None
    # What the run writes into its prepared corpus (an input it shares with other runs) waits until the run is
    # known to start: a run refused or failing leaves the corpus as it found it.
    on_start: list[Callable[[], None]] = []
    if env.is_main:
        directories = shards or [
            prepare(recipe, log=log, keep_tokenizer=fingerprint, kept_copy=kept_copy, deferred=on_start)
        ]
        for directory in directories:
            on_start.append(functools.partial(record_run, directory, recipe.train.output_dir, log=log))
            for length in {recipe.data.max_len, held_out_length(recipe)}:
                share_block_index(PreparedCorpus(directory), length, log=log)
    barrier(env)
    corpus = ShardedCorpus(shards) if shards else PreparedCorpus(recipe.data.prepared_dir)
    if env.is_main:
        corpus.tokenizer  # loaded (and checked against the shards) now: the run keeps the tokenizer it starts with
    if start.checkpoint is not None:
        check_same_tokenizer(start.checkpoint, start.trainer_state, corpus.meta["tokenizer_fingerprint"], recipe)
    blocks = BlockDataset(corpus, recipe.data.max_len)
    train_blocks, held_out = held_out_split(recipe, corpus, blocks)
    if recipe.train.eval_every and recipe.train.eval_blocks and len(held_out) == 0 and env.is_main:
        log(
            f"{corpus.directory}: {len(blocks)} blocks of {recipe.data.max_len} tokens hold out none (a tenth at most, "
            "so that training keeps most): train.eval_every evaluates nothing; more text or a shorter data.max_len "
            "gives held-out blocks"
        )
    if recipe.data.shard_weights or recipe.data.input_weights:  # a mixture: each source its weight's share
        weights, token_starts = mixture_sources(recipe.data, corpus)
        # the first block of each source: blocks never cross a document, so each source's blocks are contiguous
        train_blocks = MixedBlocks(train_blocks, np.searchsorted(blocks.index[:, 0], token_starts), weights)
    torch.manual_seed(recipe.seed)  # the same seed on every rank gives identical initial weights
    objective = build_objective(recipe, corpus).to(env.device)
    if objective.head_report and env.is_main:
        log(f"heads from {recipe.model.path}: {describe_heads(objective.head_report)}")
    backbone = getattr(objective, "backbone", None)
    if recipe.model.path and backbone is not None and recipe.model.family in MODERN_FAMILIES and env.is_main:
        stock = read_metadata(Path(recipe.model.path) / "config.json", "the checkpoint is damaged") or {}
        if changed := replaced_settings(stock, backbone.config):  # the recipe's settings, said
            log(f"{recipe.model.path}: the recipe's settings replace the checkpoint's: {'; '.join(changed)}")
    check_max_len(
        objective, recipe.data.max_len, recipe.masking.noise.max_len if recipe.masking.scheme == "noise" else None
    )
    # config.yaml records the choice; the device's default is the speed backend's (handed over by the trainer)
    recipe.data.packing = resolve_packing(
        recipe.data.packing, objective, env.packs_by_default, recipe.train.compile, log if env.is_main else None
    )
    fields = objective.batch_fields
    schedule = recipe.masking.rate_schedule
    # Tables a masker builds once (CharBERT's noised words) are built here, before the DataLoader workers fork.
    if hasattr(objective.masker, "prepare"):
        objective.masker.prepare()
    loader = build_train_loader(
        blocks,
        train_blocks,
        objective.masker,
        recipe.train,
        recipe.seed if recipe.data.order_seed is None else recipe.data.order_seed,
        env.rank,
        env.world_size,
        recipe.data,
        fields,
        schedule,
    )
    return TrainingSetup(
        objective,
        loader,
        lambda: eval_batches(
            blocks,
            held_out,
            objective.masker,
            recipe.train.batch_size,
            recipe.seed,
            env.rank,
            env.world_size,
            recipe.data,
            fields,
            schedule,
        ),
        tokenizer_fingerprint=corpus.meta["tokenizer_fingerprint"],
        keep_with_run=functools.partial(keep_tokenizer, corpus),
        resume_keeps=RESUME_KEEPS,
        flops=training_flops(objective),
        on_start=lambda: [write() for write in on_start],
        learning_hint=PRETRAINING_HINT,
        record_fields={"phase": recipe.phase} if recipe.phase else {},
    )


def held_out_length(recipe) -> int:
    """The block length the held-out text is drawn at: a phased run's longest (data.held_out_max_len), else its own."""
    return recipe.data.held_out_max_len or recipe.data.max_len


def held_out_split(recipe, corpus, blocks: BlockDataset):
    """The training blocks and the held-out ones of ``blocks``: the same text in every phase of a curriculum (drawn
    in its longest blocks from its first phase's shards: spanlm.pretrain.batches.split_held_out_text)."""
    length = held_out_length(recipe)
    reference = blocks if length == blocks.max_len else BlockDataset(corpus, length)
    drawn_from = len(reference)
    starts = getattr(reference.index, "block_starts", None)  # a sharded corpus's: where each shard's blocks start
    if recipe.data.held_out_shards and starts is not None:  # the first phase's shards, which this one's begin with
        drawn_from = int(starts[len(resolve_shards(recipe.data.held_out_shards))])
    return split_held_out_text(blocks, reference, drawn_from, recipe.train.eval_blocks, recipe.seed)


def check_max_len(objective: torch.nn.Module, max_len: int, noise_max_len: int | None = None) -> None:
    """The three lengths of a run agree: blocks of ``data.max_len`` tokens, and for the noise scheme rows
    that misspelt words may grow to ``masking.noise.max_len``, fit every encoder's position table
    (else: an index error mid-step), and noised rows are never cut below their blocks' own length."""
    limit = shortest_position_table(objective)
    if noise_max_len is not None and noise_max_len < max_len:
        raise ConfigError(
            f"masking.noise.max_len {noise_max_len} is less than data.max_len {max_len}: noised rows "
            "would lose words of every full block; set it at least data.max_len"
        )
    for key, length in (("data.max_len", max_len), ("masking.noise.max_len", noise_max_len)):
        if length is not None and limit is not None and length > limit:
            raise ConfigError(
                f"{key} {length} exceeds the {limit} positions the model numbers "
                "(model.max_position_embeddings, or the checkpoint of model.path)"
            )


def pretrain(recipe, resume: str | None = None, log=print, weights_from: str | None = None) -> Path:
    """Train ``recipe``'s pretraining objective (its phases in turn, each exported: spanlm.pretrain.phases);
    returns the run directory."""
    if recipe.phases:
        from spanlm.pretrain.curriculum import keeping_curriculum
        from spanlm.pretrain.export import export_checkpoint

        def train_phase(phase, **start) -> Path:  # each phase's config.yaml is its own: the run keeps the whole recipe
            return train(phase, keeping_curriculum(recipe, pretraining_setup), log=log, **start)

        return pretrain_phases(recipe, resume, log, weights_from, train_phase, export_checkpoint)
    return train(recipe, pretraining_setup, resume, log, weights_from)
