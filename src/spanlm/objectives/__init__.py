"""Objectives: one module per objective (model + loss), registered by name with the masking schemes it trains
with and, optionally, its own ``objective.<name>`` recipe section.

Adding an objective = a builder decorated with ``@register(name, schemes=...)``, and a masking scheme if it
needs a new one (:func:`spanlm.masking.base.register_scheme`); both may live in one folder outside this
package: ``tests/toy_span/`` is one added that way, ``tests/toy_objective.py`` one module with a builder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from spanlm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Registered:
    """An objective's builder ``build(recipe, corpus) -> Objective`` and the masking schemes it trains with:
    a tuple, or ``schemes(recipe) -> tuple`` when its own settings decide; ``needs`` says what they provide;
    ``config``: the dataclass of its ``objective.<name>`` section, if it has one."""

    build: Callable
    schemes: tuple[str, ...] | Callable[..., tuple[str, ...]]
    needs: str = ""
    config: type | None = None

    def check_scheme(self, name: str, recipe) -> None:
        schemes = self.schemes(recipe) if callable(self.schemes) else self.schemes
        if recipe.masking.scheme not in schemes:
            why = f" ({self.needs})" if self.needs else ""
            raise ConfigError(
                f"objective '{name}' needs masking.scheme {' or '.join(schemes)}{why}, not '{recipe.masking.scheme}'"
            )


# name → its registration; each objective module adds itself here.
OBJECTIVES: dict[str, Registered] = {}


def register(
    name: str, schemes: tuple[str, ...] | Callable[..., tuple[str, ...]], needs: str = "", config: type | None = None
):
    def decorator(builder: Callable) -> Callable:
        OBJECTIVES[name] = Registered(builder, schemes, needs, config)
        return builder

    return decorator


def build_objective(recipe, corpus):
    """The registered objective named by ``recipe.objective.name`` (a :class:`~spanlm.train.objective.Objective`),
    after checking that ``masking.scheme`` is one it trains with."""
    _import_builtin_objectives()
    name = recipe.objective.name
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown objective '{name}' (known: {', '.join(sorted(OBJECTIVES))})")
    registered = OBJECTIVES[name]
    registered.check_scheme(name, recipe)
    return registered.build(recipe, corpus)


def _import_builtin_objectives() -> None:
    """Importing an objective module registers it."""
    import importlib
    import pkgutil

    import spanlm.objectives as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "base":
            importlib.import_module(f"spanlm.objectives.{module.name}")
