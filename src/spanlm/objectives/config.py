"""Typed configuration of the objective section of a recipe (no torch import: configs load fast)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ObjectiveConfig:
    """Which objective to train and its loss settings (see each objective module for its paper)."""

    name: str = "spanbert"  # a registered objective: mlm, wwm, spanbert, macbert, …
    sbo_weight: float = 1.0  # SpanBERT: L = MLM + w·SBO (the authors' argparse default 0.0 disables SBO)
