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
:func:`decoded_cross_entropies`: the gradient of the logits (softmax − one-hot) is formed in the forward
pass, in place over the log-probabilities, and multiplied out into the gradients of the features,
the decoder weight and bias right away, while it is still in cache; so neither the (N, V) logits nor
autograd's separate log-softmax and NLL backward passes over them are kept or run, and heads tied to
the same embedding (SpanBERT's MLM and SBO) share one projection and one (V, E) weight gradient
(bench/train_step.py). Each part says how the loss will weigh it (``loss_weight``, from
:func:`masked_lm_weight` / :func:`span_bert_weights`), which is what lets the gradients be formed early.
That is the CPU path; other devices and compiled code take :func:`plain_cross_entropies`, the same
losses as plain tensor operations without a host sync (:mod:`spanlm.heads.device_path`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from spanlm import native
from spanlm.heads.device_path import device_agnostic
from spanlm.heads.tied_embedding import TiedGradient

IGNORE_INDEX = -100
ROWS_PER_BLOCK = 32  # rows of (N, V) logits per block of element-wise passes: 4 MB at a 30k vocabulary


@dataclasses.dataclass
class TokenLoss:
    """Un-normalised cross-entropy of a set of target rows: the parts a caller normalises or all-reduces."""

    total: Tensor  # float32 scalar: summed cross-entropy
    count: Tensor  # int64 scalar: number of targets
    correct: Tensor  # int64 scalar: targets whose arg-max prediction is the label (no gradient)
    samples: Tensor | None = None  # (N,) what the target's ``sampler`` drew from its rows (no gradient; DecodedTarget)

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
    """A float32 (N, V) buffer one decoder's :func:`decoded_cross_entropies` reuses from step to step.

    Why: the projection's output is tens of MB (300 rows × 30k vocabulary: 37 MB); a fresh tensor of
    that size comes from the allocator as new pages, and the first touch of every page costs a page fault
    — a third of the projection matmul's time on CPU (bench/train_step.py). The buffer lives only within
    one forward call: the gradients are formed there, so no graph ever holds on to it.
    """

    def __init__(self) -> None:
        self.buffer: Tensor | None = None

    def take(self, rows: int, vocab: int, device: torch.device) -> Tensor:
        """An uninitialised float32 (rows, vocab) tensor backed by the reused buffer."""
        buffer = self.buffer
        if buffer is None or buffer.device != device or buffer.shape[1] != vocab or buffer.shape[0] < rows:
            # 25% headroom: the number of targets varies from batch to batch.
            buffer = self.buffer = torch.empty(max(rows + rows // 4, 1), vocab, device=device)
        return buffer[:rows]  # a leading-rows slice of a row-major buffer is contiguous


@dataclasses.dataclass
class DecodedTarget:
    """One head's target rows for :func:`decoded_cross_entropies`.

    ``loss_weight`` is ∂loss/∂total: the factor by which the caller's loss will multiply this part's
    summed cross-entropy (1 / n_targets for a per-token mean, times the part's weight). The gradients are
    formed in the forward pass on that assumption; a backward pass that brings another factor still gets
    exact gradients (rescaled, or recomputed when the parts' factors are not in proportion), only slower.
    """

    features: Tensor  # (N, E): the head's rows before its vocabulary projection
    decoder: nn.Module  # ``weight`` (V, E), ``bias`` (V,), optionally a ``workspace`` (LogitsWorkspace)
    labels: Tensor  # (N,); IGNORE_INDEX rows are not targets
    loss_weight: float | Tensor = 1.0
    sampler: Callable[[Tensor], Tensor] | None = None  # called without gradient on the rows' log-probabilities


def count_targets(labels: Tensor) -> Tensor:
    """The number of target rows of ``labels``, an int64 scalar on their device (no host read)."""
    return (labels != IGNORE_INDEX).sum()


@dataclasses.dataclass
class _Plan:
    """The non-tensor inputs of one :class:`_DecodedCrossEntropy` call (parts are consecutive row ranges)."""

    sizes: list[int]
    loss_weights: list[float]
    samplers: list[Callable[[Tensor], Tensor] | None]
    workspace: LogitsWorkspace | None
    gradients: bool  # a backward pass will come: form the gradients now
    tied: TiedGradient | None  # the weight's lookup in this forward pass, which can deliver its gradient

    @property
    def segments(self) -> list[tuple[int, int]]:
        ends = list(itertools.accumulate(self.sizes))
        return [(end - size, end) for size, end in zip(self.sizes, ends)]


def _decode(features: Tensor, weight: Tensor, biases: Sequence[Tensor], labels: Tensor, plan: _Plan,
            loss_weights: Sequence[float] | None):
    """Per-part summed cross-entropy, correct counts and samples of ``features @ weightᵀ + bias_part``;
    with ``loss_weights``, also the gradients of ``Σ_p loss_weight_p · total_p`` w.r.t. features, weight, biases.

    The logits are computed into one float32 (N, V) buffer, which then becomes log-probabilities and the
    logits' gradient G = softmax − one-hot in place (a 30k vocabulary makes every extra (N, V) pass or
    allocation cost as much as a small matmul). Those element-wise passes run over blocks of
    ``ROWS_PER_BLOCK`` rows, so that each block stays in cache from its first pass to its last; on CPU
    in float32, spanlm's compiled kernel (:mod:`spanlm.native`) does the same arithmetic a row at a time
    in one loop instead, where it could be built (half the time of the passes at a 30k vocabulary). The
    gradient products follow at once, while G is still in cache: ∂features = s·G·W and
    ∂W = Gᵀ·(s·features), s the row's loss weight, applied on the (N, E) side, never the (V, E) one;
    ∂bias_p = s_p·ΣG over the part's rows. Products run in the dtype the projection ran in (bf16 under
    autocast).
    """
    n, vocab = features.shape[0], weight.shape[0]
    logits = plan.workspace.take(n, vocab, features.device) if plan.workspace is not None else torch.empty(n, vocab, device=features.device)
    autocast = torch.is_autocast_enabled(features.device.type)
    if autocast:  # bf16 logits, rounded as each decoder's addmm rounds them
        compute_dtype = torch.get_autocast_dtype(features.device.type)
        for (start, end), bias in zip(plan.segments, biases):
            logits[start:end].copy_(torch.addmm(bias, features[start:end], weight.t()))
    else:  # float32: the bias is added block by block below (addmm would copy it into all of (N, V) first)
        compute_dtype = torch.float32
        torch.mm(features, weight.t(), out=logits)
    valid = labels != IGNORE_INDEX
    safe = labels.clamp(min=0)
    rows = torch.arange(n, device=labels.device)
    losses = torch.empty(n, device=features.device)
    hits = torch.empty(n, dtype=torch.bool, device=features.device)
    samples, grad_biases = [], []
    kernels = native.kernels() if not autocast and logits.device.type == "cpu" else None
    for part, ((start, end), bias, sampler) in enumerate(zip(plan.segments, biases, plan.samplers)):
        bias_gradient = torch.zeros(vocab, device=features.device) if loss_weights is not None else None
        if kernels is not None and sampler is None and bias.dtype == torch.float32:
            # The passes below, a row at a time in one compiled loop: each row stays in cache (spanlm.native)
            kernels.softmax_cross_entropy_rows(logits, bias.detach().contiguous(), safe, valid, losses, hits,
                                               bias_gradient, start, end)
        else:
            # A part whose rows are sampled from is one block: the sampler sees all its rows at once.
            block_rows = ROWS_PER_BLOCK if sampler is None else max(end - start, 1)
            for first in range(start, end, block_rows):
                last = min(first + block_rows, end)
                block, index, label, ok = logits[first:last], rows[:last - first], safe[first:last], valid[first:last]
                if not autocast:
                    block += bias
                # Softmax with one exp per logit (log_softmax followed by exp would take two; exp is what these
                # passes spend their time on): shift by the row maximum m, exponentiate, sum to Z; then the
                # loss is log Z − (logit − m) of the label, and softmax = exp(logit − m) / Z.
                peak = block.amax(dim=-1)  # (R,)
                label_logits = block[index, label]  # (R,)
                # Correct = the label's logit is the row's maximum (a tie with another token counts as correct;
                # float32 logits of different tokens are practically never equal). Cheaper than an argmax pass.
                hits[first:last] = (label_logits >= peak) & ok
                block -= peak[:, None]
                if sampler is not None:
                    # Drawn before the buffer becomes the gradient (ELECTRA's generator samples its replacements
                    # from the very distribution it is trained on: no second projection).
                    samples.append(sampler(block - torch.logsumexp(block, dim=-1, keepdim=True)))
                partition = block.exp_().sum(dim=-1)  # (R,): Z
                losses[first:last] = (partition.log() - (label_logits - peak)) * ok
                if bias_gradient is not None:
                    block.mul_(partition.reciprocal_()[:, None])  # softmax
                    block[index, label] -= ok.to(block.dtype)  # − one-hot
                    if not bool(ok.all()):
                        block.mul_(ok[:, None])
                    bias_gradient += block.sum(0)
        if sampler is None:
            samples.append(torch.empty(0, dtype=torch.long, device=labels.device))
        elif start == end:
            samples.append(sampler(logits[start:end]))
        if bias_gradient is not None:
            grad_biases.append(bias_gradient.to(bias.dtype) * loss_weights[part])
    totals = torch.stack([losses[start:end].sum() for start, end in plan.segments])  # (P,)
    corrects = torch.stack([hits[start:end].sum() for start, end in plan.segments])  # (P,)
    if loss_weights is None:
        return totals, corrects, samples, None
    scale = torch.cat([torch.full((size,), w, dtype=features.dtype, device=features.device)
                       for size, w in zip(plan.sizes, loss_weights)])[:, None]  # (N, 1)
    gradient = logits.to(compute_dtype)
    grad_features = (gradient @ weight.to(compute_dtype)).to(features.dtype) * scale  # (N, E)
    grad_weight = (gradient.t() @ (features * scale).to(compute_dtype)).to(weight.dtype)  # (V, E)
    return totals, corrects, samples, (grad_features, grad_weight, grad_biases)


def _common_factor(upstream: Tensor, assumed: Tensor) -> float | None:
    """r with upstream == r · assumed (to float32 precision), or None when there is none."""
    if not bool(torch.isfinite(upstream).all()):
        return None
    largest = int(assumed.abs().argmax())
    if float(assumed[largest]) == 0.0:
        return 1.0 if not bool(upstream.any()) else None
    factor = float(upstream[largest]) / float(assumed[largest])
    return factor if torch.allclose(upstream, factor * assumed, rtol=1e-6, atol=0.0) else None


class _DecodedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy per part of ``features @ weightᵀ + bias_part`` against ``labels``; correct
    counts and samples per part. Gradients are formed in the forward pass (see :func:`_decode`), for
    the upstream gradient the plan's loss weights announce; backward hands them over (rescaled when the
    upstream gradient is the announced one times a common factor, e.g. 1/grad_accum) or, for any other
    upstream gradient or a second backward through a retained graph, forms them again from the inputs.
    """

    @staticmethod
    def forward(ctx, features: Tensor, weight: Tensor, labels: Tensor, plan: _Plan, *biases: Tensor):
        totals, corrects, samples, gradients = _decode(features, weight, biases, labels, plan,
                                                       plan.loss_weights if plan.gradients else None)
        ctx.plan, ctx.tied = plan, None
        if gradients is not None and plan.tied is not None and plan.tied.accepts():
            plan.tied.pending = gradients[1]  # the lookup's backward adds its rows into it (spanlm.heads.tied_embedding)
            gradients, ctx.tied = (gradients[0], None, gradients[2]), plan.tied
        ctx.gradients = gradients
        ctx.save_for_backward(features, weight, labels, *biases)  # read only to form the gradients again
        ctx.mark_non_differentiable(corrects, *samples)
        return (totals, corrects, *samples)

    @staticmethod
    def backward(ctx, grad_totals: Tensor, grad_corrects: Tensor, *grad_samples: Tensor):
        # Popped, so that the returned tensors are referenced once and AccumulateGrad can take them as .grad.
        gradients, ctx.gradients = ctx.gradients, None
        tied = ctx.tied
        if gradients is not None and tied is not None:  # take the handed-over weight gradient back, for now
            grad_weight, tied.pending = tied.pending, None
            gradients = (gradients[0], grad_weight, gradients[2]) if grad_weight is not None else None
        assumed = torch.tensor(ctx.plan.loss_weights, dtype=grad_totals.dtype)
        factor = _common_factor(grad_totals.detach().cpu(), assumed) if gradients is not None else None
        if factor is None:
            features, weight, labels, *biases = ctx.saved_tensors
            with torch.no_grad():
                gradients = _decode(features, weight, biases, labels, ctx.plan, grad_totals.tolist())[3]
        elif abs(factor - 1.0) > 1e-6:
            grad_features, grad_weight, grad_biases = gradients
            gradients = (grad_features * factor, grad_weight.mul_(factor), [b.mul_(factor) for b in grad_biases])
        grad_features, grad_weight, grad_biases = gradients
        if tied is not None and tied.will_deliver():
            tied.confirm(grad_weight)  # the lookup returns it, its own rows added: the table's one gradient
            grad_weight = None
        return (grad_features, grad_weight, None, None, *grad_biases)


def decoded_cross_entropies(targets: Sequence[DecodedTarget]) -> list[TokenLoss]:
    """:func:`token_cross_entropy` of ``target.decoder(target.features)`` for every target, without
    materialising the logits for autograd; targets whose decoders share one weight (heads tied to the
    same embedding) are projected together, as one stack of rows.

    Equal to ``token_cross_entropy(decoder(features), labels)`` per target in value and gradients
    (exactly what autograd would give for any upstream gradient; fastest when it is the targets'
    ``loss_weight``). A target's ``sampler``, when given, is called without gradient on its float32
    log-probabilities (N, V) — the logits shifted per row, so any arg-max over them is the logits' — and
    its result (N,) is returned as ``samples``.
    """
    if device_agnostic(targets[0].features.device):
        return plain_cross_entropies(targets)
    results: list[TokenLoss | None] = [None] * len(targets)
    groups: dict[int, list[int]] = {}
    for index, target in enumerate(targets):
        groups.setdefault(id(target.decoder.weight), []).append(index)
    for indices in groups.values():
        parts = [targets[i] for i in indices]
        weight = parts[0].decoder.weight
        biases = [part.decoder.bias for part in parts]
        features = parts[0].features if len(parts) == 1 else torch.cat([part.features for part in parts])
        labels = parts[0].labels if len(parts) == 1 else torch.cat([part.labels for part in parts])
        gradients = torch.is_grad_enabled() and any(t.requires_grad for t in (features, weight, *biases))
        plan = _Plan(sizes=[part.features.shape[0] for part in parts],
                     loss_weights=[float(part.loss_weight) for part in parts],
                     samplers=[part.sampler for part in parts],
                     workspace=getattr(parts[0].decoder, "workspace", None), gradients=gradients,
                     tied=getattr(getattr(parts[0].decoder, "embedding", None), "gradient_slot", None))
        totals, corrects, *samples = _DecodedCrossEntropy.apply(features, weight, labels, plan, *biases)
        for k, (i, part) in enumerate(zip(indices, parts)):
            results[i] = TokenLoss(total=totals[k], count=(part.labels != IGNORE_INDEX).sum(), correct=corrects[k],
                                   samples=samples[k] if part.sampler is not None else None)
    return results


def plain_cross_entropies(targets: Sequence[DecodedTarget]) -> list[TokenLoss]:
    """The device-agnostic :func:`decoded_cross_entropies`: projection and float32 cross-entropy as plain
    tensor operations, gradients by autograd (so ``loss_weight`` plays no part).

    No Python loop over rows and no host read of a tensor value: on a GPU it queues without waiting,
    and ``torch.compile`` traces it into the step's graph (the loop over targets is over a fixed
    number of heads). Same values as the CPU path to float tolerance; a sampler gets the float32
    log-probabilities, as there.
    """
    results = []
    for target in targets:
        logits = target.decoder(target.features)  # (N, V): under autocast in its dtype, as the CPU path's addmm
        loss = token_cross_entropy(logits, target.labels)
        if target.sampler is not None:
            with torch.no_grad(), torch.autocast(device_type=logits.device.type, enabled=False):
                loss.samples = target.sampler(torch.log_softmax(logits.detach().float(), dim=-1))  # (N,)
        results.append(loss)
    return results


def decoded_cross_entropy(features: Tensor, decoder, labels: Tensor, sampler=None, loss_weight: float | Tensor = 1.0) -> TokenLoss:
    """:func:`decoded_cross_entropies` of one target."""
    return decoded_cross_entropies([DecodedTarget(features, decoder, labels, loss_weight, sampler)])[0]


def at_least_one(count: int | Tensor) -> int | Tensor:
    """``max(count, 1)`` of a count or a count tensor (a tensor stays on its device: no host read)."""
    return count.clamp(min=1) if isinstance(count, Tensor) else max(count, 1)


def masked_lm_weight(n_mlm: int | Tensor) -> float | Tensor:
    """∂loss/∂MLM_sum of :func:`masked_lm_loss`: the ``loss_weight`` of its :class:`DecodedTarget`."""
    return 1.0 / at_least_one(n_mlm)


def span_bert_weights(n_mlm: int | Tensor, n_sbo: int | Tensor, w_sbo: float = 1.0) -> tuple[float | Tensor, float | Tensor]:
    """∂loss/∂MLM_sum and ∂loss/∂SBO_sum of :func:`span_bert_loss`: its targets' ``loss_weight``."""
    return 1.0 / at_least_one(n_mlm), w_sbo / (n_sbo + 1)


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
