"""Learning health: what a run says when it is not learning, from its own held-out evaluations and training loss.

A masked LM that has learnt nothing from context still reaches its *unigram line*: always guessing the most frequent
target of its masking. A collapsed one predicts the same few tokens at every blank. Both show in an evaluation's
tallies (an objective's ``{part}_target_counts`` / ``{part}_predicted_counts``, summed over the held-out batches:
spanlm.heads.losses.prediction_tallies), which :func:`summarise_tallies` turns into ``{part}_unigram_accuracy``,
``{part}_distinct_predictions`` and ``{part}_prediction_entropy`` (bits) beside ``{part}_accuracy``.

:class:`LearningHealth` watches the records: the judged part (the masked tokens' own, ``mlm``, where the objective
has one: SBO's and NLM's auxiliary predictions learn later and are recorded, not judged) whose held-out accuracy
has not left its unigram line after
:data:`PLATEAU_EVALUATIONS` evaluations, or a fine-tuning run whose training loss stays at chance (the task's
``chance_loss``: ln K for K balanced labels) over the last :data:`PLATEAU_RECORDS` records past the first fifth of
its steps, is said once, in one line naming the recipe keys that usually fix it (the task's ``hint``).
"""

from __future__ import annotations

import math

import torch

PLATEAU_EVALUATIONS = 3  # held-out evaluations (after step 0) below the unigram line before the run says so
PLATEAU_RECORDS = 3  # training records at chance before the run says so
# Left the plateau: above the unigram line by a tenth of it and half a point (a tiny line needs a visible margin)
MARGIN_RELATIVE, MARGIN_ABSOLUTE = 0.10, 0.005
CHANCE_SHARE = 0.97  # a loss within 3% of chance has learnt next to nothing


def summarise_tallies(tallies: dict[str, torch.Tensor]) -> dict[str, float]:
    """The learning-health metrics of summed ``{part}_target_counts`` / ``{part}_predicted_counts`` (V,) tallies."""
    metrics = {}
    for key in sorted(tallies):
        if not key.endswith("_target_counts"):
            continue
        part = key.removesuffix("_target_counts")
        targets, predicted = tallies[key].double(), tallies.get(f"{part}_predicted_counts")
        if targets.sum() > 0:
            metrics[f"{part}_unigram_accuracy"] = float(targets.max() / targets.sum())
        if predicted is not None and predicted.sum() > 0:
            shares = predicted.double() / predicted.sum()
            metrics[f"{part}_distinct_predictions"] = int((predicted > 0).sum())
            seen = shares[shares > 0]
            metrics[f"{part}_prediction_entropy"] = max(0.0, float(-(seen * seen.log2()).sum()))  # never -0.0
    return metrics


class LearningHealth:
    """Reads a run's records as they are written; returns, at most once per part, the line saying it is not learning.

    ``hint``: the recipe keys that usually fix it, as the task words them; ``chance_loss``: a fine-tuning task's
    training loss when it has learnt nothing (None: not checked); ``max_steps``: the run's length.
    """

    def __init__(self, hint: str | None, chance_loss: float | None, max_steps: int):
        self.hint = hint or "train.lr and train.warmup_steps"
        self.chance_loss, self.max_steps = chance_loss, max_steps
        self.evaluations: dict[str, list[tuple[int, float, float]]] = {}  # part → (step, accuracy, unigram line)
        self.losses: list[tuple[int, float]] = []
        self.said: set[str] = set()

    def after_evaluation(self, step: int, metrics: dict[str, float]) -> list[str]:
        """Lines for the parts whose last evaluations all stayed at their unigram line (step 0 does not count)."""
        if step == 0:
            return []
        lines = []
        parts = [key.removesuffix("_unigram_accuracy") for key in metrics if key.endswith("_unigram_accuracy")]
        for part in ["mlm"] if "mlm" in parts else parts:
            line = metrics[f"{part}_unigram_accuracy"]
            accuracy = metrics.get(f"{part}_accuracy")
            if accuracy is None:
                continue
            history = self.evaluations.setdefault(part, [])
            history.append((step, accuracy, line))
            recent = history[-PLATEAU_EVALUATIONS:]
            stuck = len(recent) == PLATEAU_EVALUATIONS and all(
                a <= u * (1 + MARGIN_RELATIVE) + MARGIN_ABSOLUTE for _, a, u in recent
            )
            if stuck and part not in self.said:
                self.said.add(part)
                distinct = metrics.get(f"{part}_distinct_predictions")
                collapsed = f", {distinct} distinct predicted tokens" if distinct is not None else ""
                lines.append(
                    f"not learning: held-out {part}_accuracy {accuracy:.4f} has stayed at its unigram line "
                    f"{line:.4f} (always guessing the most frequent target{collapsed}) over the {PLATEAU_EVALUATIONS} "
                    f"evaluations to step {step}; what usually fixes it: {self.hint}"
                )
        return lines

    def after_train_record(self, step: int, loss: float | None) -> list[str]:
        """A line when a fine-tuning run's training loss has stayed at chance past the first fifth of its steps."""
        if self.chance_loss is None or loss is None or not math.isfinite(loss) or "chance" in self.said:
            return []
        self.losses.append((step, loss))
        recent = self.losses[-PLATEAU_RECORDS:]
        if step < self.max_steps / 5 or len(recent) < PLATEAU_RECORDS:
            return []
        if all(value >= CHANCE_SHARE * self.chance_loss for _, value in recent):
            self.said.add("chance")
            mean = sum(value for _, value in recent) / len(recent)
            return [
                f"not learning: the training loss {mean:.4f} has stayed at chance ({self.chance_loss:.4f}) over the "
                f"records to step {step}; what usually fixes it: {self.hint}"
            ]
        return []
