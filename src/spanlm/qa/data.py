"""SQuAD-format reading (v1.1 and v2.0), with answer offsets checked against the context.

The file is ``{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers":
[{"text", "answer_start"}], "is_impossible"?}]}]}]}``. Real files have wrong offsets (CMRC 2018 dev: 193
answers at ``answer_start = -1``, 7 off by one or two characters), so every answer is checked:

* ``context[start:start + len(text)] == text`` — kept as is;
* otherwise the occurrence of ``text`` nearest to ``start`` within ``repair_window`` characters (or the
  first occurrence anywhere when ``start`` is -1) is taken and the repair reported;
* otherwise the answer has no span: it is dropped from training, but its text still counts as a gold
  answer when scoring, as in the official scripts, which only compare texts.

A question none of whose answers has a span cannot be trained on: read for training it is skipped and
counted; read for scoring (``for_training=False``: ``qa eval``, the dev set) it is kept, scored on its
texts, so the metric's denominator is every question of the file. Either way the report names the
question and what is off (where the text does occur, or that it does not). A malformed record (missing
or mistyped field) is skipped, named by its JSON path. Nothing in a record crashes the reader; a file that is not
JSON at all is an :class:`~spanlm.errors.InputError` naming the line and column.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from spanlm.errors import InputError, numbered_lines, read_text, require_file, undecodable


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset into the context; context[start:start + len(text)] == text


@dataclasses.dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[Answer]  # answers located in the context (the first one is the training target)
    gold: list[str]  # every reference answer text, for scoring; empty for a question without answer

    @property
    def is_impossible(self) -> bool:
        return not self.gold


@dataclasses.dataclass
class ReadReport:
    """What reading one file found: repairs, answers without a span, skipped questions."""

    path: str
    questions: int = 0  # question records seen
    repaired: list[tuple[str, int, int]] = dataclasses.field(
        default_factory=list
    )  # (question id, given start, repaired start)
    unlocated: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (question id, what is off)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (location, reason)

    def summary(self) -> dict:
        return {
            "file": self.path,
            "questions": self.questions,
            "repaired_answers": len(self.repaired),
            "unlocated_answers": len(self.unlocated),
            "skipped_questions": len(self.skipped),
        }

    def nothing_usable(self) -> str:
        """The message for a file of which no question could be read: the counts and the first reason."""
        first = f"; first: {self.skipped[0][0]}: {self.skipped[0][1]}" if self.skipped else ""
        return f"{self.path}: no usable question ({self.questions} read, {len(self.skipped)} skipped{first})"

    def lines(self, limit: int = 5) -> list[str]:
        """Human-readable lines naming the first ``limit`` cases of each kind."""
        out = []
        if self.repaired:
            cases = ", ".join(f"{qid} ({old}→{new})" for qid, old, new in self.repaired[:limit])
            out.append(f"{self.path}: repaired {len(self.repaired)} answer_start value(s): {cases}")
        if self.unlocated:
            cases = "; ".join(f"id {qid}: {why}" for qid, why in self.unlocated[:limit])
            out.append(
                f"{self.path}: {len(self.unlocated)} answer(s) without a span in their context (kept for scoring "
                f"only): {cases}"
            )
        if self.skipped:
            cases = "; ".join(f"{where}: {why}" for where, why in self.skipped[:limit])
            out.append(f"{self.path}: skipped {len(self.skipped)} question(s): {cases}")
        return out


def locate_answer(context: str, text: str, start: int, window: int) -> int | None:
    """The character offset of ``text`` in ``context`` that ``start`` points at, repaired if need be."""
    if 0 <= start and context.startswith(text, start):
        return start
    occurrences = []
    found = context.find(text)
    while found != -1:
        occurrences.append(found)
        found = context.find(text, found + 1)
    if not occurrences:
        return None
    if start == -1:  # no position given: the first occurrence, as the answer's only anchor is its text
        return occurrences[0]
    nearest = min(occurrences, key=lambda position: (abs(position - start), position))
    return nearest if abs(nearest - start) <= window else None


def unlocated_reason(context: str, text: str, start: int, window: int) -> str:
    """What is off with an answer :func:`locate_answer` could not place."""
    found = context.find(text)
    if found == -1:
        return f"answer {text[:40]!r} does not occur in the context"
    return (
        f"answer_start {start} is off: {text[:40]!r} occurs at {found}"
        f"{' (and later)' if context.find(text, found + 1) != -1 else ''}, farther than data.repair_window={window} "
        "characters"
    )


def _field(record, key: str, kind: type, where: str):
    if not isinstance(record, dict):
        raise _Malformed(where, f"expected an object, got {type(record).__name__}")
    if key not in record:
        raise _Malformed(where, f"missing '{key}'")
    value, kinds = record[key], (kind if isinstance(kind, tuple) else (kind,))
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):  # bool is an int subclass
        raise _Malformed(where, f"'{key}' must be {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}")
    return value


class _Malformed(Exception):
    def __init__(self, where: str, reason: str):
        super().__init__(reason)
        self.where, self.reason = where, reason


def load_json(path: str | Path) -> object:
    path = Path(path)
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}") from None


def read_squad(
    path: str | Path, repair_window: int = 20, allow_impossible: bool = True, for_training: bool = True
) -> tuple[list[QAExample], ReadReport]:
    """Examples of a SQuAD v1.1 / v2.0 file and the report of what was repaired or skipped.

    ``allow_impossible=False`` (SQuAD v1.1 training) skips questions without an answer, reporting them.
    ``for_training=False`` keeps questions none of whose answers has a span (scored on their texts).
    """
    data = load_json(path)
    report = ReadReport(str(path))
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise InputError(f"{path}: not a SQuAD-format file (expected an object with a 'data' list)")
    examples, seen = [], set()
    for i, article in enumerate(data["data"]):
        try:
            paragraphs = _field(article, "paragraphs", list, f"data[{i}]")
        except _Malformed as error:
            report.skipped.append((error.where, error.reason))
            continue
        for j, paragraph in enumerate(paragraphs):
            where = f"data[{i}].paragraphs[{j}]"
            try:
                context = _field(paragraph, "context", str, where)
                questions = _field(paragraph, "qas", list, where)
            except _Malformed as error:  # every question of the paragraph is lost: count them all
                lost = (
                    paragraph.get("qas")
                    if isinstance(paragraph, dict) and isinstance(paragraph.get("qas"), list)
                    else [None]
                )
                report.questions += len(lost)
                report.skipped.extend([(error.where, error.reason)] * len(lost))
                continue
            for k, record in enumerate(questions):
                report.questions += 1
                try:
                    example = _read_question(record, context, f"{where}.qas[{k}]", repair_window, report, for_training)
                except _Malformed as error:
                    report.skipped.append((error.where, error.reason))
                    continue
                if example.id in seen:  # scores are kept per question id
                    report.skipped.append((f"{where}.qas[{k}] (id {example.id})", "duplicate question id"))
                    continue
                seen.add(example.id)
                if example.is_impossible and not allow_impossible:
                    report.skipped.append(
                        (f"{where}.qas[{k}] (id {example.id})", "no answer, and qa.no_answer is false")
                    )
                    continue
                examples.append(example)
    return examples, report


def _read_question(record, context: str, where: str, window: int, report: ReadReport, for_training: bool) -> QAExample:
    qid = str(_field(record, "id", (str, int), where))  # some SQuAD-format files number their questions
    where = f"{where} (id {qid})"
    question = _field(record, "question", str, where)
    if not question.strip():
        raise _Malformed(where, "empty question")
    if "is_impossible" in record and _field(record, "is_impossible", bool, where):
        # SQuAD v2.0 lists no answers for these (the annotators' guesses are "plausible_answers").
        return QAExample(qid, question, context, [], [])
    answers = _field(record, "answers", list, where)
    located, gold, unlocated = [], [], []
    for n, answer in enumerate(answers):
        text = _field(answer, "text", str, f"{where}.answers[{n}]")
        start = _field(answer, "answer_start", int, f"{where}.answers[{n}]")
        if not text.strip():
            raise _Malformed(f"{where}.answers[{n}]", "empty answer text")
        gold.append(text)
        position = locate_answer(context, text, start, window)
        if position is None:
            unlocated.append(unlocated_reason(context, text, start, window))
            report.unlocated.append((qid, unlocated[-1]))
            continue
        if position != start:
            report.repaired.append((qid, start, position))
        located.append(Answer(text, position))
    if gold and not located and for_training:
        raise _Malformed(where, f"no answer has a span to train on ({'; '.join(unlocated)})")
    return QAExample(qid, question, context, located, gold)


def read_questions_jsonl(path: str | Path) -> list[QAExample]:
    """``qa predict`` input: one ``{"question", "context"}`` object per line (``"id"`` optional)."""
    path = Path(path)
    require_file(path)
    examples = []
    for number, line in numbered_lines(path):
        if isinstance(line, UnicodeDecodeError):
            raise InputError(f"{path}:{number}: {undecodable(line)}")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: not valid JSON: {error.msg} (column {error.colno})") from None
        if not isinstance(record, dict):
            raise InputError(
                f"{path}:{number}: expected a JSON object with question and context, got {type(record).__name__}"
            )
        try:
            question = _field(record, "question", str, "")
            context = _field(record, "context", str, "")
            qid = number if record.get("id") is None else _field(record, "id", (str, int), "")
        except _Malformed as error:
            raise InputError(f"{path}:{number}: {error.reason}") from None
        if not question.strip():  # as `qa eval` refuses one: a model asked nothing answers at random
            raise InputError(f"{path}:{number}: empty question")
        examples.append(QAExample(str(qid), question, context, [], []))
    return examples
