"""Answers from logits: the best span over every window of a question, and the null answer.

Per window, every (start i, end j) pair of context tokens with ``i <= j < i + max_answer_length``
scores ``start[i] + end[j]`` (BERT run_squad; one (B, L, L) tensor, no loop over tokens). A question
takes the best span over all its windows, mapped back to characters of the context. Its null score is
the *smallest* ``start[CLS] + end[CLS]`` over its windows, as in run_squad; for SQuAD v2.0 the
question is answered "" when ``null - best span`` exceeds a threshold tuned on the dev set.

:class:`QAModel` is what ``spanlm qa train`` exports to ``<run>/model/`` and ``qa eval`` / ``qa
predict`` load: the encoder (a Hugging Face directory), ``qa_head.safetensors``, ``recipe.yaml`` and
``qa.json`` (the tuned threshold).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch

from spanlm.finetune.batches import to_device
from spanlm.finetune.char_spans import whole_spans
from spanlm.finetune.task import encoder_featurizer, load_task_model
from spanlm.models.encoder import load_encoder
from spanlm.models.hf_model import EncoderConfig
from spanlm.models.packed import resolve_packing
from spanlm.qa.config import QARecipe
from spanlm.qa.data import QAExample
from spanlm.qa.metrics import evaluate as score_predictions
from spanlm.qa.model import HEAD_FILE, RECIPE_FILE, SETTINGS_FILE, QAObjective, read_threshold
from spanlm.qa.windows import Windows, make_windows


@dataclasses.dataclass
class Prediction:
    id: str
    text: str  # the best non-null span
    start: int  # characters of the context: context[start:end] == text
    end: int
    score: float  # start + end logit of the span
    null_margin: float  # null score − span score (SQuAD v2.0: "" when above the threshold)


def best_spans(
    start_logits: torch.Tensor, end_logits: torch.Tensor, context_mask: torch.Tensor, max_answer_length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per window: best span score, its start and end token, and the null score; all (B,)."""
    start, end = start_logits.float(), end_logits.float()
    width = start.shape[1]
    scores = start[:, :, None] + end[:, None, :]  # (B, L, L): start i, end j
    band = torch.ones(width, width, dtype=torch.bool, device=start.device)
    band = band.triu() & ~band.triu(max_answer_length)  # i <= j < i + max_answer_length
    valid = band & context_mask[:, :, None] & context_mask[:, None, :]  # (B, L, L)
    best, flat = scores.masked_fill(~valid, -torch.inf).flatten(1).max(1)  # (B,)
    return best, flat // width, flat % width, start[:, 0] + end[:, 0]


@torch.no_grad()
def window_spans(
    model: torch.nn.Module, windows: Windows, max_answer_length: int, batch_size: int, device: torch.device
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Run ``model`` over every window; its best span (score, start, end token) and null score."""
    parts = []
    for first in range(0, len(windows), batch_size):
        batch = windows.batch(np.arange(first, min(first + batch_size, len(windows))), targets=False)
        batch = to_device(batch, device)
        output = model(batch)
        parts.append(
            [
                t.cpu().numpy()
                for t in best_spans(
                    output["start_logits"], output["end_logits"], batch["context_mask"], max_answer_length
                )
            ]
        )
    return tuple(np.concatenate(column) for column in zip(*parts))


def collect(examples: list[QAExample], windows: Windows, score, start, end, null) -> list[Prediction]:
    """Each example's best span over its windows (sorted by example), in characters."""
    order = np.lexsort((-score, windows.example))  # by example, best window first
    _, first = np.unique(windows.example[order], return_index=True)
    best = order[first]  # (E,) the best window of each example
    _, group_starts = np.unique(windows.example, return_index=True)
    min_null = np.minimum.reduceat(null, group_starts)  # (E,) run_squad keeps the smallest null score
    chars_start = windows.offsets[best, start[best], 0]
    chars_end = windows.offsets[best, end[best], 1]
    out = []
    for e, example in enumerate(examples):
        # whole characters, no edge whitespace (spanlm.finetune.char_spans); a span of spaces is the empty answer
        (s,), (t,) = whole_spans(example.context, chars_start[e : e + 1], chars_end[e : e + 1])
        s, t = int(s), int(t)
        out.append(
            Prediction(
                example.id, example.context[s:t], s, t, float(score[best[e]]), float(min_null[e] - score[best[e]])
            )
        )
    return out


def predict(
    model: torch.nn.Module,
    tokenizer,
    examples: list[QAExample],
    recipe: QARecipe,
    batch_size: int,
    device: torch.device,
    windows: Windows | None = None,
) -> list[Prediction]:
    """The best span of every example (``windows`` when already made from these examples)."""
    if windows is None:
        data = recipe.data
        windows = make_windows(
            tokenizer,
            examples,
            data.max_length,
            data.doc_stride,
            data.max_query_length,
            encoder_featurizer(model.encoder),
        )
        # The recipe records what training resolved data.packing to; "auto" outside the trainer (no speed
        # backend to decide) pads.
        windows.packed = resolve_packing(data.packing, model, packs_by_default=False)
    was_training = model.training
    model.eval()
    try:
        spans = window_spans(model, windows, recipe.qa.max_answer_length, batch_size, device)
    finally:
        model.train(was_training)
    return collect(examples, windows, *spans)


def evaluate_predictions(
    predictions: list[Prediction], examples: list[QAExample], recipe: QARecipe, threshold: float | None = None
) -> dict[str, float]:
    """The task metric of ``predictions``; with qa.no_answer, at ``threshold`` and at the best one."""
    answers = {p.id: p.text for p in predictions}
    gold = {e.id: e.gold for e in examples}
    margins = {p.id: p.null_margin for p in predictions} if recipe.qa.no_answer else None
    return score_predictions(answers, gold, recipe.qa.metric, margins, threshold)


def final_answer(prediction: Prediction, no_answer: bool, threshold: float) -> str:
    return "" if no_answer and prediction.null_margin > threshold else prediction.text


class QAModel:
    """An exported QA model: encoder + span head + the recipe it was trained with + tuned threshold."""

    def __init__(self, directory: str | Path, device: str = "auto"):
        directory = Path(directory)

        def build(directory: Path, recipe: QARecipe) -> QAObjective:
            return QAObjective(load_encoder(EncoderConfig(path=str(directory), dropout=recipe.model.dropout)))

        files = (RECIPE_FILE, HEAD_FILE, SETTINGS_FILE)
        loaded = load_task_model(directory, "QA", files, RECIPE_FILE, QARecipe, build, device)
        self.recipe, self.objective, self.device = loaded.recipe, loaded.objective, loaded.device
        self.threshold = read_threshold(directory / SETTINGS_FILE)
        self.tokenizer = loaded.tokenizer

    def predict(self, examples: list[QAExample], batch_size: int = 32) -> list[Prediction]:
        return predict(self.objective, self.tokenizer, examples, self.recipe, batch_size, self.device)

    def evaluate(self, examples: list[QAExample], batch_size: int = 32) -> tuple[dict[str, float], list[Prediction]]:
        predictions = self.predict(examples, batch_size)
        return evaluate_predictions(predictions, examples, self.recipe, self.threshold), predictions

    def answer(self, prediction: Prediction) -> dict:
        """One line of ``qa predict`` output."""
        text = final_answer(prediction, self.recipe.qa.no_answer, self.threshold)
        # An empty context has no span: its score is −inf, written as null (JSON has no infinities).
        record = {
            "id": prediction.id,
            "answer": text,
            "start": prediction.start if text else -1,
            "end": prediction.end if text else -1,
            "score": _finite_or_none(prediction.score),
        }
        if self.recipe.qa.no_answer:
            record["null_margin"] = _finite_or_none(prediction.null_margin)
            record["span"] = prediction.text
        return record


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
