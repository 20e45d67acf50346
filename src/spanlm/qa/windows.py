"""Question + context → fixed-size windows of token ids, with character offsets back into the context.

A context longer than one window is read through several (BERT run_squad, Devlin et al. 2019):
``[CLS] question [SEP] context slice [SEP]``, consecutive slices starting ``doc_stride`` tokens apart.
The fast tokenizer does the slicing (``truncation="only_second"``, ``return_overflowing_tokens``); its
``stride`` argument is the *overlap* of consecutive slices, so for BERT's step ``doc_stride`` it gets
``room - doc_stride``, where ``room`` (the context tokens one window holds) depends on the question's
length. Examples are tokenized in groups of equal overlap, one batched call per group.

Every context token keeps its character offsets into the original context (the tokenizer's offset
mapping is per sequence), so a span of tokens maps back to ``context[offsets[i][0]:offsets[j][1]]``
whatever the normalisation (lower-casing, accent stripping, CJK splitting) did.

Training targets: the token span of the example's first located answer in every window that holds
the whole answer; windows that do not (and questions without an answer) point at [CLS] (position 0),
as in BERT run_squad.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch

from spanlm.errors import ConfigError, InputError
from spanlm.finetune.batches import window_batch
from spanlm.qa.data import QAExample


@dataclasses.dataclass
class Windows:
    """All windows of a list of examples, sorted by example; rows padded to the longest window."""

    input_ids: np.ndarray  # (W, L) int64
    token_type_ids: np.ndarray  # (W, L) int64
    attention_mask: np.ndarray  # (W, L) bool
    context_mask: np.ndarray  # (W, L) bool: tokens of the context
    offsets: np.ndarray  # (W, L, 2) int64: [start, end) characters of each context token in its context
    example: np.ndarray  # (W,) int64: index of the window's example
    start_positions: np.ndarray  # (W,) int64: answer's first token, 0 ([CLS]) when not in the window
    end_positions: np.ndarray  # (W,) int64: answer's last token (inclusive), 0 when not in the window
    contexts: list[str] = dataclasses.field(default_factory=list)  # the examples' contexts (for a featurizer)
    # Encoders with extra inputs (CharBERT) expose featurizer(): (ids, offsets, texts) -> arrays, added to
    # each batch. It spells [UNK] tokens from their characters; question tokens have no offsets here,
    # so an [UNK] in the question is spelt empty.
    featurizer: Callable | None = None
    pad_id: int = 0  # the tokenizer's padding id
    # A batch's windows one after another in one packed stream (spanlm.data.packing); False: one window per row.
    packed: bool = False

    def __len__(self) -> int:
        return len(self.example)

    def batch(self, indices, targets: bool = True) -> dict[str, torch.Tensor | int]:
        """The model inputs (and targets) of windows ``indices``, cut to the longest of them."""
        indices = np.asarray(indices)
        length = int(self.attention_mask[indices].sum(1).max())
        rows = {
            name: getattr(self, name)[indices, :length]
            for name in ("input_ids", "token_type_ids", "attention_mask", "context_mask")
        }
        if targets:
            rows["start_positions"], rows["end_positions"] = self.start_positions[indices], self.end_positions[indices]
        texts = [self.contexts[e] for e in self.example[indices]]
        return window_batch(rows, self.offsets[indices, :length], texts, self.featurizer, self.packed, self.pad_id)


def truncate_questions(tokenizer, questions: list[str], max_query_length: int) -> list[str]:
    """Questions cut (as text) after their first ``max_query_length`` tokens; leading spaces removed.

    Leading whitespace is stripped because some SQuAD questions start with long runs of it, which
    would eat the window (transformers' run_qa does the same).
    """
    questions = [question.lstrip() for question in questions]
    encoded = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True)
    return [
        question if len(offsets) <= max_query_length else question[: offsets[max_query_length - 1][1]]
        for question, offsets in zip(questions, encoded["offset_mapping"])
    ]


def make_windows(
    tokenizer,
    examples: list[QAExample],
    max_length: int,
    doc_stride: int,
    max_query_length: int,
    featurizer: Callable | None = None,
) -> Windows:
    """Tokenize ``examples`` into windows with their offsets and training targets."""
    if not examples:
        raise InputError("no questions to tokenize")
    special = tokenizer.num_special_tokens_to_add(pair=True)
    questions = truncate_questions(tokenizer, [example.question for example in examples], max_query_length)
    question_lengths = [
        len(ids) for ids in tokenizer(questions, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    ]
    groups = defaultdict(list)  # overlap → example indices
    for index, length in enumerate(question_lengths):
        room = max_length - length - special
        if room < 1:
            raise ConfigError(
                f"data.max_length {max_length} leaves no room for the context after a question of {length} tokens; "
                "raise data.max_length or lower data.max_query_length"
            )
        groups[max(room - doc_stride, 0)].append(index)

    rows = []  # (example, ids, type ids, sequence ids, offsets) per window
    for overlap, members in sorted(groups.items()):
        encoded = tokenizer(
            [questions[i] for i in members],
            [examples[i].context for i in members],
            truncation="only_second",
            max_length=max_length,
            stride=overlap,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            return_token_type_ids=True,
            split_special_tokens=True,
        )  # a literal "[SEP]" in a question or context is text
        for window, member in enumerate(encoded["overflow_to_sample_mapping"]):
            sequence = [-1 if s is None else s for s in encoded.sequence_ids(window)]
            rows.append(
                (
                    members[member],
                    encoded["input_ids"][window],
                    encoded["token_type_ids"][window],
                    sequence,
                    encoded["offset_mapping"][window],
                )
            )
    rows.sort(key=lambda row: row[0])  # stable: an example's windows stay in reading order

    count, width = len(rows), max(len(row[1]) for row in rows)
    input_ids = np.full((count, width), tokenizer.pad_token_id, dtype=np.int64)
    token_type_ids = np.zeros((count, width), dtype=np.int64)
    sequence_ids = np.full((count, width), -1, dtype=np.int64)
    offsets = np.zeros((count, width, 2), dtype=np.int64)
    attention_mask = np.zeros((count, width), dtype=bool)
    for w, (_, ids, types, sequence, spans) in enumerate(rows):
        n = len(ids)
        input_ids[w, :n], token_type_ids[w, :n], sequence_ids[w, :n], offsets[w, :n] = ids, types, sequence, spans
        attention_mask[w, :n] = True
    if not (input_ids[:, 0] == tokenizer.cls_token_id).all():
        raise InputError(
            f"{tokenizer.name_or_path}: the tokenizer does not put its CLS token first; the null answer is scored "
            "at position 0"
        )
    context_mask = sequence_ids == 1
    offsets[~context_mask] = 0
    example = np.array([row[0] for row in rows], dtype=np.int64)
    start_positions, end_positions = _targets(examples, example, context_mask, offsets)
    return Windows(
        input_ids,
        token_type_ids,
        attention_mask,
        context_mask,
        offsets,
        example,
        start_positions,
        end_positions,
        [e.context for e in examples],
        featurizer,
        pad_id=int(tokenizer.pad_token_id),
    )


def _targets(
    examples: list[QAExample], example: np.ndarray, context_mask: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Token span of each window's answer (the example's first located answer), 0 where not inside."""
    answer_start = np.array([e.answers[0].start if e.answers else -1 for e in examples], dtype=np.int64)[
        example
    ]  # (W,)
    answer_end = np.array(
        [e.answers[0].start + len(e.answers[0].text) if e.answers else -1 for e in examples], dtype=np.int64
    )[example]
    starts, ends = offsets[..., 0], offsets[..., 1]  # (W, L)
    big = np.iinfo(np.int64).max
    first_char = np.where(context_mask, starts, big).min(1)  # (W,) first context character in the window
    last_char = np.where(context_mask, ends, -1).max(1)  # (W,) end of the last context character
    inside = (answer_start >= 0) & (answer_start >= first_char) & (answer_end <= last_char)
    # First context token ending after the answer's start; last context token starting before its end.
    start_token = np.argmax(context_mask & (ends > answer_start[:, None]), axis=1)
    width = context_mask.shape[1]
    end_token = width - 1 - np.argmax((context_mask & (starts < answer_end[:, None]))[:, ::-1], axis=1)
    return np.where(inside, start_token, 0), np.where(inside, end_token, 0)
