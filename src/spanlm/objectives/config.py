"""Typed configuration of the objective section of a recipe (no torch import: configs load fast); the built-in
objectives' own sections are their folders' ``config`` modules."""

from __future__ import annotations

import dataclasses
from typing import Any

from spanlm.objectives.charbert.config import CharBertConfig
from spanlm.objectives.electra.config import ElectraConfig


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
