"""Labelled sentences and sentence pairs: GLUE TSV files, CLUE JSON lines, generic JSON lines / CSV and 🤗 datasets.

Every reader yields :class:`Example` (text, optional pair, label, where it came from) and refuses a bad record with
one line naming the file, the line and the field. GLUE TSV files are read as the GLUE baselines read them: tab
separated, no quoting (``csv.QUOTE_NONE``: the sentences hold bare ``"``), a leading UTF-8 BOM dropped (MRPC),
CoLA without a header row.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from spanlm.cls.tasks import TASKS, Layout
from spanlm.errors import ConfigError, InputError, numbered_lines, require_file, undecodable

if TYPE_CHECKING:  # the recipe's types load torch; the readers need only its fields
    from spanlm.cls.config import ClsDataConfig


_SUFFIX_FORMATS = {".tsv": "glue", ".json": "jsonl", ".jsonl": "jsonl", ".csv": "csv"}
HF_BATCH_ROWS = 1000  # rows of a dataset in memory at once


@dataclasses.dataclass(frozen=True)
class Example:
    text: str
    text_pair: str | None
    label: str | float | None  # a class name, a regression target, or None (no label: prediction)
    where: str  # file:line (or dataset row) for messages


@dataclasses.dataclass(frozen=True)
class Fields:
    """The resolved reading of one input: its format and where each field is."""

    format: str
    text: str | int
    pair: str | int | None
    label: str | int
    header: bool = True
    skip_labels: tuple[str, ...] = ()


def layout_of(data: ClsDataConfig) -> Layout | None:
    if data.task is None:
        return None
    if data.task not in TASKS:
        raise ConfigError(f"data.task: unknown task {data.task!r}; one of {', '.join(TASKS)} (or null: by field names)")
    return TASKS[data.task]


def fields_of(path: str, data: ClsDataConfig) -> Fields:
    """How ``path`` is read under ``data``: a task's layout, or the named fields in the format its suffix says."""
    from spanlm.data.hf_datasets import is_dataset_reference

    layout = layout_of(data)
    if is_dataset_reference(path) or data.format == "hf":
        # A dataset names its columns: the recipe's field names (a GLUE dataset on the Hub: sentence / sentence1 …).
        return Fields("hf", data.text_field, data.text_pair_field, data.label_field)
    if layout is not None and data.format in ("auto", layout.format):
        return Fields(layout.format, layout.text, layout.pair, layout.label, layout.header, layout.skip_labels)
    fmt = data.format if data.format != "auto" else _SUFFIX_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InputError(
            f"{path}: cannot tell the format from the suffix; set data.format (glue, clue, jsonl, csv or hf)"
        )
    if fmt in ("glue", "clue") and layout is None:
        raise InputError(f"{path}: a {fmt.upper()} file needs data.task (its column layout): one of {', '.join(TASKS)}")
    return Fields(fmt, data.text_field, data.text_pair_field, data.label_field)


def read_examples(
    path: str, data: ClsDataConfig, regression: bool, split: str, split_setting: str, labelled: bool = True
) -> list[Example]:
    """Every example of ``path``; ``labelled``: each must have a label (a number for ``regression``)."""
    if not path:
        raise InputError("no input file given")
    fields = fields_of(path, data)
    if fields.format == "hf":
        records = _hf_records(path, fields, split, split_setting)
    else:
        require_file(path)
        records = {"glue": _tsv_records, "csv": _csv_records}.get(fields.format, _json_records)(Path(path), fields)
    examples = []
    for where, get in records:
        text = _text(get, fields.text, where, "text", fields.format)
        pair = _text(get, fields.pair, where, "text pair", fields.format) if fields.pair is not None else None
        label = get(fields.label) if labelled else None
        if labelled:
            if label is None:
                raise InputError(f"{where}: no label ({_name(fields.label, fields.format)})")
            label = _label(label, regression, where, _name(fields.label, fields.format))
            if label in fields.skip_labels:
                continue
        examples.append(Example(text, pair, label, where))
    if not examples:
        raise InputError(f"{path}: no example")
    return examples


def _name(field: str | int, fmt: str = "jsonl") -> str:
    if isinstance(field, int):
        return f"column {field + 1}"
    return f"column '{field}'" if fmt in ("glue", "csv") else f"field '{field}'"


def _text(get, field, where: str, what: str, fmt: str) -> str:
    value = get(field)
    if value is None:
        raise InputError(f"{where}: no {what} ({_name(field, fmt)})")
    if not isinstance(value, str):
        raise InputError(f"{where}: {_name(field, fmt)} must be a string, got {json.dumps(value)[:40]}")
    return value.strip()


def _label(value, regression: bool, where: str, name: str) -> str | float:
    if regression:
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise InputError(f"{where}: {name} must be a number for a regression task, got {json.dumps(value)[:40]}")
        return number
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"{where}: {name} must be a class name or id, got {json.dumps(value)[:40]}")
    return str(value).strip()


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in numbered_lines(path):
        if isinstance(line, UnicodeDecodeError):
            raise InputError(f"{path}:{number}: {undecodable(line)}")
        if line.strip():
            yield number, line


def _tsv_records(path: Path, fields: Fields):
    """GLUE TSV rows: tab-separated, no quoting, a header row unless the layout has none (CoLA)."""
    lines = _lines(path)
    columns: dict[str, int] = {}
    if fields.header:
        first = next(lines, None)
        if first is None:
            return
        columns = {name.strip(): index for index, name in enumerate(first[1].split("\t"))}
        for field in (fields.text, fields.pair):
            if field is not None and field not in columns:
                raise InputError(f"{path}:{first[0]}: no column '{field}' in the header ({', '.join(columns)})")
    for number, line in lines:
        cells = next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE))
        where = f"{path}:{number}"

        def get(field, cells=cells):
            index = field if isinstance(field, int) else columns.get(field)
            return cells[index] if index is not None and index < len(cells) else None

        yield where, get


def _csv_records(path: Path, fields: Fields):
    lines = ((number, line) for number, line in _lines(path))
    first = next(lines, None)
    if first is None:
        return
    header = next(csv.reader([first[1]]))
    for number, line in lines:
        cells = next(csv.reader([line]))
        record = dict(zip(header, cells))
        yield f"{path}:{number}", record.get


def _json_records(path: Path, fields: Fields):
    for number, line in _lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: not valid JSON: {error.msg}") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}:{number}: a record must be a JSON object")
        yield f"{path}:{number}", record.get


def _hf_records(reference: str, fields: Fields, split: str, split_setting: str):
    from spanlm.data.hf_datasets import load_split

    data = load_split(reference, split, split_setting)
    wanted = [f for f in (fields.text, fields.pair) if f is not None]
    data.require_columns(*wanted, setting="data.text_field / data.text_pair_field")
    names = None
    feature = data.dataset.features.get(fields.label)
    if feature is not None and hasattr(feature, "names"):  # a ClassLabel: ids stand for names; -1 is "no label"
        names = feature.names
    for first in range(0, data.dataset.num_rows, HF_BATCH_ROWS):
        rows = data.dataset[first : first + HF_BATCH_ROWS]
        for offset in range(len(next(iter(rows.values())))):
            record = {name: column[offset] for name, column in rows.items()}
            if names is not None and fields.label in record:
                label = record[fields.label]
                record[fields.label] = names[label] if isinstance(label, int) and 0 <= label < len(names) else None
            yield f"{data} row {first + offset}", record.get


def label_set(examples: list[Example]) -> list[str]:
    """The labels of ``examples``, sorted (numerically when every one is an integer, as GLUE's 0 / 1)."""
    labels = {e.label for e in examples}
    if all(isinstance(label, str) and label.lstrip("-").isdigit() for label in labels):
        return sorted(labels, key=int)
    return sorted(labels)


def check_labels(examples: list[Example], labels: list[str]) -> None:
    """Every example's label is one of ``labels`` (the classes training knows), else the first that is not."""
    known = set(labels)
    for example in examples:
        if example.label not in known:
            raise InputError(
                f"{example.where}: label {example.label!r} is not one of the run's labels "
                f"({', '.join(labels)}: data.labels, or the training data's); list it in data.labels to train on it"
            )


def read_texts(path: str) -> list[Example]:
    """Unlabelled inputs of ``cls predict``: JSON lines ``{"text", "text_pair"?}`` or a text file, one per line."""
    require_file(path)
    examples = []
    if Path(path).suffix.lower() in (".jsonl", ".json"):
        for where, get in _json_records(Path(path), Fields("jsonl", "text", "text_pair", "label")):
            text = _text(get, "text", where, "text", "jsonl")
            pair = _text(get, "text_pair", where, "text pair", "jsonl") if get("text_pair") is not None else None
            examples.append(Example(text, pair, None, where))
    else:
        for number, line in _lines(Path(path)):
            examples.append(Example(line.strip(), None, None, f"{path}:{number}"))
    return examples
