"""The benchmark tasks spanlm knows by name: where each keeps its text, second text and label, its problem and the
scores its benchmark reports (GLUE: Wang et al. 2019; CLUE: Xu et al. 2020). Plain data: no torch is loaded."""

from __future__ import annotations

import dataclasses

FORMATS = ("auto", "glue", "clue", "jsonl", "csv", "hf")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a benchmark task's text, second text and label are, and how it is scored."""

    format: str  # glue (TSV) or clue (JSON lines)
    text: str | int  # a header name, or a column number for a file without a header (CoLA)
    pair: str | int | None
    label: str | int
    header: bool = True
    problem: str = "classification"
    metrics: tuple[str, ...] = ("accuracy",)
    skip_labels: tuple[str, ...] = ()  # labels that mean "no gold label": such records are left out


TASKS = {
    "sst2": Layout("glue", "sentence", None, "label"),
    "cola": Layout("glue", 3, None, 1, header=False, metrics=("matthews",)),
    "mrpc": Layout("glue", "#1 String", "#2 String", "Quality", metrics=("f1", "accuracy")),
    "rte": Layout("glue", "sentence1", "sentence2", "label"),
    "stsb": Layout("glue", "sentence1", "sentence2", "score", problem="regression", metrics=("pearson", "spearman")),
    "qnli": Layout("glue", "question", "sentence", "label"),
    "qqp": Layout("glue", "question1", "question2", "is_duplicate", metrics=("f1", "accuracy")),
    "mnli": Layout("glue", "sentence1", "sentence2", "gold_label"),
    "tnews": Layout("clue", "sentence", None, "label"),
    "iflytek": Layout("clue", "sentence", None, "label"),
    "afqmc": Layout("clue", "sentence1", "sentence2", "label"),
    # OCNLI / CMNLI mark pairs whose annotators did not agree with "-"; CLUE's baselines leave them out.
    "ocnli": Layout("clue", "sentence1", "sentence2", "label", skip_labels=("-",)),
    "cmnli": Layout("clue", "sentence1", "sentence2", "label", skip_labels=("-",)),
}
