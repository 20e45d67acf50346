"""CoNLL columns: one token per line, blank lines between sentences, ``-DOCSTART-`` between documents; BIO (IOB2)
or BIOES tags in one or several columns (several = nested levels)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from spanlm.ner.formats.records import BadRecord, ReadOptions, lines, tokens_document


def tags_to_spans(tags: list[str], scheme: str) -> list[tuple[int, int, str]]:
    """BIO (IOB2) / BIOES tags → token spans (start, end exclusive, label); raises BadRecord when broken.

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
                raise BadRecord(f"token {i + 1}: tag {tag!r} is not a {scheme.upper()} tag", token=i)
        if prefix in inside:
            if open_label != label:
                raise BadRecord(
                    f"token {i + 1}: {tag} does not continue an open {label} entity ({scheme.upper()} is broken)",
                    token=i,
                )
            if prefix == "E":
                spans.append((open_start, i + 1, label))
                open_start = open_label = None
            continue
        if open_label is not None:
            if scheme == "bioes":
                raise BadRecord(
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
            raise BadRecord(
                f"the sentence ends inside an unclosed {open_label} entity (BIOES needs E-{open_label})",
                token=len(tags) - 1,
            )
        spans.append((open_start, len(tags), open_label))
    return spans


def conll_sentences(path: Path) -> Iterator[tuple[int, list[list[str]] | BadRecord, bool]]:
    """(first line, rows of columns, starts a new document) per sentence; -DOCSTART- lines open documents."""
    rows, first, new_document, broken = [], 0, True, None
    for lineno, line in lines(path):
        if isinstance(line, BadRecord):
            broken = broken or BadRecord(str(line), line=lineno)
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


def conll(path: Path, options: ReadOptions):
    def sentence(rows: list[list[str]]) -> tuple[list[str], list[tuple[int, int, str]]]:
        wanted = (options.token_column, *options.tag_columns)
        for offset, columns in enumerate(rows):
            # Negative columns count from the end, so a short line could make the token its own tag.
            if not all(-len(columns) <= c < len(columns) for c in wanted) or len(
                {c % len(columns) for c in wanted}
            ) < len(wanted):
                raise BadRecord(
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
    for lineno, rows, new_document in conll_sentences(path):
        if options.conll_unit == "document" and new_document and pending:
            yield pending_line, tokens_document(str(index), pending)
            index, pending = index + 1, []
        try:
            if isinstance(rows, BadRecord):
                raise rows
            parsed = sentence(rows)
        except BadRecord as problem:  # named by the line at fault: a sentence's rows are consecutive lines
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
