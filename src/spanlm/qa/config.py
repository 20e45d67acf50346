"""Typed configuration of extractive question answering (SQuAD-format data)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from spanlm.config import check_seed
from spanlm.models.hf_model import EncoderConfig
from spanlm.train.config import LoggingConfig, TrainConfig


@dataclasses.dataclass
class QADataConfig:
    """Where the SQuAD-format files are and how contexts are cut into windows."""

    train: str = ""  # SQuAD v1.1 / v2.0 JSON
    dev: str = ""  # evaluated during and after training; tunes the no-answer threshold (qa.no_answer)
    # Tokens per window, [CLS] question [SEP] context [SEP] included (BERT's max_seq_length).
    max_length: int = 384
    # Tokens between the starts of consecutive windows over one context (BERT run_squad's doc_stride:
    # a step, not the overlap; the overlap is what is left of the window).
    doc_stride: int = 128
    max_query_length: int = 64  # longer questions keep their first tokens (BERT run_squad)
    # A wrong answer_start is repaired to the nearest occurrence of the answer text at most this many
    # characters away; answer_start = -1 takes the first occurrence anywhere.
    repair_window: int = 20
    # A batch's windows in one token stream, each attending only to itself (spanlm.data.packing):
    # true / false, or "auto": per device what measured fastest (config.yaml records the choice).
    packing: bool | Literal["auto"] = "auto"
    tokens_per_batch: int = (
        0  # batches of windows up to this many real tokens instead of train.batch_size windows; 0 = off
    )

    def __post_init__(self) -> None:
        for name in ("max_length", "doc_stride", "max_query_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_query_length + 4 > self.max_length:
            raise ValueError(
                f"max_query_length {self.max_query_length} leaves no room for the context in max_length "
                f"{self.max_length}"
            )
        if self.repair_window < 0:
            raise ValueError("repair_window must be at least 0")
        if self.tokens_per_batch and self.tokens_per_batch < self.max_length:
            raise ValueError(
                f"tokens_per_batch must be 0 (off) or at least max_length ({self.max_length}), got "
                f"{self.tokens_per_batch}"
            )


@dataclasses.dataclass
class QAConfig:
    """The task: answer decoding, no-answer handling and the metric."""

    # squad: official SQuAD v1.1/v2.0 EM/F1 (English normalisation); cmrc2018: the CMRC 2018 script's
    # character-level EM/F1 (Chinese).
    metric: Literal["squad", "cmrc2018"] = "squad"
    no_answer: bool = False  # SQuAD v2.0: questions may have no answer ([CLS] scores the null answer)
    max_answer_length: int = 30  # tokens (BERT run_squad)

    def __post_init__(self) -> None:
        if self.max_answer_length < 1:
            raise ValueError("max_answer_length must be at least 1")


@dataclasses.dataclass
class QARecipe:
    """Everything `spanlm qa train` needs."""

    seed: int = 0
    model: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
    data: QADataConfig = dataclasses.field(default_factory=QADataConfig)
    qa: QAConfig = dataclasses.field(default_factory=QAConfig)
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(output_dir="runs/qa", lr=3e-5, warmup_steps=0)
    )
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        check_seed(self.seed)

    def input_paths(self) -> dict[str, str | None]:
        """What a run of this recipe reads, by key: its output may be none of them, nor inside nor around one."""
        return {"model.path": self.model.path, "data.train": self.data.train, "data.dev": self.data.dev}
