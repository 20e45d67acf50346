"""Dropout whose CPU masks cost a quarter of a random draw per element, and the attention that uses it.

Why: on CPU, ``torch.nn.functional.dropout`` draws one Bernoulli sample per element from the serial
Mersenne-Twister generator, and a BERT training step calls it on every layer's hidden states and attention
probabilities (the latter grow with seq²): it is the most expensive non-matmul operation of a small
model's step. Here one 64-bit random word gives the keep decisions of four elements:
each 16-bit quarter is kept when it is at or above the drop threshold, so

    P(drop) = round(p · 2¹⁶) / 2¹⁶       (p = 0.1 → 0.1000061; |error| ≤ 2⁻¹⁷ for every p)

and the kept elements are scaled by 1 / (1 − P(drop)), which keeps the expectation exact. Everything
else is inverted dropout as in BERT (Devlin et al. 2019; hidden and attention-probability dropout
0.1). The words come from a SplitMix64 stream keyed by a draw from torch's default generator, so
seeding and checkpointed RNG states make runs reproducible exactly as with ``nn.Dropout``; the
decisions are applied as they are drawn, in one compiled pass (:mod:`spanlm.accel.native`), and drawn
again from the same key in the backward pass instead of a stored mask. Where the kernels are missing,
off the CPU, outside float32, under ``torch.compile`` (inductor fuses ``F.dropout`` itself) and at
p = 0 or 1 it is ``torch.nn.functional.dropout``.

:func:`use_fast_dropout` puts it into a transformers encoder: every ``nn.Dropout`` module becomes a
:class:`FastDropout`, and SDPA attention becomes ``"spanlm_sdpa"`` (registered with transformers'
``AttentionInterface``): PyTorch's fused SDPA kernel whenever attention dropout is off (evaluation,
inference) and, in training, the same computation PyTorch's SDPA runs on CPU with dropout (its math
path: scores, softmax, dropout, weighted sum) with this dropout on the probabilities. BERT, RoBERTa and
ELECTRA self-attention modules also get :mod:`spanlm.accel.attention`'s training forward (the same
arithmetic, projections to context in one autograd function; :func:`spanlm.accel.apply` puts in both).
None of this changes a parameter, a
state-dict key or the saved ``config.json``: exported models load with stock transformers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from spanlm.accel import native

ATTENTION_NAME = "spanlm_sdpa"
_LEVELS = 1 << 16  # keep decisions are made on 16-bit words


def fast_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of ``x`` with P(drop) = round(p·2¹⁶)/2¹⁶ (see the module docstring)."""
    if not training or p == 0.0:
        return x
    if not (fast_dropout_applies(p) and kernels_for(x) is not None):
        return F.dropout(x, p, training)
    key, threshold, scale = dropout_stream(p)
    return _KeyedDropout.apply(x, key, threshold, scale)


def kernels_for(x: Tensor):
    """spanlm.accel.native's kernels for a float32 CPU tensor, else None."""
    return native.kernels() if x.dtype == torch.float32 and x.device.type == "cpu" else None


def fast_dropout_applies(p: float) -> bool:
    """Whether :func:`fast_dropout` draws its own mask at ``p`` (a float32 CPU tensor, outside torch.compile).

    Not at p ≥ 1 − 2⁻¹⁷ (every level dropped: no finite scale), nor at p < 2⁻¹⁷ (nothing would ever be
    dropped), nor while torch.compile traces (inductor fuses ``F.dropout`` with its own seeded stream).
    """
    return 0 < round(p * _LEVELS) < _LEVELS and not torch.compiler.is_compiling()


def dropout_stream(p: float) -> tuple[int, int, float]:
    """One dropout call at ``p`` (requires :func:`fast_dropout_applies`): the key of its random words, the
    threshold its 16-bit quarters (read as signed int16) are kept at or above — the lowest round(p·2¹⁶) of
    the 2¹⁶ values drop — and the scale 1 / (1 − P(drop)) of the kept elements."""
    dropped_levels = round(p * _LEVELS)
    return _stream_key(), dropped_levels - _LEVELS // 2, _LEVELS / (_LEVELS - dropped_levels)


class _KeyedDropout(torch.autograd.Function):
    """``x`` times the multiplier of the stream (key, threshold, kept), formed on the fly by spanlm.accel.native's
    kernel: no mask is stored, and the backward pass is the same function of the upstream gradient
    (dropout is linear in x; so it is differentiable any number of times)."""

    @staticmethod
    def forward(ctx, x: Tensor, key: int, threshold: int, kept: float) -> Tensor:
        ctx.stream = (key, threshold, kept)
        x = x.contiguous()
        return apply_dropout(x, torch.empty_like(x), key, threshold, kept)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _KeyedDropout.apply(grad, *ctx.stream), None, None, None


def apply_dropout(x: Tensor, out: Tensor, key: int, threshold: int, kept: float) -> Tensor:
    """``out`` = ``x`` times the multiplier of the stream (key, threshold, kept), element i of ``x`` in its
    logical (row-major) order deciding on the stream's i-th 16-bit quarter (four per SplitMix64 word);
    ``out`` may be ``x`` itself, and both may be strided float32 CPU views with a dense last dimension.
    Applied again to the upstream gradient with the same stream, it is the backward pass (dropout is
    linear in x). Needs spanlm.accel.native's kernels (callers check :func:`kernels_for`)."""
    native.kernels().dropout_apply(x, out, key, threshold, kept)
    return out


def _stream_key() -> int:
    """The key of one call's SplitMix64 stream of uniform 64-bit words: one draw of torch's default generator.

    Why not ``torch.Tensor.random_``: CPU torch draws from a serial Mersenne Twister, several times slower
    per 64-bit word than the kernel's SplitMix64 loop. Keying each call's stream with a
    draw from torch's generator keeps dropout reproducible from ``torch.manual_seed`` and from the RNG
    states a checkpoint restores, exactly as ``nn.Dropout``'s samples are. (Every stream is a stretch of
    SplitMix64's one 2⁶⁴-long cycle starting at its key, so over a long run two calls' stretches may
    share some words at shifted positions — expected M²·c̄/2⁶³ such pairs over M calls of c̄ words — which
    puts the same bits into unrelated positions of unrelated masks: harmless here.)
    """
    return int(torch.empty((), dtype=torch.int64).random_())  # uniform in [0, 2⁶³)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` computed by :func:`fast_dropout` (same ``p``, same ``train()`` / ``eval()`` switch).

    ``inplace`` is kept for the repr but not honoured: the output is always a new tensor.
    """

    def forward(self, x: Tensor) -> Tensor:
        return fast_dropout(x, self.p, self.training)


def fast_dropout_sdpa_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
):
    """transformers' SDPA attention, with :func:`fast_dropout` on the probabilities when training on CPU.

    query / key / value are (B, heads, L, head_dim); returns (B, L, heads, head_dim) and no weights, as
    ``transformers.integrations.sdpa_attention.sdpa_attention_forward`` does. ``attention_mask`` is what
    transformers' ``sdpa_mask`` builds: None (nothing masked) or a boolean (B, 1, L, L) that is True
    where attention is allowed.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
    plain = key.shape[1] == query.shape[1] and kwargs.get("position_bias") is None  # no GQA, no additive bias
    if dropout == 0.0 or causal or query.device.type != "cpu" or not plain or torch.compiler.is_compiling():
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query * scale, key.transpose(-1, -2))  # (B, heads, L, L)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    probabilities = fast_dropout(torch.softmax(scores, dim=-1), dropout)
    output = torch.matmul(probabilities, value)  # (B, heads, L, head_dim)
    return output.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Make ``"spanlm_sdpa"`` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, fast_dropout_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # the masks SDPA takes


def use_fast_dropout(model: nn.Module) -> nn.Module:
    """Switch ``model``'s dropouts to :class:`FastDropout` and the SDPA attention of every transformers model
    in it to ``"spanlm_sdpa"``, in place."""
    from transformers import PreTrainedModel

    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                replacement = FastDropout(child.p, child.inplace)
                replacement.train(child.training)
                setattr(parent, name, replacement)
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and getattr(module.config, "_attn_implementation", None) == "sdpa":
            register_attention()
            module.set_attn_implementation(ATTENTION_NAME)
    return model
