"""Objectives: one folder per objective (masker, heads, model and loss), registered by name with the masking
schemes it trains with and, optionally, its own ``objective.<name>`` recipe section.

Importing this package registers every built-in objective: each folder's ``__init__`` registers its builder
by import path (``"spanlm.objectives.spanbert.objective:build_spanbert"``), so registering imports no torch and
the model is imported when first built. Adding an objective = a builder registered with
``register(name, schemes=...)(build)``, and a masking scheme if it needs a new one
(:func:`spanlm.masking.base.register_scheme`); both may live in one folder outside this package:
``tests/toy_span/`` is one added that way, ``tests/toy_objective.py`` one module with a builder.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable

from spanlm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Registered:
    """An objective's builder ``build(recipe, corpus) -> Objective`` (or its ``"module:function"`` path, imported
    when first built) and the masking schemes it trains with:
    a tuple, or ``schemes(recipe) -> tuple`` when its own settings decide; ``needs`` says what they provide;
    ``config``: the dataclass of its ``objective.<name>`` section, if it has one."""

    build: Callable | str
    schemes: tuple[str, ...] | Callable[..., tuple[str, ...]]
    needs: str = ""
    config: type | None = None

    def builder(self) -> Callable:
        if isinstance(self.build, str):
            module, name = self.build.split(":")
            return getattr(importlib.import_module(module), name)
        return self.build

    def check_scheme(self, name: str, recipe) -> None:
        schemes = self.schemes(recipe) if callable(self.schemes) else self.schemes
        if recipe.masking.scheme not in schemes:
            why = f" ({self.needs})" if self.needs else ""
            raise ConfigError(
                f"objective '{name}' needs masking.scheme {' or '.join(schemes)}{why}, not '{recipe.masking.scheme}'"
            )


# name → its registration; each objective folder adds itself here.
OBJECTIVES: dict[str, Registered] = {}


def register(
    name: str, schemes: tuple[str, ...] | Callable[..., tuple[str, ...]], needs: str = "", config: type | None = None
):
    def decorator(builder: Callable | str) -> Callable | str:
        OBJECTIVES[name] = Registered(builder, schemes, needs, config)
        return builder

    return decorator


def build_objective(recipe, corpus):
    """The registered objective named by ``recipe.objective.name`` (a :class:`~spanlm.train.objective.Objective`),
    after checking that ``masking.scheme`` is one it trains with."""
    name = recipe.objective.name
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown objective '{name}' (known: {', '.join(sorted(OBJECTIVES))})")
    registered = OBJECTIVES[name]
    registered.check_scheme(name, recipe)
    return registered.builder()(recipe, corpus)


def _register_builtin_objectives() -> None:
    """Each folder of this package is a built-in objective; importing it registers it (its modules with torch
    are imported when it is first built)."""
    for module in pkgutil.iter_modules(__path__):
        if module.ispkg:
            importlib.import_module(f"{__name__}.{module.name}")


_register_builtin_objectives()
