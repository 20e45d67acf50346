"""JSON-lines NER formats: CLUENER2020 (inclusive ends), spanlm's own spans, and token-level nested jsonlines."""

from __future__ import annotations

from pathlib import Path

from spanlm.ner.formats.records import (
    BadRecord,
    Entity,
    NerDocument,
    ReadOptions,
    field,
    guarded,
    json_records,
    record_id,
    token_starts,
)


def cluener(path: Path, options: ReadOptions):
    def parse(record: dict, index: int) -> NerDocument:
        text = field(record, "text", str)
        entities = []
        for label, surfaces in field(record, "label", dict, default={}).items():
            if not isinstance(surfaces, dict):
                raise BadRecord(
                    f"label {label!r} must map surfaces to [[start, end], …], got {type(surfaces).__name__}"
                )
            for surface, spans in surfaces.items():
                if not isinstance(spans, list):
                    raise BadRecord(f"{label}/{surface!r}: spans must be a list of [start, end]")
                for span in spans:
                    if not (
                        isinstance(span, list)
                        and len(span) == 2
                        and all(isinstance(v, int) and not isinstance(v, bool) for v in span)
                    ):
                        raise BadRecord(f"{label}/{surface!r}: span {span!r} is not [start, end]")
                    start, end = span[0], span[1] + 1  # CLUENER ends are inclusive
                    if not 0 <= start < end <= len(text):
                        raise BadRecord(
                            f"{label}/{surface!r}: span {span} is out of range for a text of {len(text)} characters"
                        )
                    if text[start:end] != surface:
                        raise BadRecord(f"{label}: span {span} reads {text[start:end]!r}, not {surface!r}")
                    entities.append(Entity(start, end, label))
        return NerDocument(record_id(record, index, "id"), text, sorted(entities))

    return guarded(json_records(path), parse)


def jsonl(path: Path, options: ReadOptions):
    def parse(record: dict, index: int) -> NerDocument:
        text = field(record, "text", str)
        entities = []
        for item in field(record, "entities", list, default=[]):
            if not isinstance(item, dict):
                raise BadRecord(f"entity {item!r} must be an object with start, end and label")
            start, end, label = field(item, "start", int), field(item, "end", int), field(item, "label", str)
            if not 0 <= start < end <= len(text):
                raise BadRecord(
                    f"entity [{start}, {end}) {label!r} is out of range for a text of {len(text)} characters"
                )
            if "text" in item and text[start:end] != item["text"]:
                raise BadRecord(f"entity [{start}, {end}) reads {text[start:end]!r}, not {item['text']!r}")
            entities.append(Entity(start, end, label))
        return NerDocument(record_id(record, index, "id"), text, sorted(entities))

    return guarded(json_records(path), parse)


def nested_jsonl(path: Path, options: ReadOptions):
    def parse(record: dict, index: int) -> NerDocument:
        tokens = field(record, "tokens", list)
        if not all(isinstance(token, str) for token in tokens):
            raise BadRecord("field 'tokens' must be a list of strings")
        key = "entity_mentions" if "entity_mentions" in record else "entities"
        text, starts = " ".join(tokens), token_starts(tokens)
        entities = []
        for item in field(record, key, list, default=[]):
            if not isinstance(item, dict):
                raise BadRecord(f"mention {item!r} must be an object with start, end and a type")
            start, end = field(item, "start", int), field(item, "end", int)
            type_key = next((k for k in ("entity_type", "type", "label") if k in item), "entity_type")
            label = field(item, type_key, str)
            if not 0 <= start < end <= len(tokens):
                raise BadRecord(f"mention tokens [{start}, {end}) {label!r} are out of range for {len(tokens)} tokens")
            if "text" in item and " ".join(tokens[start:end]) != item["text"]:
                raise BadRecord(
                    f"mention tokens [{start}, {end}) read {' '.join(tokens[start:end])!r}, not {item['text']!r}"
                )
            entities.append(Entity(starts[start], starts[end - 1] + len(tokens[end - 1]), label))
        return NerDocument(record_id(record, index, "sent_id", "id"), text, sorted(entities))

    return guarded(json_records(path), parse)
