"""Typed configuration of sequence classification and regression (GLUE / CLUE style)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from spanlm.cls.tasks import TASKS
from spanlm.config import check_seed
from spanlm.models.hf_model import EncoderConfig
from spanlm.train.config import LoggingConfig, TrainConfig

METRICS = ("accuracy", "f1", "macro_f1", "matthews", "pearson", "spearman")


@dataclasses.dataclass
class ClsDataConfig:
    """Where the labelled sentences (or sentence pairs) are, how to read them and how long a sequence may be.

    ``task`` names a benchmark task whose column layout, problem and metrics are known: GLUE TSV files
    (sst2, cola, mrpc, rte, stsb, qnli, qqp, mnli) or CLUE JSON lines (tnews, afqmc, iflytek, ocnli, cmnli).
    Without one, a JSON-lines / CSV file or a 🤗 dataset is read by field name: ``text_field``, ``text_pair_field``
    (a sentence-pair task when set) and ``label_field``.
    """

    train: str = ""  # a file, a save_to_disk directory or hf:NAME[@REVISION][:CONFIG][:SPLIT]
    dev: str = ""  # scored during and after training
    task: str | None = None  # a GLUE / CLUE task name (its columns, problem and metrics); None: by field names
    format: Literal["auto", "glue", "clue", "jsonl", "csv", "hf"] = "auto"  # auto: from the task or the suffix
    text_field: str = "text"
    text_pair_field: str | None = None  # the second sentence of a pair task
    label_field: str = "label"
    train_split: str = "train"  # the split of a dataset train input that does not name one
    dev_split: str = "validation"  # the split of a dataset dev input that does not name one
    # The label set in this order (the classifier's ids); null takes the training file's labels, sorted
    # (numerically when they are all integers). A dev label outside it is an error.
    labels: list[str] | None = None
    max_length: int = 128  # tokens per sequence, special tokens included; longer inputs are truncated
    # A batch's sequences in one token stream, each attending only to itself (spanlm.data.packing):
    # true / false, or "auto": per device what measured fastest.
    packing: bool | Literal["auto"] = "auto"
    tokens_per_batch: int = 0  # batches of sequences up to this many real tokens instead of train.batch_size

    def __post_init__(self) -> None:
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; one of {', '.join(TASKS)} (or null: by field names)")
        if self.max_length < 4:
            raise ValueError("max_length must be at least 4")
        if self.tokens_per_batch and self.tokens_per_batch < self.max_length:
            raise ValueError(
                f"tokens_per_batch must be 0 (off) or at least max_length ({self.max_length}), got "
                f"{self.tokens_per_batch}"
            )
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise ValueError("labels names a label twice")


@dataclasses.dataclass
class ClsConfig:
    """The problem and how it is scored."""

    # classification: softmax over the labels, cross-entropy; regression: one output, mean squared error.
    # null: the task's (stsb is regression), else classification.
    problem: Literal["classification", "regression"] | None = None
    # The scores reported (×100), the first one the headline; null: the benchmark's own (accuracy; F1 and
    # accuracy for mrpc / qqp; Matthews for cola; Pearson and Spearman for stsb).
    metrics: list[str] | None = None
    positive_label: str = "1"  # the class F1 scores (MRPC and QQP: 1 = paraphrase / duplicate)
    # What the head reads: "mean", the mean of the real tokens' final states, or "cls", the first token's (the stock
    # BERT / RoBERTa / ELECTRA / DeBERTa heads'). After MLM-only pretraining (SpanBERT, RoBERTa and their successors
    # drop next-sentence prediction) no loss ever trained [CLS] to summarise its sequence, while every token's state
    # was trained; ModernBERT's and EuroBERT's stock heads can read the mean. A BERT-family model with the mean exports
    # in spanlm's layout (no stock class pools that way); "cls" keeps the stock *ForSequenceClassification.
    pooling: Literal["mean", "cls"] = "mean"

    def __post_init__(self) -> None:
        for name in self.metrics or ():
            if name not in METRICS:
                raise ValueError(f"unknown metric {name!r}; one of {', '.join(METRICS)}")
        if self.metrics is not None and not self.metrics:
            raise ValueError("metrics must name at least one metric (or be null)")


@dataclasses.dataclass
class ClsRecipe:
    """Everything `spanlm cls train` needs."""

    seed: int = 0
    model: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
    data: ClsDataConfig = dataclasses.field(default_factory=ClsDataConfig)
    cls: ClsConfig = dataclasses.field(default_factory=ClsConfig)
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(output_dir="runs/cls", lr=2e-5, warmup_steps=0)
    )
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        check_seed(self.seed)

    def input_paths(self) -> dict[str, str | None]:
        """What a run of this recipe reads, by key: its output may be none of them, nor inside nor around one."""
        return {"model.path": self.model.path, "data.train": self.data.train, "data.dev": self.data.dev}
