"""Hugging Face `datasets` as inputs: a ``save_to_disk`` directory, or a name for ``load_dataset``.

A reference is one of

* a directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (recognised by its
  ``state.json`` or ``dataset_dict.json``); a DatasetDict's split is the caller's split setting;
* ``hf:NAME[@REVISION][:CONFIG][:SPLIT]`` — what ``datasets.load_dataset(NAME, CONFIG, split=SPLIT,
  revision=REVISION)`` loads: a Hub dataset id (``hf:Salesforce/wikitext:wikitext-2-raw-v1``) or a local
  directory of data files laid out as a dataset repository (``hf:./my_data``). An empty CONFIG is the
  default configuration (``hf:NAME::validation``); SPLIT may slice (``hf:NAME:CONFIG:train[:1000]``) and
  defaults to the caller's split setting; REVISION pins a commit, or reads the Hub's Parquet export of a
  dataset that still has a loading script (``hf:leondz/wnut_17@refs/convert/parquet``), which datasets no
  longer runs. With ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``) a Hub name loads from the local
  datasets cache, where an earlier online load left it.

Loaded splits stay memory-mapped Arrow tables; readers walk them in batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from spanlm.errors import InputError

if TYPE_CHECKING:  # datasets is imported lazily: it is slow to import and most runs read files
    import datasets

HF_PREFIX = "hf:"


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def is_dataset_reference(entry: str | Path) -> bool:
    return str(entry).startswith(HF_PREFIX) or is_saved_dataset(Path(entry))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclasses.dataclass
class DatasetSplit:
    """One split of a dataset reference, loaded (memory-mapped)."""

    reference: str  # as the user wrote it
    split: str | None  # None: a saved Dataset, which has no splits
    dataset: datasets.Dataset

    def __str__(self) -> str:
        return self.reference if self.split is None else f"{self.reference} (split {self.split})"

    def identity(self, by_content: bool) -> list:
        """What decides the rows (for a prepared directory's fingerprint), as a file's identity does.

        The rows are the split's Arrow files, cut by the split expression (``train[:1000]``): the files
        count by (path, size, modification time), or ``by_content`` by their SHA-256, which survives a
        copy or a move of the directory.
        """
        files = [Path(entry["filename"]) for entry in self.dataset.cache_files]
        if by_content:
            return ["dataset", self.split, self.dataset.num_rows, [file_sha256(path) for path in files]]
        stamps = [[str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns] for path in files]
        return ["dataset", self.reference, self.split, self.dataset.num_rows, stamps]

    def require_columns(self, *columns: str, setting: str) -> None:
        missing = [column for column in columns if column not in self.dataset.column_names]
        if missing:
            raise InputError(
                f"{self}: no column '{missing[0]}' (has: {', '.join(self.dataset.column_names)}); set {setting}"
            )


def load_split(reference: str, split: str, split_setting: str) -> DatasetSplit:
    """Load ``split`` of ``reference`` (the split written in an ``hf:`` reference wins).

    ``split_setting`` names the setting that chooses the split, for the error messages.
    Every failure is an :class:`InputError` naming the reference.
    """
    loaded = (
        _load_named(reference, split, split_setting)
        if reference.startswith(HF_PREFIX)
        else _load_saved(Path(reference), split, split_setting)
    )
    # Rows as plain Python values, whatever format (torch, numpy) the dataset was saved with.
    return dataclasses.replace(loaded, dataset=loaded.dataset.with_format(None))


def _load_saved(path: Path, split: str, split_setting: str) -> DatasetSplit:
    import datasets

    try:
        if not (path / "dataset_dict.json").is_file():
            return DatasetSplit(str(path), None, datasets.Dataset.load_from_disk(str(path)))
        splits = datasets.DatasetDict.load_from_disk(str(path))
    except (OSError, ValueError, KeyError, datasets.exceptions.DatasetsError) as error:
        raise InputError(f"{path}: not a readable save_to_disk dataset: {_one_line(error)}") from None
    if split not in splits:
        raise InputError(f"{path}: no split '{split}' (has: {', '.join(splits)}); set {split_setting}")
    return DatasetSplit(str(path), split, splits[split])


@dataclasses.dataclass(frozen=True)
class DatasetName:
    """The parts of ``hf:NAME[@REVISION][:CONFIG][:SPLIT]``; the ones left out are None."""

    name: str
    revision: str | None
    config: str | None
    split: str | None

    @classmethod
    def parse(cls, reference: str) -> DatasetName:
        name, _, rest = reference.removeprefix(HF_PREFIX).partition(":")
        name, _, revision = name.partition("@")
        config, _, split = rest.partition(":")  # the split keeps any colon of a slice (train[:10])
        if not name:
            raise InputError(f"{reference}: no dataset name (hf:NAME[@REVISION][:CONFIG][:SPLIT])")
        return cls(name, revision or None, config or None, split or None)


def _load_named(reference: str, split: str, split_setting: str) -> DatasetSplit:
    import datasets

    parts = DatasetName.parse(reference)
    name, split = parts.name, parts.split or split
    try:
        dataset = datasets.load_dataset(name, parts.config, split=split, revision=parts.revision)
    except ConnectionError:
        where = (
            "offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)"
            if datasets.config.HF_HUB_OFFLINE
            else "the Hugging Face Hub is unreachable"
        )
        raise InputError(
            f"{reference}: {where} and '{name}' is not in the local datasets cache "
            f"({datasets.config.HF_DATASETS_CACHE}); load it once online, or give a save_to_disk directory"
        ) from None
    except ValueError as error:  # an unknown split or configuration; datasets lists the known ones
        raise InputError(
            f"{reference}: {_one_line(error)} (the configuration comes from hf:NAME:CONFIG, "
            f"the split from hf:NAME:CONFIG:SPLIT or {split_setting})"
        ) from None
    except RuntimeError as error:  # "Dataset scripts are no longer supported"
        raise InputError(
            f"{reference}: cannot load '{name}' with datasets.load_dataset: {_one_line(error)} (a Hub "
            "dataset with a loading script may load from its Parquet export: hf:NAME@refs/convert/parquet)"
        ) from None
    except (OSError, datasets.exceptions.DatasetsError) as error:
        raise InputError(f"{reference}: cannot load '{name}' with datasets.load_dataset: {_one_line(error)}") from None
    return DatasetSplit(reference, split, dataset)


def _one_line(error: BaseException) -> str:
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
