"""The vocabulary cross-entropy on CPU: projection and loss in one autograd function, one pass per row.

Why: over a 30k vocabulary the (N, V) logits of the masked rows are tens of MB, far larger than the
cache, and eager PyTorch makes a pass over them for every element-wise step of log-softmax, NLL and
their backward (bias add, max, subtract, exp, sum, log, gather; then softmax − one-hot), plus autograd
keeps the logits and the log-probabilities. Here:

* the projection writes into a float32 (N, V) buffer the decoder reuses from step to step
  (:class:`LogitsWorkspace`: a fresh tensor that large costs a page fault per 4 KB page on first touch);
* spanlm.accel.native's kernel then turns each row, while it is in cache, into its loss, its arg-max
  hit and the logits' gradient G = softmax − one-hot, in place, adding the bias gradient as it goes;
* the backward pass multiplies G out into the gradients of the features and the weight: ∂features =
  s·G·W and ∂W = Gᵀ·(s·features), s the upstream gradient of the row's part, applied on the (N, E)
  side, never the (V, E) one. Nothing but G is kept, and no host read is needed.

Heads tied to the same embedding (SpanBERT's MLM and SBO) are projected together, as one stack of rows:
one product and one (V, E) weight gradient, which the tied lookup of the same forward pass takes over
(:mod:`spanlm.accel.tied_embedding`). A part with a ``sampler`` (ELECTRA's generator) gets its float32
log-probabilities over all its rows at once, then the same gradient.

The values are :func:`spanlm.heads.losses.plain_vocab_cross_entropies`' to float rounding, gradients
included, for any upstream gradient (tests/accel/test_cross_entropy.py). Only float32 CPU work outside
autocast and torch.compile takes this path; anything else is the plain one.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from spanlm.accel import native
from spanlm.accel.tied_embedding import TiedGradient
from spanlm.heads.losses import IGNORE_INDEX, TokenLoss, VocabTarget, plain_vocab_cross_entropies


class LogitsWorkspace:
    """A float32 (N, V) buffer one decoder reuses from step to step, and lends to one graph at a time.

    The buffer holds the logits' gradient G from a forward pass to its backward pass; a forward pass
    that comes before that backward pass (a second objective call, evaluation) gets a new buffer, which
    the workspace keeps from then on. Autograd's version check refuses a second backward pass through a
    graph whose G another forward pass has overwritten since.
    """

    def __init__(self) -> None:
        self.buffer: Tensor | None = None
        self.lent = False

    def take(self, rows: int, vocab: int, device: torch.device, lend: bool) -> Tensor:
        """An uninitialised float32 (rows, vocab) tensor; ``lend``: it stays taken until :meth:`give_back`."""
        buffer = self.buffer
        if self.lent or buffer is None or buffer.device != device or buffer.shape[1] != vocab or buffer.shape[0] < rows:
            # 25% headroom: the number of targets varies from batch to batch.
            buffer = self.buffer = torch.empty(max(rows + rows // 4, 1), vocab, device=device)
        self.lent = lend
        return buffer[:rows]  # a leading-rows slice of a row-major buffer is contiguous

    def give_back(self) -> None:
        self.lent = False


@dataclasses.dataclass
class _Plan:
    """The non-tensor inputs of one :class:`_FusedCrossEntropy` call (parts are consecutive row ranges)."""

    sizes: list[int]
    samplers: list[Callable[[Tensor], Tensor] | None]
    workspace: LogitsWorkspace | None
    gradient: bool  # a backward pass will come: keep G for it
    tied: TiedGradient | None  # the tied lookup of this forward pass, which can take the weight's gradient

    @property
    def segments(self) -> list[tuple[int, int]]:
        ends = list(itertools.accumulate(self.sizes))
        return [(end - size, end) for size, end in zip(self.sizes, ends)]


def _sampled_part(block: Tensor, bias: Tensor, labels: Tensor, valid: Tensor, sampler, gradient: bool):
    """Loss, hits and samples of a part whose rows are sampled from, over all its rows at once; ``block``
    (R, V) becomes G in place when ``gradient``. Returns (losses, hits, samples, bias gradient or None)."""
    block += bias
    rows = torch.arange(block.shape[0], device=block.device)
    label_logits = block[rows, labels]  # (R,)
    hits = (label_logits >= block.amax(dim=-1)) & valid  # the label's logit is the row's maximum
    block -= torch.logsumexp(block, dim=-1, keepdim=True)  # log-probabilities, in place
    samples = sampler(block)
    losses = -block[rows, labels] * valid
    if not gradient:
        return losses, hits, samples, None
    block.exp_()  # softmax
    block[rows, labels] -= 1.0
    block.mul_(valid[:, None])  # rows that are not targets: no gradient
    return losses, hits, samples, block.sum(0)


class _FusedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy per part of ``features @ weightᵀ + bias_part`` against ``labels``; correct
    counts and samples per part (see the module docstring)."""

    @staticmethod
    def forward(ctx, features: Tensor, weight: Tensor, labels: Tensor, plan: _Plan, *biases: Tensor):
        gradient = plan.gradient
        n, vocab = features.shape[0], weight.shape[0]
        logits = (
            plan.workspace.take(n, vocab, features.device, lend=gradient)
            if plan.workspace is not None
            else torch.empty(n, vocab, device=features.device)
        )
        torch.mm(features, weight.t(), out=logits)
        valid = labels != IGNORE_INDEX
        safe = labels.clamp(min=0)
        losses = torch.empty(n, device=features.device)
        hits = torch.empty(n, dtype=torch.bool, device=features.device)
        samples, bias_gradients = [], []
        for (start, end), bias, sampler in zip(plan.segments, biases, plan.samplers):
            bias = bias.detach()
            if sampler is None:
                bias_gradient = torch.zeros(vocab, device=features.device) if gradient else None
                native.kernels().softmax_cross_entropy_rows(
                    logits, bias.contiguous(), safe, valid, losses, hits, bias_gradient, start, end
                )
                samples.append(torch.empty(0, dtype=torch.long, device=labels.device))
            else:
                losses[start:end], hits[start:end], drawn, bias_gradient = _sampled_part(
                    logits[start:end], bias, safe[start:end], valid[start:end], sampler, gradient
                )
                samples.append(drawn)
            bias_gradients.append(bias_gradient)
        totals = torch.stack([losses[start:end].sum() for start, end in plan.segments])  # (P,)
        corrects = torch.stack([hits[start:end].sum() for start, end in plan.segments])  # (P,)
        ctx.plan = plan
        if gradient:
            ctx.save_for_backward(features, weight, logits, *bias_gradients)  # logits now holds G
        ctx.mark_non_differentiable(corrects, *samples)
        return (totals, corrects, *samples)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_totals: Tensor, grad_corrects: Tensor, *grad_samples: Tensor):
        features, weight, gradient, *bias_gradients = ctx.saved_tensors
        plan = ctx.plan
        if plan.workspace is not None:
            plan.workspace.give_back()
        # The upstream gradient of each part's total, per row: (N, 1)
        scale = torch.cat([grad_totals[part].expand(size) for part, size in enumerate(plan.sizes)])[:, None]
        grad_features = (gradient @ weight) * scale  # (N, E)
        grad_weight = gradient.t() @ (features * scale)  # (V, E)
        grad_biases = [b * grad_totals[part] for part, b in enumerate(bias_gradients)]
        tied = plan.tied
        if tied is not None and tied.will_deliver():
            tied.hand_over(grad_weight)  # the lookup adds its rows into it and returns it: the table's one gradient
            grad_weight = None
        return (grad_features, grad_weight, None, None, *grad_biases)


def _applies(targets: Sequence[VocabTarget]) -> bool:
    """Whether the fused path computes ``targets``: float32 CPU tensors outside autocast and torch.compile,
    with the kernels built."""
    tensors = [t for target in targets for t in (target.features, target.decoder.weight, target.decoder.bias)]
    return (
        all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and native.kernels() is not None
    )


class FusedCrossEntropies:
    """The ``cross_entropies`` a decoder gets from :func:`spanlm.accel.apply` (see
    :func:`spanlm.heads.losses.vocab_cross_entropies`): the fused path where it applies, else the plain one."""

    def __init__(self) -> None:
        self.workspace = LogitsWorkspace()

    def __call__(self, targets: Sequence[VocabTarget]) -> list[TokenLoss]:
        if not _applies(targets):
            return plain_vocab_cross_entropies(targets)
        results: list[TokenLoss | None] = [None] * len(targets)
        groups: dict[int, list[int]] = {}  # decoders sharing one weight: one projection
        for index, target in enumerate(targets):
            groups.setdefault(id(target.decoder.weight), []).append(index)
        for indices in groups.values():
            parts = [targets[i] for i in indices]
            decoder = parts[0].decoder
            features = torch.cat([part.features for part in parts]) if len(parts) > 1 else parts[0].features
            labels = torch.cat([part.labels for part in parts]) if len(parts) > 1 else parts[0].labels
            owner = getattr(decoder, "cross_entropies", None)
            biases = [part.decoder.bias for part in parts]
            plan = _Plan(
                sizes=[part.features.shape[0] for part in parts],
                samplers=[part.sampler for part in parts],
                workspace=owner.workspace if isinstance(owner, FusedCrossEntropies) else None,
                gradient=torch.is_grad_enabled() and any(t.requires_grad for t in (features, decoder.weight, *biases)),
                tied=getattr(getattr(decoder, "embedding", None), "gradient_slot", None),
            )
            totals, corrects, *samples = _FusedCrossEntropy.apply(features, decoder.weight, labels, plan, *biases)
            for k, (i, part) in enumerate(zip(indices, parts)):
                results[i] = TokenLoss(
                    total=totals[k],
                    count=(part.labels != IGNORE_INDEX).sum(),
                    correct=corrects[k],
                    samples=samples[k] if part.sampler is not None else None,
                )
        return results
