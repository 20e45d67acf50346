"""Masking configuration, the :class:`MaskedBatch` every masker returns, and the masker registry.

A masker corrupts a :class:`~spanlm.data.blocks.BlockBatch` (B×L token ids with word starts) for one
pretraining objective and says what the model must predict::

    masker = build_masker(recipe.masking, corpus)
    masked = masker(block_batch, np.random.default_rng(seed))

Targets are *flat* positions into the B×L batch (``row * L + column``), so heads gather exactly the rows
they need and an empty batch is just empty
arrays. Every random choice goes through the ``np.random.Generator`` passed in: the same generator
state gives the same batch, seed 0 included.

Schemes and their configuration sections (``masking.<section>.<field>`` in a recipe):

=========  ===========================  =====================================================
scheme     section                      what is selected (as the paper)
=========  ===========================  =====================================================
mlm        :class:`MlmConfig`           15% of tokens; 80/10/10 per token (BERT)
wwm        :class:`WholeWordConfig`     whole words up to 15% of tokens (BERT-wwm)
span       :class:`SpanConfig`          geometric word spans, SBO targets (SpanBERT)
ngram      :class:`NgramConfig`         1–4-gram words, similar-word correction (MacBERT)
noise      :class:`NoiseConfig`         character noise + NLM + whole-word MLM (CharBERT)
=========  ===========================  =====================================================

These five are built in: their sections are here, so a recipe is checked without importing any objective;
their maskers live in the objective folders that own them (``spanlm.objectives.spanbert.masker``, …), named by
import path in :data:`SCHEMES` and imported when first built (the whole-word masker stays in
``spanlm.masking.wwm``: CharBERT's noise masker uses it too). A scheme defined elsewhere joins them with
:func:`register_scheme` (its name, its ``masking.<name>`` section and its masker), and the recipe, the loaders,
packing, ``spanlm preview`` and the collators take it from there: a masker states its own batch arrays
(:meth:`MaskedBatch.add`, with how each is packed) and, optionally, its preview lines and collator.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

if TYPE_CHECKING:
    from spanlm.data.blocks import BlockBatch
    from spanlm.data.shards import PreparedCorpus

# What happened to a target position (MaskedBatch.target_kind).
MASK, RANDOM, KEPT, SIMILAR = 0, 1, 2, 3
KIND_NAMES = ("mask", "random", "kept", "similar")


@dataclasses.dataclass
class Proportions:
    """How a selected unit (token, word or span) is corrupted; the four shares sum to 1.

    BERT's 80/10/10 is ``mask=0.8, random=0.1, keep=0.1``; MacBERT's "MLM as correction" replaces the
    [MASK] share by similar words: ``mask=0, similar=0.8, random=0.1, keep=0.1``.
    """

    mask: float = 0.8
    random: float = 0.1
    keep: float = 0.1
    similar: float = 0.0

    def __post_init__(self) -> None:
        shares = (self.mask, self.random, self.keep, self.similar)
        if min(shares) < 0:
            raise ValueError("corruption proportions must be non-negative")
        if abs(sum(shares) - 1.0) > 1e-6:
            raise ValueError(f"corruption proportions mask+random+keep+similar must sum to 1, got {sum(shares):g}")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` independent kinds (int8 MASK / SIMILAR / RANDOM / KEPT) with these probabilities."""
        edges = np.cumsum([self.mask, self.similar, self.random])
        kinds = np.array([MASK, SIMILAR, RANDOM, KEPT], dtype=np.int8)
        return kinds[np.searchsorted(edges, rng.random(n), side="right")]


def _check_rate(rate: float, name: str = "rate") -> None:
    if not 0.0 < rate < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {rate}")


def _no_similar(proportions: Proportions, scheme: str) -> None:
    if proportions.similar:
        raise ValueError(
            f"similar-word replacement needs a neighbour table: only the ngram (MacBERT) scheme has one, not {scheme}"
        )


@dataclasses.dataclass
class MlmConfig:
    """BERT MLM: ``round(rate × n)`` of a block's n non-special tokens, chosen uniformly, 80/10/10 per token."""

    rate: float = 0.15
    proportions: Proportions = dataclasses.field(default_factory=Proportions)
    # Random replacements: "uniform" over normal (non-special) ids as in BERT, or the corpus "unigram"
    # distribution (token_counts.npy with special ids zeroed).
    random_source: Literal["uniform", "unigram"] = "uniform"

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        _no_similar(self.proportions, "mlm")


@dataclasses.dataclass
class WholeWordConfig:
    """Whole-word masking: words in random order until ``round(rate × n)`` tokens are covered.

    As in BERT's create_pretraining_data.py, a word that would overshoot the budget is skipped and the
    next one tried, so the budget is met exactly whenever some remaining word fits.
    """

    rate: float = 0.15
    proportions: Proportions = dataclasses.field(default_factory=Proportions)
    random_source: Literal["uniform", "unigram"] = "uniform"
    # One 80/10/10 draw per "word" (all its pieces share it) or per "token" (Google's WWM code).
    replacement: Literal["word", "token"] = "word"

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        _no_similar(self.proportions, "wwm")


@dataclasses.dataclass
class SpanConfig:
    """SpanBERT masking and SBO targets (Joshi et al. 2020, §3.1; the authors' flags in brackets)."""

    rate: float = 0.15  # budget ceil(rate × n) tokens [--mask_ratio]
    p: float = 0.2  # geometric parameter of the span length in words [--geometric_p; argparse default 0.3]
    max_span: int = 10  # lengths clipped to 1..max_span and renormalised [--span_upper]
    # One 80/10/10 draw per merged "span" (paper) or per "token" (authors' default "word_piece")
    # [--replacement_method].
    replacement: Literal["span", "token"] = "span"
    proportions: Proportions = dataclasses.field(default_factory=Proportions)
    random_source: Literal["uniform", "unigram"] = "unigram"  # the authors sample the corpus distribution
    # SBO boundaries: "external" (s-1, e+1) as in the paper, or "internal" (s, e) [--endpoints].
    endpoints: Literal["external", "internal"] = "external"
    max_targets: int = 15  # SBO targets per span: paper runs 15, code default 20 [--max_pair_targets]

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        _no_similar(self.proportions, "span")
        if not 0.0 < self.p <= 1.0:
            raise ValueError(f"p must be in (0, 1], got {self.p}")
        if self.max_span < 1 or self.max_targets < 1:
            raise ValueError("max_span and max_targets must be at least 1")


@dataclasses.dataclass
class NgramConfig:
    """MacBERT: ``round(rate × w)`` of a block's w words as 1..4-grams, corrected by similar words.

    ``ngram_probs[i]`` is the probability of an (i+1)-gram. Similar words come from the table that
    ``spanlm prepare`` builds when ``data.similar_words`` is set; a word without a same-length
    neighbour gets random tokens instead (counted as a fallback).
    """

    rate: float = 0.15
    ngram_probs: list[float] = dataclasses.field(default_factory=lambda: [0.4, 0.3, 0.2, 0.1])
    proportions: Proportions = dataclasses.field(
        default_factory=lambda: Proportions(mask=0.0, similar=0.8, random=0.1, keep=0.1)
    )
    random_source: Literal["uniform", "unigram"] = "uniform"

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        probs = self.ngram_probs
        if not probs or min(probs) < 0 or abs(sum(probs) - 1.0) > 1e-6:
            raise ValueError(f"ngram_probs must be non-negative and sum to 1, got {probs}")


@dataclasses.dataclass
class NoiseConfig:
    """CharBERT noisy LM plus its whole-word MLM (Ma et al. 2020, §3.3).

    Each word of the term vocabulary is noised with probability ``word_prob``: a word of fewer than
    ``short_word`` characters gets a random character inserted; a longer one loses the character at an
    index in [1, len-2] (probability ``delete_prob``) or has the characters at i and i+1 swapped, i in
    [1, len-2]. The noised word is re-tokenised; its NLM target is the original lower-cased word's id in
    the term vocabulary (the ``term_vocab_size`` most frequent words of the corpus). The MLM part is
    whole-word masking (``mlm``, rate 0.10) that never selects a noised word.
    """

    word_prob: float = 0.10
    short_word: int = 4
    delete_prob: float = 0.5
    insert_chars: int = 81  # inserted characters: the most frequent letters/digits (authors: 81 chars)
    term_vocab_size: int = 30000
    # Noised words usually take more tokens (~1.45 more per word with a 30k WordPiece vocabulary), so
    # rows may grow up to max_len (the model's limit); a row that would outgrow it drops its last
    # words. Build the noise objective's blocks ~12% shorter than max_len to lose (almost) nothing.
    max_len: int = 512
    mlm: WholeWordConfig = dataclasses.field(default_factory=lambda: WholeWordConfig(rate=0.10))

    def __post_init__(self) -> None:
        _check_rate(self.word_prob, "word_prob")
        if not 0.0 <= self.delete_prob <= 1.0:
            raise ValueError("delete_prob must be in [0, 1]")
        if self.short_word < 3:
            raise ValueError("short_word must be at least 3 (deletion/swap need an inner character)")
        if self.insert_chars < 1 or self.term_vocab_size < 1:
            raise ValueError("insert_chars and term_vocab_size must be at least 1")
        if self.max_len < 3:
            raise ValueError("max_len must leave room for [CLS], [SEP] and one token")


@dataclasses.dataclass
class RateSchedule:
    """The masking rate by optimiser step, in place of the scheme's own ``rate`` (CharBERT: its MLM's rate).

    ``constant``: the scheme's rate throughout. ``piecewise``: ``rates[i]`` from ``steps[i]`` until
    ``steps[i + 1]`` (mmBERT's phases: 30% → 15% → 5%). ``linear``: interpolated between the points
    (ModernBERT's Chinese recipe: 30% → 15% over the run). Before the first point the first rate holds,
    after the last point the last. The step is the batch key's (``spanlm.train.loader``), so a batch stays a
    pure function of its key and a resumed run masks as the uninterrupted one. Held-out batches use the
    last rate, the one the run ends on.
    """

    kind: Literal["constant", "piecewise", "linear"] = "constant"
    steps: list[int] = dataclasses.field(default_factory=list)
    rates: list[float] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind == "constant":
            if self.steps or self.rates:
                raise ValueError("rate_schedule.kind constant takes no steps or rates (the scheme's rate holds)")
            return
        if not self.rates or len(self.steps) != len(self.rates):
            raise ValueError(
                f"rate_schedule needs as many steps as rates, at least one: got {len(self.steps)} steps, "
                f"{len(self.rates)} rates"
            )
        for rate in self.rates:
            _check_rate(rate, "rate_schedule.rates")
        if self.steps[0] < 0:
            raise ValueError(f"rate_schedule.steps must not be negative, got {self.steps[0]}")
        for before, after in zip(self.steps, self.steps[1:]):
            if after <= before:
                raise ValueError(f"rate_schedule.steps must increase, got {after} after {before}")

    @property
    def active(self) -> bool:
        return self.kind != "constant"

    def rate_at(self, step: int) -> float:
        """The rate at optimiser ``step`` (only for a piecewise or linear schedule)."""
        if self.kind == "linear":
            return float(np.interp(step, self.steps, self.rates))
        phase = max(int(np.searchsorted(self.steps, step, side="right")) - 1, 0)
        return float(self.rates[phase])

    @property
    def final_rate(self) -> float:
        return float(self.rates[-1])


@dataclasses.dataclass
class MaskingConfig:
    """Which masker a run uses (``scheme``, a registered one) and every scheme's settings.

    The built-in schemes' sections are fields; a scheme registered elsewhere (:func:`register_scheme`) has its
    section read by its own dataclass into ``sections`` (a recipe writes it as ``masking.<name>`` all the same).
    """

    scheme: str = "mlm"
    rate_schedule: RateSchedule = dataclasses.field(default_factory=RateSchedule)
    mlm: MlmConfig = dataclasses.field(default_factory=MlmConfig)
    wwm: WholeWordConfig = dataclasses.field(default_factory=WholeWordConfig)
    span: SpanConfig = dataclasses.field(default_factory=SpanConfig)
    ngram: NgramConfig = dataclasses.field(default_factory=NgramConfig)
    noise: NoiseConfig = dataclasses.field(default_factory=NoiseConfig)
    sections: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            known = " | ".join(repr(name) for name in SCHEMES)
            raise ValueError(f"masking.scheme must be one of {known}, got {self.scheme!r}")
        registered = self.registered_sections()
        if self.scheme in registered and self.scheme not in self.sections:
            self.sections[self.scheme] = registered[self.scheme]()  # a recipe states only differences

    @staticmethod
    def registered_sections() -> dict[str, type]:
        """The sections of the schemes registered beyond the built-in ones (``spanlm.config.from_dict`` reads
        them into ``sections``; ``to_dict`` writes them back beside the others)."""
        builtin = {field.name for field in dataclasses.fields(MaskingConfig)}
        return {name: scheme.config for name, scheme in SCHEMES.items() if name not in builtin}

    def section(self, scheme: str | None = None):
        """The settings of ``scheme`` (the run's own when None)."""
        scheme = scheme or self.scheme
        registered = self.registered_sections()
        if scheme in registered:
            return self.sections[scheme] if scheme in self.sections else registered[scheme]()
        return getattr(self, scheme)


def _empty(dtype=np.int64) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


# How an array of a masked batch is packed (spanlm.data.packing.pack_masked): FLAT positions b·L + t into the
# (B, L) layout are moved to their place in the stream; END positions (one past a range's last token) likewise;
# KEEP arrays (labels, per-target values, per-block inputs the model maps with source_index) are copied.
FLAT, END, KEEP = "flat", "end", "keep"


@dataclasses.dataclass
class MaskedBatch:
    """One corrupted batch and everything the objective's heads predict.

    The fields are what every scheme has; a scheme's own arrays (SpanBERT's SBO targets, CharBERT's NLM labels,
    a wrapper's sampling seed) are added by name with how each packs (:meth:`add`) and read as attributes all
    the same (``masked.sbo_left``).
    """

    input_ids: np.ndarray  # (B, L) int64: the corrupted input
    attention_mask: np.ndarray  # (B, L) bool: real tokens
    target_index: np.ndarray  # (N,) int64, ascending: flat positions the MLM head predicts
    target_labels: np.ndarray  # (N,) int64: their original ids
    target_kind: np.ndarray  # (N,) int8: MASK / RANDOM / KEPT / SIMILAR
    # The masking units as sampled, before any merging: a word (wwm, noise), a SpanBERT span, a MacBERT
    # n-gram. Tokens [span_start, span_end) flat, covering span_words words. For statistics and tests.
    span_start: np.ndarray = dataclasses.field(default_factory=_empty)  # (S,)
    span_end: np.ndarray = dataclasses.field(default_factory=_empty)  # (S,)
    span_words: np.ndarray = dataclasses.field(default_factory=_empty)  # (S,)
    # A packed batch (spanlm.data.packing): (R, W) positions restarting per block, its segments' bounds
    # (S + 1,) and longest segment (a host int: the attention's size), and each packed token's flat position
    # in the block layout (B·L for padding). Empty (0) in a padded batch.
    position_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    cu_seq_lens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    max_seq_len: int = 0
    source_index: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    # Scheme-specific event counts (similar-word fallbacks, noise operations, ...).
    counters: dict[str, int] = dataclasses.field(default_factory=dict)
    # The scheme's own arrays by name, and how each packs (FLAT / END / KEEP).
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    extra_packing: dict[str, str] = dataclasses.field(default_factory=dict)

    ARRAYS = (
        "input_ids",
        "attention_mask",
        "target_index",
        "target_labels",
        "target_kind",
        "span_start",
        "span_end",
        "span_words",
        "position_ids",
        "cu_seq_lens",
        "source_index",
    )
    # How the common arrays pack; the rest of ARRAYS are the layout's own (pack_masked rebuilds them) or KEEP.
    PACKING = {"target_index": FLAT, "span_start": FLAT, "span_end": END}

    def add(self, packing: str, **arrays: np.ndarray) -> MaskedBatch:
        """Add (or replace) the scheme's ``arrays``, each packed as ``packing``; returns this batch."""
        if packing not in (FLAT, END, KEEP):
            raise ValueError(f"packing must be {FLAT}, {END} or {KEEP}, not {packing!r}")
        for name, array in arrays.items():
            if name in self.ARRAYS or name in ("max_seq_len", "counters", "extras", "extra_packing"):
                raise ValueError(f"{name!r} is a common field of every masked batch, not a scheme's own array")
            self.extras[name] = array
            self.extra_packing[name] = packing
        return self

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: a scheme's own array by name (``masked.sbo_left``).
        extras = self.__dict__.get("extras")
        if extras is not None and name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__} has no array {name!r}")

    def array_names(self) -> tuple[str, ...]:
        """Every array of this batch: the common ones, then the scheme's own."""
        return (*self.ARRAYS, *self.extras)

    def packing(self) -> dict[str, str]:
        """Array name → FLAT / END / KEEP for every array ``pack_masked`` remaps or copies."""
        return {**self.PACKING, **self.extra_packing}

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    def to_torch(self, fields: tuple[str, ...] | None = None) -> dict:
        """The arrays named in ``fields`` (every array when None) as tensors, sharing memory where possible, and
        ``max_seq_len`` as the ``int`` it is (the variable-length attention takes it on the host);
        ``counters`` are statistics, not inputs."""
        import torch

        names = self.array_names()
        if fields is not None:
            names = [name for name in names if name in fields]
        batch = {name: torch.from_numpy(np.ascontiguousarray(getattr(self, name))) for name in names}
        if fields is None or "max_seq_len" in fields:
            batch["max_seq_len"] = int(self.max_seq_len)
        return batch

    def to_json_dict(self) -> dict:
        """Plain lists, for ``spanlm preview --jsonl``."""
        data = {name: getattr(self, name).tolist() for name in self.array_names()}
        data["max_seq_len"] = int(self.max_seq_len)
        data["counters"] = {key: int(value) for key, value in self.counters.items()}
        return data


class Masker(Protocol):
    """``masker(batch, rng) -> MaskedBatch``: vectorised NumPy, all randomness from ``rng``."""

    def __call__(self, batch: BlockBatch, rng: np.random.Generator) -> MaskedBatch: ...


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """What a masker needs to know about the token ids: size, [MASK], specials, corpus frequencies."""

    size: int
    mask_id: int
    special_ids: tuple[int, ...]
    token_counts: np.ndarray | None = None  # (size,) int64 corpus frequency, for unigram sampling

    @classmethod
    def from_corpus(cls, corpus: PreparedCorpus) -> Vocabulary:
        return cls(
            size=corpus.vocab_size,
            mask_id=int(corpus.special_ids["mask"]),
            special_ids=tuple(int(i) for i in corpus.meta["all_special_ids"]),
            token_counts=np.asarray(corpus.token_counts),
        )


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A masking scheme: its ``masking.<name>`` section and its masker, a class or ``"module:Class"`` (imported
    when first built, so loading a recipe imports no masker).

    The masker class has ``from_corpus(section, corpus)``; optionally ``for_collator(section, vocabulary,
    **options)`` (it masks tokenizer features in :class:`spanlm.collators.MaskingCollator`), ``collated`` (its own
    arrays a collator returns), ``reads_words`` (False: needs no word boundaries), ``with_rate(rate)`` (a rate
    schedule sets it), ``prepare()`` (its one-off tables, built before pretraining's workers fork) and
    ``statistics(pairs, counters)`` / ``mark(shown, masked, row, low, length, terms)`` (lines in ``spanlm preview``).
    """

    config: type
    masker: type | str

    def masker_class(self) -> type:
        if isinstance(self.masker, str):
            module, name = self.masker.split(":")
            return getattr(importlib.import_module(module), name)
        return self.masker


# name → scheme: the built-in ones, their maskers in the objective folders; register_scheme adds others.
SCHEMES: dict[str, Scheme] = {
    "mlm": Scheme(MlmConfig, "spanlm.objectives.mlm.masker:MlmMasker"),
    "wwm": Scheme(WholeWordConfig, "spanlm.masking.wwm:WholeWordMasker"),
    "span": Scheme(SpanConfig, "spanlm.objectives.spanbert.masker:SpanMasker"),
    "ngram": Scheme(NgramConfig, "spanlm.objectives.macbert.masker:NgramMasker"),
    "noise": Scheme(NoiseConfig, "spanlm.objectives.charbert.masker:NoiseMasker"),
}


def register_scheme(name: str, config: type, masker: type | str) -> None:
    """Make ``name`` a masking scheme: ``masking.scheme: name`` builds ``masker`` from the ``masking.<name>``
    section, read by the dataclass ``config``."""
    if name in SCHEMES and SCHEMES[name] != Scheme(config, masker):
        raise ValueError(f"masking scheme {name!r} is already registered")
    if name in {field.name for field in dataclasses.fields(MaskingConfig)} - set(SCHEMES):
        raise ValueError(f"{name!r} is a key of the masking section, not a free scheme name")
    SCHEMES[name] = Scheme(config, masker)


def build_masker(config: MaskingConfig, corpus: PreparedCorpus) -> Masker:
    """The masker of ``config.scheme``, set up from its config section and the prepared corpus."""
    masker_class = SCHEMES[config.scheme].masker_class()
    return masker_class.from_corpus(config.section(), corpus)


def with_rate(masker: Masker, rate: float) -> Masker:
    """A shallow copy of ``masker`` whose budget is ``rate`` (for a :class:`RateSchedule`): its own ``with_rate``
    when it has one (CharBERT's noise masker: its whole-word MLM's rate), else its section's ``rate``."""
    if hasattr(masker, "with_rate"):
        return masker.with_rate(rate)
    scheduled = copy.copy(masker)
    scheduled.config = dataclasses.replace(masker.config, rate=rate)
    return scheduled


def make_rng(seed: int, *stream: int) -> np.random.Generator:
    """A generator for one data stream: ``make_rng(seed, rank, worker, epoch)``.

    Distinct ``stream`` tuples give independent generators (NumPy SeedSequence spawning by entropy
    words), so DataLoader workers and ranks never repeat each other's masks; ``make_rng(seed)`` is
    ``np.random.default_rng(seed)``.
    """
    return np.random.default_rng([seed, *stream] if stream else seed)
