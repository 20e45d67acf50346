"""Typed configuration of span NER (GlobalPointer + ZLPR over any encoder)."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from spanlm.config import check_seed
from spanlm.heads.global_pointer import GlobalPointerConfig
from spanlm.heads.zlpr import ZlprConfig
from spanlm.models.hf_model import EncoderConfig
from spanlm.ner.data import ReadOptions
from spanlm.train.config import LoggingConfig, TrainConfig


@dataclasses.dataclass
class NerDataConfig(ReadOptions):
    """The files, how they are read (format, columns, tag scheme, label set, bad records) and windowed.

    ``labels``: the label set in this order (the head's type ids); null takes the sorted labels of the
    training file. A record with a label outside the set is malformed (``on_bad_record``).
    ``train`` / ``dev`` are files, or Hugging Face NER datasets (a save_to_disk directory or an
    ``hf:NAME[@REVISION][:CONFIG][:SPLIT]`` name) read from ``train_split`` / ``dev_split``.
    """

    train: str = ""
    dev: str = ""  # scored during training (the first eval_docs documents) and in full after it
    train_split: str = "train"  # the split of a dataset train input that does not name one
    dev_split: str = "validation"  # the split of a dataset dev input that does not name one
    # Tokens per window including the special tokens; longer documents are read through several.
    max_len: int = 256
    # Tokens shared by consecutive windows (the overlap; the step is the window's content minus it).
    stride: int = 64
    eval_docs: int = 1000  # dev documents scored at each periodic evaluation (0 = all)
    train_docs: int = 0  # train on the first this many documents of data.train (0 = all): a few labels
    # A batch's windows in one token stream, each attending only to itself (spanlm.data.packing):
    # true / false, or "auto": per device what measured fastest (config.yaml records the choice).
    packing: bool | Literal["auto"] = "auto"
    tokens_per_batch: int = (
        0  # batches of windows up to this many real tokens instead of train.batch_size windows; 0 = off
    )

    def __post_init__(self) -> None:
        if self.max_len < 4:
            raise ValueError("max_len must be at least 4")
        if self.stride < 0:
            raise ValueError("stride must be at least 0")
        if self.eval_docs < 0:
            raise ValueError("eval_docs must be at least 0")
        if self.train_docs < 0:
            raise ValueError("train_docs must be at least 0")
        if self.tokens_per_batch and self.tokens_per_batch < self.max_len:
            raise ValueError(
                f"tokens_per_batch must be 0 (off) or at least max_len ({self.max_len}), got {self.tokens_per_batch}"
            )
        if not self.tag_columns:
            raise ValueError("tag_columns must name at least one column")
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise ValueError("labels names a label twice")


@dataclasses.dataclass
class NerConfig:
    """The head, its loss and decoding."""

    head: GlobalPointerConfig = dataclasses.field(default_factory=GlobalPointerConfig)
    loss: ZlprConfig = dataclasses.field(default_factory=ZlprConfig)
    threshold: float = 0.0  # a (type, start, end) cell is an entity when its logit exceeds this (ZLPR's 0)
    flat: bool = False  # non-overlapping decoding (highest score first) instead of nested

    def __post_init__(self) -> None:
        if not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be a finite number, got {self.threshold}")


@dataclasses.dataclass
class NerRecipe:
    """Everything `spanlm ner train` needs."""

    seed: int = 0
    model: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
    data: NerDataConfig = dataclasses.field(default_factory=NerDataConfig)
    ner: NerConfig = dataclasses.field(default_factory=NerConfig)
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(output_dir="runs/ner", lr=2e-5, warmup_steps=0)
    )
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        check_seed(self.seed)

    def input_paths(self) -> dict[str, str | None]:
        """What a run of this recipe reads, by key: its output may be none of them, nor inside nor around one."""
        return {"model.path": self.model.path, "data.train": self.data.train, "data.dev": self.data.dev}
