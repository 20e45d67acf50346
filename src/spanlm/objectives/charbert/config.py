"""CharBERT's ``objective.charbert`` recipe section (no torch import: configs load fast)."""

from __future__ import annotations

import dataclasses
from typing import Literal


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
