"""An evaluation suite: the fine-tuning tasks that judge an encoder, fixed in one YAML file before any run.

.. code-block:: yaml

    # GermEval 2014 NER from 500 labelled sentences: ...   (the first line says what the suite is)
    seeds: [0, 1, 2]
    tasks:
      - name: germeval2014
        kind: ner                       # ner | qa | cls: the `spanlm KIND train` that runs each cell
        recipe: ner/germeval2014        # a shipped recipe's name, or a path to a YAML recipe
        metric: f1                      # the score compared (ner: precision / recall / f1 / cluener_macro_f1;
                                        # qa: em / f1; cls: accuracy / f1 / macro_f1 / matthews /
                                        # pearson / spearman), from the run's final dev evaluation (eval.json)
        arms: [fine-tuned, frozen]      # fine-tuned: the whole encoder trains; frozen: the head alone
        settings:                       # overrides of the recipe, as on the command line
          train.max_steps: 300

A suite's relative paths are relative to the working directory, as a recipe's; in a shipped suite (and in the
shipped recipes it names) the paths into the embedded data (``data/…``) name the data this spanlm ships.
Each task is resolved into its typed recipe, and its data read by its task's own reader (``check_data``), here,
before any cell runs, so an unknown key, a missing data file, data that does not fit the recipe's layout or an
unknown task kind stops the suite with one line before anything is trained.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from spanlm.errors import ConfigError, InputError, read_text

ARMS = ("fine-tuned", "frozen")


def _ratio(numerator, denominator):
    """100 · numerator / denominator, 0 where the denominator is 0 (as the NER scores define it)."""
    return np.divide(100.0 * numerator, denominator, out=np.zeros(np.shape(numerator)), where=denominator > 0)


# kind → its typed recipe (module, class) and its metrics: the path of each in eval.json, and how it follows
# from the sums of the run's per-example columns over n dev examples (per_example.json; None: no formula).
TASK_KINDS = {
    "ner": (
        "spanlm.ner.config",
        "NerRecipe",
        {
            "precision": (("micro", "precision"), lambda c, n: _ratio(c["tp"], c["n_pred"])),
            "recall": (("micro", "recall"), lambda c, n: _ratio(c["tp"], c["n_gold"])),
            "f1": (("micro", "f1"), lambda c, n: _ratio(2 * c["tp"], c["n_pred"] + c["n_gold"])),
            "cluener_macro_f1": (("cluener_macro_f1", "f1"), None),
        },
    ),
    "qa": (
        "spanlm.qa.config",
        "QARecipe",
        {"em": (("em",), lambda c, n: c["em"] / n), "f1": (("f1",), lambda c, n: c["f1"] / n)},
    ),
    "cls": (
        "spanlm.cls.config",
        "ClsRecipe",
        {
            "accuracy": (("accuracy",), lambda c, n: 100.0 * c["correct"] / n),
            **{name: ((name,), None) for name in ("f1", "macro_f1", "matthews", "pearson", "spearman")},
        },
    ),
}
# kind → the module whose check_data(recipe) reads a task's train and dev data as its run will (before any cell)
DATA_CHECKS = {"ner": "spanlm.ner.task", "qa": "spanlm.qa.task", "cls": "spanlm.cls.task"}
# kind → the recipe's window length (data.KEY): what must fit in the positions of every encoder of the suite
WINDOW_KEYS = {"ner": "max_len", "qa": "max_length", "cls": "max_length"}
SUITE_KEYS = {"seeds", "baseline", "tasks"}
TASK_KEYS = {"name", "kind", "recipe", "metric", "arms", "settings", "test"}


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    kind: str
    metric: str
    arms: tuple[str, ...]
    recipe: Any  # the typed recipe with the suite's settings applied, before any encoder or seed
    source: str  # what the suite named as the recipe
    test: str | None = None  # a test split scored by each cell's final model beside dev, reported on its own

    def score(self, eval_json: dict) -> float:
        """The task's metric in a run's final dev scores."""
        value = eval_json
        for key in TASK_KINDS[self.kind][2][self.metric][0]:
            if not isinstance(value, dict) or key not in value:
                # the suite's check should have refused such a metric; the finished cells stay for a rerun
                raise ConfigError(
                    f"task {self.name}: its runs' scores hold no {self.metric} (they hold {sorted(eval_json)}); "
                    "name one of theirs as the task's metric and run the suite again"
                )
            value = value[key]
        return float(value)

    @property
    def per_example_score(self):
        """``score(sums, n)`` of the metric from per-example columns, for the bootstrap (None: not available)."""
        return TASK_KINDS[self.kind][2][self.metric][1]


@dataclasses.dataclass(frozen=True)
class Suite:
    path: Path
    description: str
    seeds: tuple[int, ...]
    baseline: str | None
    tasks: tuple[Task, ...]


def load_suite(name_or_path: str, settings: dict | None = None) -> Suite:
    """The suite at a path, or the shipped suite of that name (``demo``, ``eval/demo``); ``settings`` (dotted
    keys) are added to every task's, after its own."""
    from spanlm.recipes import describe, find_recipe, shipped_root, with_embedded_data_paths

    path = Path(name_or_path)
    shipped = None
    if not path.is_file() and path.suffix not in (".yaml", ".yml"):  # a name, unless a file is given (or meant)
        name = name_or_path if name_or_path.startswith("eval/") else f"eval/{name_or_path}"
        try:
            shipped = find_recipe(name).path
        except InputError:
            if not path.exists():
                raise
    if shipped is None:  # a file: it must be one, of UTF-8 text
        text = read_text(path)
    else:  # a shipped suite's name, though a directory of that name (an earlier --out) may sit here
        path = shipped
        text = with_embedded_data_paths(path.read_text(encoding="utf-8"), shipped_root())
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InputError(f"{path}{_yaml_error(error)}") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a suite is a mapping with 'tasks' (and 'seeds', 'baseline')")
    unknown = sorted(set(raw) - SUITE_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown suite key(s) {unknown}; a suite has {sorted(SUITE_KEYS)}")
    seeds = raw.get("seeds", [0])
    # type(s) is int: YAML's true is a bool, which Python counts as an int
    if not (isinstance(seeds, list) and seeds and all(type(s) is int and s >= 0 for s in seeds)):
        raise ConfigError(f"{path}: seeds must be a list of one or more non-negative integers, got {seeds!r}")
    if len(set(seeds)) < len(seeds):
        raise ConfigError(f"{path}: seeds must be different, got {seeds}")
    tasks = raw.get("tasks")
    if not (isinstance(tasks, list) and tasks):
        raise ConfigError(f"{path}: 'tasks' must list one or more tasks")
    if settings:
        tasks = [
            entry | {"settings": (entry.get("settings") or {}) | settings}
            if isinstance(entry, dict) and isinstance(entry.get("settings") or {}, dict)
            else entry  # its own error follows
            for entry in tasks
        ]
    parsed = tuple(_task(path, index, entry) for index, entry in enumerate(tasks))
    names = [task.name for task in parsed]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"{path}: task names must be different, {repeated} repeat")
    baseline = raw.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise ConfigError(f"{path}: baseline must be an encoder name, got {baseline!r}")
    return Suite(path, describe(path), tuple(seeds), baseline, parsed)


def _yaml_error(error: yaml.YAMLError) -> str:
    """``:LINE: not valid YAML (what)``, to follow a file's name."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{f':{mark.line + 1}' if mark else ''}: not valid YAML ({problem})"


def _task(path: Path, index: int, entry: Any) -> Task:
    import importlib

    from spanlm.config import from_dict
    from spanlm.recipes import find_recipe, shipped_root, with_embedded_data_paths

    where = f"{path}: tasks[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: a task is a mapping with {sorted(TASK_KEYS)}")
    unknown = sorted(set(entry) - TASK_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; a task has {sorted(TASK_KEYS)}")
    missing = sorted({"name", "kind", "recipe", "metric"} - set(entry))
    if missing:
        raise ConfigError(f"{where}: missing {missing}")
    name, kind = str(entry["name"]), entry["kind"]
    where = f"{path}: task {name}"
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"{where}: a task name is letters, digits, '-' and '_' (it names folders)")
    if not isinstance(kind, str) or kind not in TASK_KINDS:
        raise ConfigError(f"{where}: unknown kind {kind!r}; one of {sorted(TASK_KINDS)}")
    module, class_name, metrics = TASK_KINDS[kind]
    if not isinstance(entry["metric"], str) or entry["metric"] not in metrics:
        raise ConfigError(f"{where}: a {kind} task's metric is one of {sorted(metrics)}, got {entry['metric']!r}")
    arms = entry.get("arms", ["fine-tuned"])
    if not (
        isinstance(arms, list)
        and arms
        and all(isinstance(arm, str) for arm in arms)
        and set(arms) <= set(ARMS)
        and len(set(arms)) == len(arms)
    ):
        raise ConfigError(f"{where}: arms must list one or both of {list(ARMS)}, got {arms!r}")
    settings = entry.get("settings") or {}
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}: settings must map dotted keys to values, got {settings!r}")

    source = str(entry["recipe"])
    recipe_path = Path(source)
    if recipe_path.exists() or recipe_path.suffix in (".yaml", ".yml"):
        try:
            text = read_text(recipe_path)
        except InputError as error:
            raise InputError(f"{where}: recipe {error}") from None
    else:
        try:
            recipe_path = find_recipe(source).path
        except InputError as error:
            raise InputError(f"{where}: {error}") from None
        text = with_embedded_data_paths(recipe_path.read_text(encoding="utf-8"), shipped_root())
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InputError(f"{where}: recipe {recipe_path}{_yaml_error(error)}") from None
    if data is None:  # an empty recipe: the defaults
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{where}: recipe {recipe_path}: a recipe is a mapping of sections, got {type(data).__name__}")
    for key, value in settings.items():
        *sections, last = str(key).split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{where}: setting {key}: '{section}' is not a section")
        node[last] = value
    cls = getattr(importlib.import_module(module), class_name)
    try:
        recipe = from_dict(cls, data)
    except (ConfigError, ValueError, TypeError) as error:
        raise ConfigError(f"{where}: {error}") from None
    for split in ("train", "dev"):
        data = getattr(recipe.data, split)
        if not data:
            raise ConfigError(f"{where}: data.{split} is required: every cell is scored on its dev set")
        if not data.startswith("hf:") and not Path(data).exists():
            raise InputError(f"{where}: data.{split} {data}: no such file or directory")
    test = entry.get("test")
    if test is not None and not isinstance(test, str):
        raise ConfigError(f"{where}: test is a data file (or hf:NAME), got {test!r}")
    if test and not test.startswith("hf:") and not Path(test).exists():
        raise InputError(f"{where}: test {test}: no such file or directory")
    for split in [recipe.data.dev, *([test] if test else [])]:
        try:
            scored = _scored_metrics(kind, recipe, split)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
        if entry["metric"] not in scored:
            raise ConfigError(
                f"{where}: metric {entry['metric']}: its runs do not score it on {split} (they score "
                f"{', '.join(sorted(scored))})"
            )
    check = importlib.import_module(DATA_CHECKS[kind]).check_data
    # every split read as its cells will read it (a dataset: at its cell): a missing column or a wrong format
    # stops the suite here; the test split as the dev set is read
    for dev in [recipe.data.dev, *([test] if test else [])]:
        if any(path.startswith("hf:") for path in (recipe.data.train, dev)):
            continue
        try:
            check(dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, dev=dev)))
        except (InputError, ConfigError) as error:
            raise type(error)(f"{where}: {error}") from None
    return Task(name, kind, entry["metric"], tuple(arms), recipe, source, test or None)


def _scored_metrics(kind: str, recipe, data: str) -> set[str]:
    """The metrics a run of ``recipe`` reports on ``data`` (its dev set, or a test split that `spanlm KIND eval`
    scores): the keys of its eval.json (``TASK_KINDS``' names)."""
    if kind == "cls":  # the recipe's cls.metrics, else its benchmark's, else by the problem
        from spanlm.cls.task import is_regression, resolve_metrics

        return set(resolve_metrics(recipe, is_regression(recipe)))
    if kind == "ner":  # CLUENER's macro F1 only for data in its format
        from spanlm.ner.data import input_format

        cluener = input_format(data, recipe.data) == "cluener"
        return {"precision", "recall", "f1", *(["cluener_macro_f1"] if cluener else [])}
    return set(TASK_KINDS[kind][2])
