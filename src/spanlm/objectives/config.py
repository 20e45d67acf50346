"""Typed configuration of the objective section of a recipe (no torch import: configs load fast)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal


@dataclasses.dataclass
class CharBertConfig:
    """CharBERT's char channel and loss weight (Ma et al. 2020; the term vocabulary is masking.noise's)."""

    char_vocab_size: int = 1000  # pad + the most frequent characters + unk (authors: 1001 for BERT)
    char_embedding_size: int = 256
    fusion: Literal["shared", "per_layer"] = "shared"  # one fusion module for all layers (authors) or one per layer
    nlm_weight: float = 1.0  # L = MLM + w·NLM, each per target token

    def __post_init__(self) -> None:
        if self.char_vocab_size < 3 or self.char_embedding_size < 1:
            raise ValueError("char_vocab_size must be at least 3 and char_embedding_size positive")
        if self.nlm_weight < 0:
            raise ValueError("nlm_weight must be non-negative")


@dataclasses.dataclass
class ElectraConfig:
    """ELECTRA replaced-token detection and DeBERTa-V3 embedding sharing (Clark et al. 2020; He et al. 2021).

    The discriminator is ``model``; the generator is the same family scaled by the two ratios (hidden,
    heads and FFN width by ``generator_width``, layers by ``generator_depth``; the embedding keeps the
    discriminator's width so it can be shared). ELECTRA: width 1/4..1/3, depth 1; DeBERTa-V3: 1, 1/2.
    """

    generator_width: float = 0.25
    generator_depth: float = 1.0
    # mlm: BERT's MLM head; sbo: a SpanBERT generator (MLM + SBO heads, masking.scheme span), whose
    # replacements are sampled from its MLM head (the head that predicts every masked token).
    generator_head: Literal["mlm", "sbo"] = "mlm"
    sharing: Literal["none", "es", "gdes"] = "es"  # ELECTRA ties the embeddings (es); DeBERTa-V3: gdes
    rtd_weight: float = 50.0  # λ in L = MLM + λ·RTD (ELECTRA 50, DeBERTa-V3 10)
    temperature: float = 1.0  # of the generator's softmax when sampling replacements
    discriminator_head: Literal["electra", "deberta_v3"] = "electra"

    def __post_init__(self) -> None:
        for name in ("generator_width", "generator_depth"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.rtd_weight < 0:
            raise ValueError("rtd_weight must be non-negative")
        if self.temperature <= 0:
            raise ValueError("temperature must be positive")


@dataclasses.dataclass
class ObjectiveConfig:
    """Which objective to train and its loss settings (see each objective module for its paper).

    An objective registered with a ``config`` dataclass (``spanlm.objectives.register``) has its
    ``objective.<name>`` section read by that dataclass into ``sections``.
    """

    name: str = "spanbert"  # a registered objective: mlm, wwm, spanbert, macbert, …
    sbo_weight: float = 1.0  # SpanBERT: L = MLM + w·SBO (the authors' argparse default 0.0 disables SBO)
    charbert: CharBertConfig = dataclasses.field(default_factory=CharBertConfig)
    electra: ElectraConfig = dataclasses.field(default_factory=ElectraConfig)
    sections: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        registered = self.registered_sections()
        if self.name in registered and self.name not in self.sections:
            self.sections[self.name] = registered[self.name]()  # a recipe states only differences

    @staticmethod
    def registered_sections() -> dict[str, type]:
        """The sections of the objectives registered with one (``spanlm.config.from_dict`` reads them into
        ``sections``; ``to_dict`` writes them back beside the others)."""
        from spanlm.objectives import OBJECTIVES

        builtin = {field.name for field in dataclasses.fields(ObjectiveConfig)}
        return {name: known.config for name, known in OBJECTIVES.items() if known.config and name not in builtin}

    def section(self, name: str | None = None):
        """The settings of objective ``name`` (the run's own when None) from its registered section."""
        name = name or self.name
        return self.sections[name] if name in self.sections else self.registered_sections()[name]()
