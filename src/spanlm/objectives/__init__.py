"""Objectives: one module per objective (masker + model + loss), registered by name."""

from __future__ import annotations

from collections.abc import Callable

from spanlm.errors import ConfigError

# name → builder(recipe, corpus) -> Objective; each objective module adds itself here.
OBJECTIVES: dict[str, Callable] = {}


def register(name: str):
    def decorator(builder: Callable) -> Callable:
        OBJECTIVES[name] = builder
        return builder

    return decorator


def build_objective(recipe, corpus):
    """The registered objective named by ``recipe.objective.name`` (a :class:`~spanlm.objectives.base.Objective`)."""
    _import_builtin_objectives()
    name = recipe.objective.name
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown objective '{name}' (known: {', '.join(sorted(OBJECTIVES))})")
    return OBJECTIVES[name](recipe, corpus)


def _import_builtin_objectives() -> None:
    """Importing an objective module registers it."""
    import importlib
    import pkgutil

    import spanlm.objectives as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "base":
            importlib.import_module(f"spanlm.objectives.{module.name}")
