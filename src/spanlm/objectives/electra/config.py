"""ELECTRA's ``objective.electra`` recipe section and the masking schemes it trains with (no torch import: configs
load fast)."""

from __future__ import annotations

import dataclasses
from typing import Literal


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


def generator_schemes(recipe) -> tuple[str, ...]:
    """A SpanBERT generator (generator_head sbo) needs span masking's SBO targets; an MLM one any token masking."""
    return ("span",) if recipe.objective.electra.generator_head == "sbo" else ("mlm", "wwm", "span")
