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
from collections.abc import Iterable
from pathlib import Path

from spanlm.data.hf_datasets import is_dataset_reference, load_split
from spanlm.errors import InputError, require_file
from spanlm.ner.formats.conll import conll, tags_to_spans
from spanlm.ner.formats.hf import hf_records
from spanlm.ner.formats.json_lines import cluener, jsonl, nested_jsonl
from spanlm.ner.formats.records import (
    FORMATS,
    BadRecord,
    Entity,
    Format,
    NerDocument,
    ReadOptions,
    field,
    guarded,
    json_records,
    lines,
    record_id,
    tokens_document,
)

# The names other modules import from here.
__all__ = [
    "FORMATS",
    "Entity",
    "Format",
    "NerDocument",
    "ReadOptions",
    "ReadReport",
    "document_record",
    "guess_format",
    "input_format",
    "label_set",
    "read_documents",
    "read_texts",
    "tags_to_spans",
    "tokens_document",
    "write_jsonl",
]
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
    readers = {"cluener": cluener, "jsonl": jsonl, "nested_jsonl": nested_jsonl, "conll": conll}
    if fmt == "hf":
        dataset = load_split(str(path), split, split_setting)
        source, records, where_prefix = str(dataset), hf_records(dataset, options), f"{dataset} row "
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
            if isinstance(parsed, BadRecord):
                raise parsed
            _check(parsed, labels)
        except BadRecord as problem:
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
        return NerDocument(record_id(record, index, "id"), field(record, "text", str), [])

    if jsonl:
        numbered = guarded(json_records(path), text_only)
    else:
        numbered = (
            (lineno, NerDocument(str(lineno), line, []) if isinstance(line, str) else line)
            for lineno, line in lines(path)
        )
    documents = []
    for lineno, parsed in numbered:
        if isinstance(parsed, BadRecord):
            raise InputError(f"{path}:{lineno}: {parsed}")
        if jsonl or parsed.text.strip():  # every record; non-blank lines
            documents.append(parsed)
    return documents


def _check(document: NerDocument, labels: set[str] | None) -> None:
    n = len(document.text)
    for entity in document.entities:
        if not 0 <= entity.start < entity.end <= n:
            raise BadRecord(
                f"entity [{entity.start}, {entity.end}) {entity.label!r} is out of range for a text of {n} characters"
            )
        if labels is not None and entity.label not in labels:
            raise BadRecord(f"unknown label {entity.label!r} (known: {', '.join(sorted(labels))})")


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
