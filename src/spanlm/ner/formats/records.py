"""The record every NER reader produces — :class:`NerDocument` (text + character spans, end exclusive) — the read
options, and the line / JSON / field helpers the readers share."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from spanlm.errors import numbered_lines, undecodable

Format = Literal["cluener", "conll", "jsonl", "nested_jsonl", "hf"]
FORMATS: tuple[str, ...] = ("cluener", "conll", "jsonl", "nested_jsonl", "hf")


@dataclasses.dataclass(frozen=True, order=True)
class Entity:
    start: int  # first character
    end: int  # one past the last character: the surface is text[start:end]
    label: str


@dataclasses.dataclass
class NerDocument:
    id: str
    text: str
    entities: list[Entity]


class BadRecord(Exception):
    """One record is malformed; raised inside a reader, turned into a skip or an InputError.

    ``token``: the (0-based) token of a tag sequence at fault; ``line``: the line at fault, where it is
    not the record's first (a CoNLL sentence spans several lines).
    """

    def __init__(self, message: str, token: int | None = None, line: int | None = None):
        super().__init__(message)
        self.token, self.line = token, line


@dataclasses.dataclass
class ReadOptions:
    """How a file is read (the data section of a NER recipe carries the same fields)."""

    format: Format | None = None  # of files; None: from the suffix (a dataset is always hf)
    labels: list[str] | None = None  # the label set; None accepts any label
    on_bad_record: Literal["error", "skip"] = "error"
    token_column: int = 0  # conll: the token column
    tag_columns: list[int] = dataclasses.field(
        default_factory=lambda: [-1]
    )  # conll: tag columns (several = nested levels)
    tag_scheme: Literal["bio", "bioes"] = "bio"  # conll
    conll_unit: Literal["sentence", "document"] = (
        "sentence"  # conll: one record per sentence, or per -DOCSTART- document
    )
    tokens_field: str = "tokens"  # hf: the column of token lists
    tags_field: str = "ner_tags"  # hf: the column of ClassLabel tag lists


def lines(path: Path) -> Iterator[tuple[int, str | BadRecord]]:
    """(line number, decoded line without its newline); undecodable lines come as a BadRecord."""
    for lineno, line in numbered_lines(path):
        yield lineno, BadRecord(undecodable(line)) if isinstance(line, UnicodeDecodeError) else line


def json_records(path: Path) -> Iterator[tuple[int, int, dict | BadRecord]]:
    """(line number, record index, JSON object) per non-blank line."""
    index = 0
    for lineno, line in lines(path):
        if isinstance(line, BadRecord):
            yield lineno, index, line
        elif line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                record = BadRecord(f"not valid JSON: {error.msg} at column {error.colno}")
            if not isinstance(record, (dict, BadRecord)):
                record = BadRecord(f"expected a JSON object, got {type(record).__name__}")
            yield lineno, index, record
        else:
            continue
        index += 1


def field(record: dict, name: str, kind: type, default=None):
    if name not in record:
        if default is not None:
            return default
        raise BadRecord(f"missing field {name!r}")
    value = record[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRecord(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def record_id(record: dict, index: int, *keys: str) -> str:
    for key in keys:
        if key in record and isinstance(record[key], (str, int)) and not isinstance(record[key], bool):
            return str(record[key])
    return str(index)


def guarded(
    records: Iterable[tuple[int, int, dict | BadRecord]], parse
) -> Iterator[tuple[int, NerDocument | BadRecord]]:
    for lineno, index, record in records:
        if isinstance(record, BadRecord):
            yield lineno, record
            continue
        try:
            yield lineno, parse(record, index)
        except BadRecord as problem:
            yield lineno, problem


def token_starts(tokens: list[str]) -> list[int]:
    """Character start of each token in ``" ".join(tokens)``."""
    starts, position = [], 0
    for token in tokens:
        starts.append(position)
        position += len(token) + 1
    return starts


def tokens_document(document_id: str, sentences: list[tuple[list[str], list[tuple[int, int, str]]]]) -> NerDocument:
    """Sentences of (tokens, token spans end exclusive) → one document: the tokens joined by single spaces,
    the spans as character offsets into that text."""
    tokens = [token for words, _ in sentences for token in words]
    starts = token_starts(tokens)
    entities, base = [], 0
    for words, spans in sentences:
        for s, e, label in spans:
            entities.append(Entity(starts[base + s], starts[base + e - 1] + len(tokens[base + e - 1]), label))
        base += len(words)
    return NerDocument(document_id, " ".join(tokens), sorted(set(entities)))
