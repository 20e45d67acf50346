"""A phased run's curriculum kept in its run directory, as ``curriculum.yaml``.

Each phase is one engine run that writes its own resolved recipe to ``<run>/config.yaml`` (``phases: []``,
``phase: <its name>``), so the last phase's replaces the others' and nothing there would say which phases the run
has. ``curriculum.yaml`` is the recipe as given, its ``phases`` with it: ``spanlm report`` lists the phases from it
(:func:`read_curriculum`) and marks their boundaries on its plots.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from spanlm.config import save_config

CURRICULUM = "curriculum.yaml"


def keeping_curriculum(recipe, build_setup):
    """``build_setup`` (a training setup factory, for one phase of ``recipe``) whose setup also writes ``recipe`` to
    ``<run>/curriculum.yaml`` when its phase starts: the engine calls ``on_start`` on the main process once the start
    is accepted (resume checks passed), so a refused start leaves the file as it was, and the file is there from the
    first phase's first step on (a run reported while it trains, or stopped in its first phase, has it)."""

    def build(*args, **kwargs):
        setup = build_setup(*args, **kwargs)
        then = setup.on_start

        def on_start():
            save_config(recipe, Path(recipe.train.output_dir) / CURRICULUM)
            return then() if then is not None else None

        return dataclasses.replace(setup, on_start=on_start)

    return build


def read_curriculum(run_dir: str | Path) -> list | None:
    """The phases of the run in ``run_dir`` (:class:`spanlm.pretrain.phases.Phase`: name, steps, settings; no resolved
    recipe) from its ``curriculum.yaml``; None for a run without one (not phased, or from before runs kept it). Read
    as written, without the load-time checks of a recipe about to run (its shards or checkpoint may be gone since);
    a damaged file is one line naming it (a ConfigError)."""
    from spanlm.config import from_dict, read_yaml
    from spanlm.errors import ConfigError
    from spanlm.pretrain.phases import Phase, PhaseConfig

    path = Path(run_dir) / CURRICULUM
    if not path.is_file():
        return None
    entries = read_yaml(path).get("phases") or []
    try:
        configs = [from_dict(PhaseConfig, entry) for entry in entries]
    except (ConfigError, ValueError, TypeError, AttributeError) as error:
        raise ConfigError(f"{path}: phases: {error}") from None
    phases, start = [], 0
    for index, config in enumerate(configs):
        phases.append(Phase(index, config, start, start + config.steps, None))
        start += config.steps
    return phases or None
