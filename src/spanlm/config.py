"""Typed configuration: YAML recipes and dotted overrides read into dataclasses.

A recipe is a YAML file whose top-level keys are the sections of a recipe dataclass (pretraining:
:class:`spanlm.pretrain.recipe.Recipe`; fine-tuning: ``NerRecipe``, ``QARecipe``), each section one small
dataclass owned by its component. Values are checked against the dataclass field types; unknown keys and
wrong types are rejected with the full key path and the allowed keys, so a typo never silently falls back
to a default. This module knows no component: every layer may import it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from spanlm.errors import ConfigError, InputError, require_file


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it (nested dataclasses are built)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, prefix=key + ".")
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, key)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"config key '{key}': {value!r} matches none of {tp}")
    if origin is Literal:
        if isinstance(value, bool) and ("on" if value else "off") in args:
            value = "on" if value else "off"  # YAML 1.1 reads a bare `off` / `on` as a boolean
        if value not in args:
            raise ConfigError(f"config key '{key}' must be one of {_type_name(tp)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        return [_convert(item, args[0], f"{key}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        return {k: _convert(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        # YAML 1.1 (PyYAML) reads `1e-4` — exponent without a dot — as a string; it is a float here.
        try:
            value = float(value)
        except ValueError:
            pass
    if tp is float and isinstance(value, float) and math.isnan(value):
        # NaN compares false with every bound, so a field's own range check would let it through
        raise ConfigError(f"config key '{key}' must be a number, got nan")
    if tp is Any:
        return value
    # bool is a subclass of int: reject True for an int field and 1 for a bool field alike.
    if not isinstance(value, tp) or (tp is not bool and isinstance(value, bool)):
        raise ConfigError(f"config key '{key}' must be {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    return value


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types.

    A section whose keys changed reads older saved recipes through its ``from_older(data) -> data``. A section
    that others extend (the masking schemes registered beyond the built-in ones) names their sections with
    ``registered_sections() -> {key: dataclass}``: each is read by its own dataclass into the section's
    ``sections`` dict.
    """
    if hasattr(cls, "from_older"):
        data = cls.from_older(data)
    hints = typing.get_type_hints(cls)
    extensible = hasattr(cls, "registered_sections")
    registered = cls.registered_sections() if extensible else {}
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and not (extensible and f.name == "sections")}
    unknown = [k for k in data if k not in fields and k not in registered]
    if unknown:
        allowed = ", ".join(prefix + name for name in [*fields, *registered])
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}' (allowed: {allowed})")
    kwargs = {name: _convert(value, hints[name], prefix + name) for name, value in data.items() if name in fields}
    sections = {
        name: _convert(value, registered[name], prefix + name) for name, value in data.items() if name in registered
    }
    if sections:
        kwargs["sections"] = sections
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:  # __post_init__ validation or a missing required field
        if not prefix:  # the recipe itself: its own top-level keys (seed)
            raise ConfigError(f"recipe: {error}") from None
        raise ConfigError(f"config section '{prefix.rstrip('.')}': {error}") from None


def check_seed(seed: int) -> None:
    """A recipe's top-level ``seed`` seeds NumPy's and torch's generators, which take no negative number."""
    if seed < 0:
        raise ValueError(f"config key 'seed' must be a non-negative integer, got {seed}")


def to_dict(config: Any) -> Any:
    """``config`` as plain data (what :func:`from_dict` reads back): ``dataclasses.asdict``, with a section's
    registered ``sections`` written beside its own keys."""
    if dataclasses.is_dataclass(config):
        data = {field.name: to_dict(getattr(config, field.name)) for field in dataclasses.fields(config)}
        if hasattr(config, "registered_sections"):
            data.update(data.pop("sections"))
        return data
    if isinstance(config, (list, tuple)):
        return type(config)(to_dict(value) for value in config)
    if isinstance(config, dict):
        return {key: to_dict(value) for key, value in config.items()}
    return copy.deepcopy(config)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``train.max_steps=200`` → (["train", "max_steps"], 200); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override '{text}' has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override '{text}': '{part}' is not a section")
            node = child
        node[parts[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"recipe {path} is a directory, not a YAML file")
    if not path.exists():
        raise ConfigError(f"recipe {path} does not exist")
    try:
        require_file(path)
    except InputError as error:
        raise ConfigError(f"recipe {error}") from None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(f"recipe {path} is not valid YAML: {error}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path} must be a mapping of sections, got {type(data).__name__}")
    return data


def load_config(path: str | Path | None, overrides: list[str] = (), *, cls: type) -> Any:
    """Read a YAML recipe into dataclass ``cls`` (or start from its defaults when ``path`` is None) and
    apply dotted overrides."""
    data = read_yaml(path) if path is not None else {}
    return from_dict(cls, apply_overrides(data, list(overrides)))


def save_config(config: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False, allow_unicode=True), encoding="utf-8")
