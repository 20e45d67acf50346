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

Training computes the heads' vocabulary projection and the cross-entropy in one autograd function,
:func:`decoded_cross_entropy`: the gradient of the logits (softmax − one-hot) is formed in the forward
pass, in place over the log-probabilities, so neither the (N, V) logits nor autograd's separate
log-softmax and NLL backward passes over them are kept or run (bench/train_step.py).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor
from torch.nn import functional as F

IGNORE_INDEX = -100


@dataclasses.dataclass
class TokenLoss:
    """Un-normalised cross-entropy of a set of target rows: the parts a caller normalises or all-reduces."""

    total: Tensor  # float32 scalar: summed cross-entropy
    count: Tensor  # int64 scalar: number of targets
    correct: Tensor  # int64 scalar: targets whose arg-max prediction is the label (no gradient)
    samples: Tensor | None = None  # (N,) what ``decoded_cross_entropy``'s ``sampler`` drew from the rows (no gradient)

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
        correct = ((logits.argmax(dim=-1) == labels) & valid).sum()
    return TokenLoss(total=total, count=valid.sum(), correct=correct)


class LogitsWorkspace:
    """A float32 (N, V) buffer one head's :func:`decoded_cross_entropy` reuses from step to step.

    Why: the projection's output is tens of MB (300 rows × 30k vocabulary: 37 MB); a fresh tensor of
    that size comes from the allocator as new pages, and the first touch of every page costs a page fault
    — a third of the projection matmul's time on CPU (bench/train_step.py). The buffer is lent while a
    backward pass still needs it (``busy``) and returned by that backward; a forward that finds it busy
    (two forwards before one backward, or a graph that is never backpropagated) gets a fresh tensor, so
    reuse is only ever an optimisation. Writing into a buffer that an old graph saved bumps its version
    counter, so a stale backward raises instead of reading overwritten values.
    """

    def __init__(self) -> None:
        self.buffer: Tensor | None = None
        self.busy = False

    def take(self, rows: int, vocab: int, device: torch.device, keep: bool) -> tuple[Tensor, bool]:
        """An uninitialised float32 (rows, vocab) tensor, and whether it is the lent buffer.

        ``keep``: the caller holds on to it (for a backward pass) and calls :meth:`release` when done,
        if it was lent.
        """
        if self.busy:
            return torch.empty(rows, vocab, device=device), False
        buffer = self.buffer
        if buffer is None or buffer.device != device or buffer.shape[1] != vocab or buffer.shape[0] < rows:
            # 25% headroom: the number of targets varies from batch to batch.
            buffer = self.buffer = torch.empty(max(rows + rows // 4, 1), vocab, device=device)
        self.busy = keep
        return buffer[:rows], keep  # a leading-rows slice of a row-major buffer is contiguous

    def release(self) -> None:
        self.busy = False


class _DecodedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of ``features @ weightᵀ + bias`` against ``labels``, and the correct count.

    Forward keeps only the logits' gradient G = softmax − one-hot (rows of ignored labels zero), built in
    place in the one (N, V) float32 buffer the logits were computed into (log-softmax and exp run in
    place: a 30k vocabulary makes every extra (N, V) pass or allocation cost as much as a small matmul);
    backward is then two matmuls: ∂features = g·G·W and ∂W = Gᵀ·(g·features) (∂bias = g·ΣG), in the
    dtype the projection ran in (bf16 under autocast). The scalar g scales the (N, E) side, never the
    (V, E) one.
    """

    @staticmethod
    def forward(ctx, features: Tensor, weight: Tensor, bias: Tensor, labels: Tensor, sampler,
                workspace: LogitsWorkspace | None, keep: bool):
        # keep: a backward pass will come (grad mode on, an input needs a gradient); the buffer becomes its input
        n, vocab = features.shape[0], weight.shape[0]
        if workspace is not None:
            logits, lent = workspace.take(n, vocab, features.device, keep)  # (N, V)
        else:
            logits, lent = torch.empty(n, vocab, device=features.device), False
        ctx.workspace = workspace if lent else None  # backward returns the buffer
        if torch.is_autocast_enabled(features.device.type):  # bf16 logits, rounded as the decoder's addmm rounds them
            projected = torch.addmm(bias, features, weight.t())
            ctx.compute_dtype = projected.dtype
            logits.copy_(projected)
            del projected
        else:  # float32: addmm would first copy the broadcast bias into the (N, V) output, one pass more
            ctx.compute_dtype = torch.float32
            torch.mm(features, weight.t(), out=logits)
            logits += bias
        valid = labels != IGNORE_INDEX
        safe = labels.clamp(min=0)
        rows = torch.arange(labels.shape[0], device=labels.device)
        # Correct = the label's logit is the row's maximum (a tie with another token counts as correct;
        # float32 logits of different tokens are practically never equal). One max pass, cheaper than argmax.
        correct = ((logits[rows, safe] >= logits.amax(dim=-1)) & valid).sum()
        log_probs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: row-wise, each row read before written
        total = -(log_probs[rows, safe] * valid).sum()
        # Draw from the rows before the buffer becomes the gradient (ELECTRA's generator samples its
        # replacements from the very distribution it is trained on: no second projection).
        samples = sampler(log_probs) if sampler is not None else torch.empty(0, dtype=torch.long, device=labels.device)
        gradient = log_probs.exp_()  # softmax, in place
        gradient[rows, safe] -= valid.to(gradient.dtype)  # − one-hot
        if not bool(valid.all()):
            gradient.mul_(valid[:, None])
        ctx.save_for_backward(features, weight, gradient)
        ctx.mark_non_differentiable(correct, samples)
        return total, correct, samples

    @staticmethod
    def backward(ctx, grad_total: Tensor, grad_correct: Tensor, grad_samples: Tensor):
        features, weight, gradient = ctx.saved_tensors
        compute = gradient.to(ctx.compute_dtype)
        grad_features = (compute @ weight.to(ctx.compute_dtype)).to(features.dtype) * grad_total  # (N, E)
        scaled_features = (features * grad_total).to(ctx.compute_dtype)  # (N, E): g applied on the small side
        grad_weight = (compute.t() @ scaled_features).to(weight.dtype)  # (V, E)
        grad_bias = gradient.sum(0).to(weight.dtype) * grad_total  # (V,)
        del gradient, compute
        if ctx.workspace is not None:
            ctx.workspace.release()
        return grad_features, grad_weight, grad_bias, None, None, None, None


def decoded_cross_entropy(features: Tensor, decoder, labels: Tensor, sampler=None) -> TokenLoss:
    """:func:`token_cross_entropy` of ``decoder(features)`` without materialising the logits for autograd.

    ``features`` (N, E) are a head's rows before its vocabulary projection; ``decoder`` has ``weight``
    (V, E) and ``bias`` (V,) (:class:`~spanlm.heads.mlm.TiedDecoder`), and optionally a ``workspace``
    (:class:`LogitsWorkspace`) whose buffer the logits are computed into. Equal to
    ``token_cross_entropy(decoder(features), labels)`` in value and gradients. ``sampler``, when given,
    is called without gradient on the float32 log-probabilities (N, V) — the logits shifted per row, so
    any arg-max over them is the logits' — and its result (N,) is returned as ``samples``.
    """
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (features, decoder.weight, decoder.bias))
    total, correct, samples = _DecodedCrossEntropy.apply(features, decoder.weight, decoder.bias, labels, sampler,
                                                         getattr(decoder, "workspace", None), keep)
    return TokenLoss(total=total, count=(labels != IGNORE_INDEX).sum(), correct=correct,
                     samples=samples if sampler is not None else None)


def masked_lm_loss(mlm: TokenLoss) -> dict[str, Tensor]:
    """MLM loss per target token, ``MLM_sum / n_mlm`` (0 when there is no target), and its metrics."""
    loss = mlm.total / mlm.count.clamp(min=1)
    return {"loss": loss, "mlm_loss": loss.detach(), "n_mlm": mlm.count, "mlm_accuracy": mlm.accuracy}


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
    }
