"""The recipes (configs/) and the embedded data (data/) that come with spanlm: `spanlm recipes list / copy`.

A wheel carries both folders inside the package as ``spanlm/share/`` (setup.py copies them there); a
source checkout (an editable install) has them at the repository root. The two roots have the same
layout, so a recipe's embedded-data path such as ``data/corpus/frankenstein.txt`` names the same file
under either. Inside a recipe that path is relative to the working directory, like every path of a
recipe, so it only works from the root itself; :func:`copy_recipe` writes it as the absolute path of the
data this spanlm ships, so a copied recipe runs from any directory. Nothing is looked up anywhere else.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from spanlm.errors import InputError

PACKAGE = Path(__file__).resolve().parent
SHIPPED_ROOTS = (PACKAGE / "share", PACKAGE.parents[1])  # a wheel's copy; the source checkout's root
# A path into the embedded data as the recipes write it: data/… with no path character before it, so
# external/… or runs/data/… (the user's own data) is left alone.
EMBEDDED_DATA_PATH = re.compile(r"(?<![\w./-])data/[\w./-]+")


def shipped_root() -> Path:
    """The directory holding the ``configs/`` and ``data/`` this spanlm ships (see the module docstring)."""
    for root in SHIPPED_ROOTS:
        if (root / "configs").is_dir() and (root / "data" / "README.md").is_file():
            return root
    raise InputError(
        f"{PACKAGE}: this spanlm has neither spanlm/share/ (a wheel's recipes and data) nor a source "
        "checkout around it; reinstall it from a wheel or from the repository"
    )


@dataclasses.dataclass(frozen=True)
class ShippedRecipe:
    name: str  # its path under configs/ without .yaml, e.g. pretrain/spanbert
    path: Path
    description: str


def describe(path: Path) -> str:
    """A recipe's subject: the first line of its header comment, up to its first colon (details follow it)."""
    first_line = path.read_text(encoding="utf-8").partition("\n")[0]
    if not first_line.startswith("#"):
        return ""
    return re.split(r":(?:\s|$)", first_line.lstrip("#").strip(), maxsplit=1)[0].rstrip(".")


def shipped_recipes() -> list[ShippedRecipe]:
    configs = shipped_root() / "configs"
    return [
        ShippedRecipe(path.relative_to(configs).with_suffix("").as_posix(), path, describe(path))
        for path in sorted(configs.glob("**/*.yaml"))
    ]


def find_recipe(name: str) -> ShippedRecipe:
    """The shipped recipe ``name`` (``.yaml`` optional), or an :class:`InputError` listing close names."""
    recipes = {recipe.name: recipe for recipe in shipped_recipes()}
    key = name.removesuffix(".yaml")
    if key in recipes:
        return recipes[key]
    stem = key.rsplit("/", 1)[-1]
    same_stem = [other for other in recipes if stem and stem in other.rsplit("/", 1)[-1]]
    close = list(dict.fromkeys(difflib.get_close_matches(key, list(recipes), n=5, cutoff=0.6) + same_stem))
    hint = f"close names: {', '.join(close)}" if close else "`spanlm recipes list` shows them all"
    raise InputError(f"no recipe named '{name}' ({hint})")


def with_embedded_data_paths(text: str, root: Path) -> str:
    """``text`` (a recipe) with every path into the embedded data that exists under ``root`` made absolute.

    Comments are rewritten too, so the commands they show work from anywhere. The result must read as
    the same recipe with only those paths changed: a root whose path YAML would read otherwise unquoted
    (", " in a list, ": ", " #") is refused rather than written into a recipe that means something else.
    """

    def absolute(match: re.Match) -> str:
        path = root / match.group()
        return path.as_posix() if path.exists() else match.group()

    rewritten = EMBEDDED_DATA_PATH.sub(absolute, text)
    expected = _map_strings(yaml.safe_load(text), lambda value: EMBEDDED_DATA_PATH.sub(absolute, value))
    try:
        same = yaml.safe_load(rewritten) == expected
    except yaml.YAMLError:
        same = False
    if not same:
        raise InputError(
            f"{root / 'data'}: YAML cannot hold this path unquoted, so the copied recipe would not name "
            "the embedded data; install spanlm where its path has no ', ', ': ' or ' #'"
        )
    return rewritten


def _map_strings(value: Any, function: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return function(value)
    if isinstance(value, list):
        return [_map_strings(item, function) for item in value]
    if isinstance(value, dict):
        return {key: _map_strings(item, function) for key, item in value.items()}
    return value


def copy_destination(name: str, destination: str | Path) -> Path:
    """The file ``spanlm recipes copy NAME DEST`` writes: DEST, or the recipe's file name in DEST, a directory."""
    target = Path(destination)
    if target.is_dir() or str(destination).endswith(("/", os.sep)):
        target = target / find_recipe(name).path.name
    return target


def copy_recipe(name: str, destination: str | Path, force: bool = False) -> Path:
    """Write the shipped recipe ``name`` to ``destination`` (a file, or a directory to put it in, keeping its
    file name) with its embedded-data paths absolute; returns the file written.

    An existing file is replaced only with ``force``, and then in one rename, so it is never left half
    written.
    """
    recipe = find_recipe(name)
    target = copy_destination(name, destination)
    if target.exists() and not force:
        raise InputError(f"{target}: already exists (--force replaces it)")
    text = with_embedded_data_paths(recipe.path.read_text(encoding="utf-8"), shipped_root())
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
