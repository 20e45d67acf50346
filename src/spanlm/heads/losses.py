"""Token-level cross-entropy losses of the masked-LM objectives, normalised per target token.

SpanBERT (Joshi et al. 2020, arXiv 1907.10529, §3.2) sums the MLM and SBO losses of every masked
token. The authors' criterion (facebookresearch/SpanBERT, pretraining/fairseq/criterions/
spanbert_loss.py) normalises each part per target token: the MLM sum by the number of MLM targets and
the SBO sum by the number of SBO targets plus one (the +1 is theirs; it keeps a batch without SBO
targets finite). Their MLM denominator has no such guard — zero MLM targets there give 0/0 = NaN;
here the MLM part is 0 then::

    L = MLM_sum / n_mlm + w_sbo · SBO_sum / (n_sbo + 1)

w_sbo = 1.0 is the paper's setting; the authors' argparse default of 0.0 would switch SBO off.

Cross-entropy is computed in float32 with autocast disabled: under bf16 autocast the logits arrive
in bf16, whose 8-bit significand makes a log-softmax over a 30k vocabulary visibly coarse.
Rows labelled ``IGNORE_INDEX`` are not targets (heads normally see only real targets, so there are none).

Objectives ask for their vocabulary losses through one function, :func:`vocab_cross_entropies`: plain
tensor operations (projection, float32 cross-entropy, autograd), no host read of a tensor value and no
Python loop over rows, so it runs on any device and ``torch.compile`` traces it whole. A device's speed
backend may compute the same losses another way (:mod:`spanlm.accel` does on CPU): a decoder module that
has a ``cross_entropies`` attribute is handed the targets instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

IGNORE_INDEX = -100


@dataclasses.dataclass
class TokenLoss:
    """Un-normalised cross-entropy of a set of target rows: the parts a caller normalises or all-reduces."""

    total: Tensor  # float32 scalar: summed cross-entropy
    count: Tensor  # int64 scalar: number of targets
    correct: Tensor  # int64 scalar: targets whose arg-max prediction is the label (no gradient)
    samples: Tensor | None = None  # (N,) what the target's ``sampler`` drew from its rows (no gradient; VocabTarget)
    # In an evaluation (no gradient): each target's vocabulary tally, of its labels and of its arg-max predictions,
    # (V,) float64 counts (prediction_tallies); None in training
    tallies: tuple[Tensor, Tensor] | None = None

    @property
    def accuracy(self) -> Tensor:
        return self.correct.float() / self.count.clamp(min=1)


def token_cross_entropy(logits: Tensor, labels: Tensor) -> TokenLoss:
    """Summed float32 cross-entropy of ``logits`` (N, V) against ``labels`` (N,); N may be 0."""
    valid = labels != IGNORE_INDEX
    with torch.autocast(device_type=logits.device.type, enabled=False):
        # A sum over an empty set is 0 (with a gradient of 0), never the NaN of 0/0 a mean would give.
        total = F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=IGNORE_INDEX)
    with torch.no_grad():
        predicted = logits.argmax(dim=-1)  # (N,)
        correct = ((predicted == labels) & valid).sum()
    tallies = None
    if not torch.is_grad_enabled():  # an evaluation: what a collapsed model shows (spanlm.train.health)
        vocab = logits.shape[-1]
        tallies = tuple(torch.bincount(ids[valid], minlength=vocab).double() for ids in (labels, predicted))
    return TokenLoss(total=total, count=valid.sum(), correct=correct, tallies=tallies)


@dataclasses.dataclass
class VocabTarget:
    """One head's target rows for :func:`vocab_cross_entropies`: ``decoder(features)`` against ``labels``."""

    features: Tensor  # (N, E): the head's rows before its vocabulary projection
    decoder: nn.Module  # the projection onto the vocabulary: ``weight`` (V, E), ``bias`` (V,)
    labels: Tensor  # (N,); IGNORE_INDEX rows are not targets
    sampler: Callable[[Tensor], Tensor] | None = None  # called without gradient on the rows' log-probabilities


def vocab_cross_entropies(targets: Sequence[VocabTarget]) -> list[TokenLoss]:
    """:func:`token_cross_entropy` of ``target.decoder(target.features)`` against ``target.labels``, per target.

    A target's ``sampler``, when given, is called without gradient on its float32 log-probabilities
    (N, V) and its result (N,) is returned as ``samples`` (ELECTRA's generator samples its replacements
    from the very distribution it is trained on). When the first target's decoder has a
    ``cross_entropies`` attribute (put there by a speed backend, :mod:`spanlm.accel`), it computes all
    the targets instead: the same values and gradients to float tolerance.
    """
    backend = getattr(targets[0].decoder, "cross_entropies", None)
    if backend is not None and torch.is_grad_enabled():  # an evaluation takes the plain path: its tallies
        return backend(targets)
    return plain_vocab_cross_entropies(targets)


def plain_vocab_cross_entropies(targets: Sequence[VocabTarget]) -> list[TokenLoss]:
    """:func:`vocab_cross_entropies` as plain tensor operations, gradients by autograd.

    No Python loop over rows and no host read of a tensor value: on a GPU it queues without waiting,
    and ``torch.compile`` traces it into the step's graph (the loop over targets is over a fixed
    number of heads).
    """
    results = []
    for target in targets:
        logits = target.decoder(target.features)  # (N, V), under autocast in its dtype
        loss = token_cross_entropy(logits, target.labels)
        if target.sampler is not None:
            with torch.no_grad(), torch.autocast(device_type=logits.device.type, enabled=False):
                loss.samples = target.sampler(torch.log_softmax(logits.detach().float(), dim=-1))  # (N,)
        results.append(loss)
    return results


def prediction_tallies(**parts: TokenLoss) -> dict[str, Tensor]:
    """In an evaluation, each part's (V,) tallies as ``{name}_target_counts`` and ``{name}_predicted_counts``: the
    engine sums them over the held-out batches into the part's unigram line (the accuracy of always guessing the
    most frequent target of this masking) and the diversity of its predictions (spanlm.train.health). Empty in
    training."""
    return {
        f"{name}_{kind}_counts": tally
        for name, loss in parts.items()
        if loss.tallies is not None
        for kind, tally in zip(("target", "predicted"), loss.tallies)
    }


def masked_lm_loss(mlm: TokenLoss) -> dict[str, Tensor]:
    """MLM loss per target token, ``MLM_sum / n_mlm`` (0 when there is no target), and its metrics."""
    loss = mlm.total / mlm.count.clamp(min=1)
    return {
        "loss": loss,
        "mlm_loss": loss.detach(),
        "n_mlm": mlm.count,
        "mlm_accuracy": mlm.accuracy,
        **prediction_tallies(mlm=mlm),
    }


def span_bert_loss(mlm: TokenLoss, sbo: TokenLoss, w_sbo: float = 1.0) -> dict[str, Tensor]:
    """SpanBERT's ``MLM_sum / n_mlm + w_sbo · SBO_sum / (n_sbo + 1)`` and its parts.

    Returns ``loss`` (with gradient), the two normalised parts ``mlm_loss`` and ``sbo_loss`` (before
    ``w_sbo``; detached, for logging), the target counts ``n_mlm`` / ``n_sbo`` and the masked-token
    accuracies ``mlm_accuracy`` / ``sbo_accuracy``. Zero MLM targets make the MLM part 0, not NaN.
    """
    mlm_part = mlm.total / mlm.count.clamp(min=1)
    sbo_part = sbo.total / (sbo.count + 1)
    return {
        "loss": mlm_part + w_sbo * sbo_part,
        "mlm_loss": mlm_part.detach(),
        "sbo_loss": sbo_part.detach(),
        "n_mlm": mlm.count,
        "n_sbo": sbo.count,
        "mlm_accuracy": mlm.accuracy,
        "sbo_accuracy": sbo.accuracy,
        **prediction_tallies(mlm=mlm, sbo=sbo),
    }
