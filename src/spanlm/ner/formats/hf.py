"""Hugging Face token-classification datasets (tokens + ClassLabel BIO / BIOES tags per row)."""

from __future__ import annotations

from collections.abc import Iterator

from spanlm.data.hf_datasets import DatasetSplit
from spanlm.errors import InputError
from spanlm.ner.formats.conll import tags_to_spans
from spanlm.ner.formats.records import BadRecord, NerDocument, ReadOptions, tokens_document

HF_BATCH_ROWS = 1000  # rows of a dataset in memory at once


def hf_records(data: DatasetSplit, options: ReadOptions) -> Iterator[tuple[int, NerDocument | BadRecord]]:
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
                    raise BadRecord(f"{len(tokens)} tokens but {len(tags)} tags")
                if not all(0 <= tag < len(names) for tag in tags):  # ClassLabel stores -1 for "no label"
                    raise BadRecord(f"tag ids {tags} are not all in [0, {len(names)})")
                spans = tags_to_spans([names[tag] for tag in tags], scheme)
                yield row, tokens_document(str(batch["id"][i]) if has_id else str(row - 1), [(tokens, spans)])
            except BadRecord as problem:
                yield row, problem
