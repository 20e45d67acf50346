"""NER data formats → one record type, :class:`NerDocument` (text + character spans, end exclusive).

Every reader validates at the edge and reports problems as ``file:line: problem``:

* ``cluener`` — CLUENER2020 JSON lines ``{"text", "label": {type: {surface: [[start, end], …]}}}`` with
  **inclusive** ends; ``text[start:end + 1]`` must equal the surface.
* ``conll`` — whitespace-separated columns, one token per line, blank line between sentences,
  ``-DOCSTART-`` lines between documents; BIO (IOB2) or BIOES tags in one or several tag columns (several
  columns = nested levels, e.g. GermEval 2014's outer and inner). The text is rebuilt by joining the
  tokens with single spaces and the character offsets are computed from it. A line holding only
  whitespace (WNUT-17 uses a lone tab) separates sentences like an empty one.
* ``jsonl`` — spanlm's own format, ``{"text", "entities": [{"start", "end", "label"}], "id"?}``, end
  exclusive; ``ner predict`` writes it (with ``text`` and ``score`` per entity, checked when present).
* ``nested_jsonl`` — token-level nested jsonlines as in yhcc/CNN_Nested_NER's GENIA files:
  ``{"tokens", "entity_mentions" | "entities": [{"start", "end", "entity_type" | "type" | "label",
  "text"?}], "sent_id"?}``, token ends exclusive; the text is the tokens joined by single spaces.
* ``hf`` — a Hugging Face NER dataset in the layout of the Hub's conll2003 / wnut_17: a list of tokens
  and a list of integer tags with ``ClassLabel`` names (BIO, or BIOES when the names have ``E-`` / ``S-``)
  per row, as a ``save_to_disk`` directory or an ``hf:NAME[@REVISION][:CONFIG][:SPLIT]`` name
  (:mod:`spanlm.data.hf_datasets`); one record per row, its text built as for ``conll``.

A malformed record (broken JSON, missing fields, offsets out of range, span text that does not match,
an unknown label, a broken BIO sequence, a wrong column count) is skipped and counted with
``on_bad_record: skip``, or stops reading with an :class:`InputError` naming file and line (a dataset's
split and row) with ``on_bad_record: error``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from spanlm.data.hf_datasets import DatasetSplit, is_dataset_reference, load_split
from spanlm.errors import InputError, numbered_lines, require_file, undecodable

Format = Literal["cluener", "conll", "jsonl", "nested_jsonl", "hf"]
FORMATS: tuple[str, ...] = ("cluener", "conll", "jsonl", "nested_jsonl", "hf")
_SUFFIX_FORMATS = {
    ".json": "cluener",
    ".jsonl": "jsonl",
    ".jsonlines": "nested_jsonl",
    ".conll": "conll",
    ".txt": "conll",
    ".iob2": "conll",
    ".bio": "conll",
    ".bioes": "conll",
    ".tsv": "conll",
}


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


@dataclasses.dataclass
class ReadReport:
    """What reading one file found: records read and the malformed ones skipped (file:line, problem)."""

    path: str
    records: int = 0
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def summary(self) -> dict:
        return {"file": self.path, "records": self.records, "skipped_records": len(self.skipped)}

    def lines(self, limit: int = 5) -> list[str]:
        if not self.skipped:
            return []
        cases = "; ".join(f"{where}: {why}" for where, why in self.skipped[:limit])
        more = f" (and {len(self.skipped) - limit} more)" if len(self.skipped) > limit else ""
        return [f"{self.path}: skipped {len(self.skipped)} malformed record(s): {cases}{more}"]


class _BadRecord(Exception):
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


def guess_format(path: str | Path) -> str:
    """The format an input suggests: ``hf`` for a dataset (an ``hf:`` name or a ``save_to_disk``
    directory), else its suffix's (``.json`` CLUENER, ``.jsonl`` spanlm spans, ``.jsonlines`` nested
    tokens, ``.conll`` / ``.txt`` / ``.iob2`` / ``.tsv`` columns)."""
    if is_dataset_reference(path):
        return "hf"
    fmt = _SUFFIX_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InputError(f"{path}: cannot tell the NER format from the suffix; pass one of {', '.join(FORMATS)}")
    return fmt


def input_format(path: str | Path, options: ReadOptions) -> str:
    """``hf`` for a dataset, whatever ``options.format`` says (a recipe's format is its files'; a dataset
    has only the one), else ``options.format`` or the one the suffix suggests."""
    if is_dataset_reference(path):
        return "hf"
    return options.format or guess_format(path)


def read_documents(
    path: str | Path, options: ReadOptions, split: str = "train", split_setting: str = "data.train_split"
) -> tuple[list[NerDocument], ReadReport]:
    """Every well-formed record of ``path`` as a :class:`NerDocument`, and the report of what was skipped.

    ``split``: the split a dataset input is read from, unless its ``hf:`` reference names one
    (``split_setting`` names the setting that chooses it, for the error messages).
    """
    fmt = input_format(path, options)
    readers = {"cluener": _cluener, "jsonl": _jsonl, "nested_jsonl": _nested_jsonl, "conll": _conll}
    if fmt == "hf":
        dataset = load_split(str(path), split, split_setting)
        source, records, where_prefix = str(dataset), _hf_records(dataset, options), f"{dataset} row "
    else:
        path = Path(path)
        require_file(path)
        if fmt not in readers:
            raise InputError(f"{path}: unknown NER format {fmt!r} (one of {', '.join(FORMATS)})")
        source, records, where_prefix = str(path), readers[fmt](path, options), f"{path}:"
    report = ReadReport(source)
    labels = set(options.labels) if options.labels is not None else None
    documents = []
    for lineno, parsed in records:
        report.records += 1
        try:
            if isinstance(parsed, _BadRecord):
                raise parsed
            _check(parsed, labels)
        except _BadRecord as problem:
            where = f"{where_prefix}{lineno}"
            if options.on_bad_record == "error":
                raise InputError(
                    f"{where}: {problem} (on_bad_record: skip skips such records and counts them)"
                ) from None
            report.skipped.append((where, str(problem)))
            continue
        documents.append(parsed)
    return documents, report


def read_texts(path: str | Path) -> list[NerDocument]:
    """``ner predict`` input, without entities: a ``.jsonl`` file's ``text`` (and ``id``) per record (blank
    texts too: one output line per record), all else in a record (gold entities included) ignored; any
    other file one document per non-blank line, its line number as id. A malformed record or line
    stops reading with an :class:`InputError` naming file and line.
    """
    path = Path(path)
    require_file(path)
    jsonl = path.suffix.lower() == ".jsonl"

    def text_only(record: dict, index: int) -> NerDocument:
        return NerDocument(_record_id(record, index, "id"), _field(record, "text", str), [])

    if jsonl:
        numbered = _guarded(_json_records(path), text_only)
    else:
        numbered = (
            (lineno, NerDocument(str(lineno), line, []) if isinstance(line, str) else line)
            for lineno, line in _lines(path)
        )
    documents = []
    for lineno, parsed in numbered:
        if isinstance(parsed, _BadRecord):
            raise InputError(f"{path}:{lineno}: {parsed}")
        if jsonl or parsed.text.strip():  # every record; non-blank lines
            documents.append(parsed)
    return documents


def _check(document: NerDocument, labels: set[str] | None) -> None:
    n = len(document.text)
    for entity in document.entities:
        if not 0 <= entity.start < entity.end <= n:
            raise _BadRecord(
                f"entity [{entity.start}, {entity.end}) {entity.label!r} is out of range for a text of {n} characters"
            )
        if labels is not None and entity.label not in labels:
            raise _BadRecord(f"unknown label {entity.label!r} (known: {', '.join(sorted(labels))})")


def _lines(path: Path) -> Iterator[tuple[int, str | _BadRecord]]:
    """(line number, decoded line without its newline); undecodable lines come as a _BadRecord."""
    for lineno, line in numbered_lines(path):
        yield lineno, _BadRecord(undecodable(line)) if isinstance(line, UnicodeDecodeError) else line


def _json_records(path: Path) -> Iterator[tuple[int, int, dict | _BadRecord]]:
    """(line number, record index, JSON object) per non-blank line."""
    index = 0
    for lineno, line in _lines(path):
        if isinstance(line, _BadRecord):
            yield lineno, index, line
        elif line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                record = _BadRecord(f"not valid JSON: {error.msg} at column {error.colno}")
            if not isinstance(record, (dict, _BadRecord)):
                record = _BadRecord(f"expected a JSON object, got {type(record).__name__}")
            yield lineno, index, record
        else:
            continue
        index += 1


def _field(record: dict, name: str, kind: type, default=None):
    if name not in record:
        if default is not None:
            return default
        raise _BadRecord(f"missing field {name!r}")
    value = record[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _BadRecord(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _record_id(record: dict, index: int, *keys: str) -> str:
    for key in keys:
        if key in record and isinstance(record[key], (str, int)) and not isinstance(record[key], bool):
            return str(record[key])
    return str(index)


def _guarded(
    records: Iterable[tuple[int, int, dict | _BadRecord]], parse
) -> Iterator[tuple[int, NerDocument | _BadRecord]]:
    for lineno, index, record in records:
        if isinstance(record, _BadRecord):
            yield lineno, record
            continue
        try:
            yield lineno, parse(record, index)
        except _BadRecord as problem:
            yield lineno, problem


def _cluener(path: Path, options: ReadOptions):
    def parse(record: dict, index: int) -> NerDocument:
        text = _field(record, "text", str)
        entities = []
        for label, surfaces in _field(record, "label", dict, default={}).items():
            if not isinstance(surfaces, dict):
                raise _BadRecord(
                    f"label {label!r} must map surfaces to [[start, end], …], got {type(surfaces).__name__}"
                )
            for surface, spans in surfaces.items():
                if not isinstance(spans, list):
                    raise _BadRecord(f"{label}/{surface!r}: spans must be a list of [start, end]")
                for span in spans:
                    if not (
                        isinstance(span, list)
                        and len(span) == 2
                        and all(isinstance(v, int) and not isinstance(v, bool) for v in span)
                    ):
                        raise _BadRecord(f"{label}/{surface!r}: span {span!r} is not [start, end]")
                    start, end = span[0], span[1] + 1  # CLUENER ends are inclusive
                    if not 0 <= start < end <= len(text):
                        raise _BadRecord(
                            f"{label}/{surface!r}: span {span} is out of range for a text of {len(text)} characters"
                        )
                    if text[start:end] != surface:
                        raise _BadRecord(f"{label}: span {span} reads {text[start:end]!r}, not {surface!r}")
                    entities.append(Entity(start, end, label))
        return NerDocument(_record_id(record, index, "id"), text, sorted(entities))

    return _guarded(_json_records(path), parse)


def _jsonl(path: Path, options: ReadOptions):
    def parse(record: dict, index: int) -> NerDocument:
        text = _field(record, "text", str)
        entities = []
        for item in _field(record, "entities", list, default=[]):
            if not isinstance(item, dict):
                raise _BadRecord(f"entity {item!r} must be an object with start, end and label")
            start, end, label = _field(item, "start", int), _field(item, "end", int), _field(item, "label", str)
            if not 0 <= start < end <= len(text):
                raise _BadRecord(
                    f"entity [{start}, {end}) {label!r} is out of range for a text of {len(text)} characters"
                )
            if "text" in item and text[start:end] != item["text"]:
                raise _BadRecord(f"entity [{start}, {end}) reads {text[start:end]!r}, not {item['text']!r}")
            entities.append(Entity(start, end, label))
        return NerDocument(_record_id(record, index, "id"), text, sorted(entities))

    return _guarded(_json_records(path), parse)


def _token_starts(tokens: list[str]) -> list[int]:
    """Character start of each token in ``" ".join(tokens)``."""
    starts, position = [], 0
    for token in tokens:
        starts.append(position)
        position += len(token) + 1
    return starts


def _nested_jsonl(path: Path, options: ReadOptions):
    def parse(record: dict, index: int) -> NerDocument:
        tokens = _field(record, "tokens", list)
        if not all(isinstance(token, str) for token in tokens):
            raise _BadRecord("field 'tokens' must be a list of strings")
        key = "entity_mentions" if "entity_mentions" in record else "entities"
        text, starts = " ".join(tokens), _token_starts(tokens)
        entities = []
        for item in _field(record, key, list, default=[]):
            if not isinstance(item, dict):
                raise _BadRecord(f"mention {item!r} must be an object with start, end and a type")
            start, end = _field(item, "start", int), _field(item, "end", int)
            type_key = next((k for k in ("entity_type", "type", "label") if k in item), "entity_type")
            label = _field(item, type_key, str)
            if not 0 <= start < end <= len(tokens):
                raise _BadRecord(f"mention tokens [{start}, {end}) {label!r} are out of range for {len(tokens)} tokens")
            if "text" in item and " ".join(tokens[start:end]) != item["text"]:
                raise _BadRecord(
                    f"mention tokens [{start}, {end}) read {' '.join(tokens[start:end])!r}, not {item['text']!r}"
                )
            entities.append(Entity(starts[start], starts[end - 1] + len(tokens[end - 1]), label))
        return NerDocument(_record_id(record, index, "sent_id", "id"), text, sorted(entities))

    return _guarded(_json_records(path), parse)


def tags_to_spans(tags: list[str], scheme: str) -> list[tuple[int, int, str]]:
    """BIO (IOB2) / BIOES tags → token spans (start, end exclusive, label); raises _BadRecord when broken.

    Strict: an entity starts only at ``B-`` (or ``S-``); ``I-X`` must continue an open ``X`` (no IOB1
    reading), and in BIOES an entity must close with ``E-`` (or be a single ``S-``).
    """
    spans, open_start, open_label = [], None, None
    inside = ("I", "E") if scheme == "bioes" else ("I",)
    for i, tag in enumerate(tags):
        if tag == "O":
            prefix, label = "O", None
        else:
            prefix, _, label = tag.partition("-")
            if prefix not in ("B", "I", "E", "S") or not label or (scheme == "bio" and prefix in ("E", "S")):
                raise _BadRecord(f"token {i + 1}: tag {tag!r} is not a {scheme.upper()} tag", token=i)
        if prefix in inside:
            if open_label != label:
                raise _BadRecord(
                    f"token {i + 1}: {tag} does not continue an open {label} entity ({scheme.upper()} is broken)",
                    token=i,
                )
            if prefix == "E":
                spans.append((open_start, i + 1, label))
                open_start = open_label = None
            continue
        if open_label is not None:
            if scheme == "bioes":
                raise _BadRecord(
                    f"token {i + 1}: {tag} follows an unclosed {open_label} entity (BIOES needs E-{open_label})",
                    token=i,
                )
            spans.append((open_start, i, open_label))
            open_start = open_label = None
        if prefix == "B":
            open_start, open_label = i, label
        elif prefix == "S":
            spans.append((i, i + 1, label))
    if open_label is not None:
        if scheme == "bioes":
            raise _BadRecord(
                f"the sentence ends inside an unclosed {open_label} entity (BIOES needs E-{open_label})",
                token=len(tags) - 1,
            )
        spans.append((open_start, len(tags), open_label))
    return spans


def _conll_sentences(path: Path) -> Iterator[tuple[int, list[list[str]] | _BadRecord, bool]]:
    """(first line, rows of columns, starts a new document) per sentence; -DOCSTART- lines open documents."""
    rows, first, new_document, broken = [], 0, True, None
    for lineno, line in _lines(path):
        if isinstance(line, _BadRecord):
            broken = broken or _BadRecord(str(line), line=lineno)
            first = first or lineno
            continue
        columns = line.split()
        if not columns or columns[0] == "-DOCSTART-":
            if rows or broken:
                yield first, broken or rows, new_document
                new_document = False
            rows, first, broken = [], 0, None
            new_document = new_document or bool(columns)
            continue
        first = first or lineno
        rows.append(columns)
    if rows or broken:
        yield first, broken or rows, new_document


def _conll(path: Path, options: ReadOptions):
    def sentence(rows: list[list[str]]) -> tuple[list[str], list[tuple[int, int, str]]]:
        wanted = (options.token_column, *options.tag_columns)
        for offset, columns in enumerate(rows):
            # Negative columns count from the end, so a short line could make the token its own tag.
            if not all(-len(columns) <= c < len(columns) for c in wanted) or len(
                {c % len(columns) for c in wanted}
            ) < len(wanted):
                raise _BadRecord(
                    f"token {offset + 1} has {len(columns)} column(s); token_column={options.token_column} "
                    f"and tag_columns={options.tag_columns} do not fit",
                    token=offset,
                )
        spans = []
        for column in options.tag_columns:
            spans.extend(tags_to_spans([columns[column] for columns in rows], options.tag_scheme))
        return [columns[options.token_column] for columns in rows], spans

    # document unit: a malformed sentence is the skipped record; the rest of its document is kept.
    index, pending, pending_line = 0, [], 0
    for lineno, rows, new_document in _conll_sentences(path):
        if options.conll_unit == "document" and new_document and pending:
            yield pending_line, tokens_document(str(index), pending)
            index, pending = index + 1, []
        try:
            if isinstance(rows, _BadRecord):
                raise rows
            parsed = sentence(rows)
        except _BadRecord as problem:  # named by the line at fault: a sentence's rows are consecutive lines
            yield problem.line or lineno + (problem.token or 0), problem
            continue
        if options.conll_unit == "sentence":
            yield lineno, tokens_document(str(index), [parsed])
            index += 1
        else:
            pending_line = pending_line if pending else lineno
            pending.append(parsed)
    if pending:
        yield pending_line, tokens_document(str(index), pending)


def tokens_document(document_id: str, sentences: list[tuple[list[str], list[tuple[int, int, str]]]]) -> NerDocument:
    """Sentences of (tokens, token spans end exclusive) → one document: the tokens joined by single spaces,
    the spans as character offsets into that text."""
    tokens = [token for words, _ in sentences for token in words]
    starts = _token_starts(tokens)
    entities, base = [], 0
    for words, spans in sentences:
        for s, e, label in spans:
            entities.append(Entity(starts[base + s], starts[base + e - 1] + len(tokens[base + e - 1]), label))
        base += len(words)
    return NerDocument(document_id, " ".join(tokens), sorted(set(entities)))


HF_BATCH_ROWS = 1000  # rows of a dataset in memory at once


def _hf_records(data: DatasetSplit, options: ReadOptions) -> Iterator[tuple[int, NerDocument | _BadRecord]]:
    """(row number from 1, document) per row of a token-classification dataset split."""
    import datasets

    tokens_field, tags_field = options.tokens_field, options.tags_field
    data.require_columns(tokens_field, tags_field, setting="data.tokens_field / data.tags_field")
    features = data.dataset.features

    def items(column: str):  # the feature of a list column's items, or None when it is no list
        feature = features[column]
        return feature.feature if isinstance(feature, (datasets.List, datasets.LargeList)) else None

    if items(tokens_field) != datasets.Value("string"):
        raise InputError(
            f"{data}: column '{tokens_field}' holds {features[tokens_field]}, not lists of strings; set "
            "data.tokens_field"
        )
    tag_names = items(tags_field)
    if not isinstance(tag_names, datasets.ClassLabel):
        raise InputError(
            f"{data}: column '{tags_field}' holds {features[tags_field]}, not lists of ClassLabel tags "
            "(integers with names); set data.tags_field"
        )
    names = tag_names.names
    not_tags = [name for name in names if name != "O" and not (name[:2] in ("B-", "I-", "E-", "S-") and name[2:])]
    if not_tags:
        raise InputError(
            f"{data}: column '{tags_field}' has ClassLabel names that are not BIO / BIOES tags: "
            f"{', '.join(map(repr, not_tags[:5]))}"
        )
    scheme = "bioes" if any(name[:2] in ("E-", "S-") for name in names) else "bio"
    has_id = "id" in data.dataset.column_names
    columns = [tokens_field, tags_field, *(["id"] if has_id else [])]
    row = 0
    for batch in data.dataset.select_columns(columns).iter(batch_size=HF_BATCH_ROWS):
        for i, (tokens, tags) in enumerate(zip(batch[tokens_field], batch[tags_field])):
            row += 1
            try:
                if len(tokens) != len(tags):
                    raise _BadRecord(f"{len(tokens)} tokens but {len(tags)} tags")
                if not all(0 <= tag < len(names) for tag in tags):  # ClassLabel stores -1 for "no label"
                    raise _BadRecord(f"tag ids {tags} are not all in [0, {len(names)})")
                spans = tags_to_spans([names[tag] for tag in tags], scheme)
                yield row, tokens_document(str(batch["id"][i]) if has_id else str(row - 1), [(tokens, spans)])
            except _BadRecord as problem:
                yield row, problem


def label_set(documents: Iterable[NerDocument]) -> list[str]:
    """The sorted labels that occur in ``documents``."""
    return sorted({entity.label for document in documents for entity in document.entities})


def document_record(document: NerDocument, scores: list[float] | None = None) -> dict:
    """The JSONL line of a document: ``{"id", "text", "entities": [{"start", "end", "label", "text"(, "score")}]}``."""
    entities = []
    for i, entity in enumerate(document.entities):
        item = {
            "start": entity.start,
            "end": entity.end,
            "label": entity.label,
            "text": document.text[entity.start : entity.end],
        }
        if scores is not None:
            item["score"] = round(float(scores[i]), 4)
        entities.append(item)
    return {"id": document.id, "text": document.text, "entities": entities}


def write_jsonl(path: str | Path, documents: Iterable[NerDocument]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for document in documents:
            handle.write(json.dumps(document_record(document), ensure_ascii=False) + "\n")
