"""Dropout whose CPU masks cost a quarter of a random draw per element, and the attention that uses it.

Why: on CPU, ``torch.nn.functional.dropout`` draws one Bernoulli sample per element from the serial
Mersenne-Twister generator and is the single most expensive non-matmul operation of a small BERT
training step: 13 dropout calls (embeddings, and attention probabilities, attention output and FFN
output in every layer) take ~13% of a SpanBERT step at hidden 256 / seq 128, and the attention
probabilities' dropout alone grows with seq² (bench/train_step.py). Here one 64-bit random word gives
the keep decisions of four elements: each 16-bit quarter is kept when it is at or above the drop
threshold, so

    P(drop) = round(p · 2¹⁶) / 2¹⁶       (p = 0.1 → 0.1000061; |error| ≤ 2⁻¹⁷ for every p)

and the kept elements are scaled by 1 / (1 − P(drop)), which keeps the expectation exact. Everything
else is inverted dropout as in BERT (Devlin et al. 2019; hidden and attention-probability dropout
0.1). The words come from a SplitMix64 stream keyed by a draw from torch's default generator, so
seeding and checkpointed RNG states make runs reproducible exactly as with ``nn.Dropout``; the float
decisions are applied as they are drawn in one compiled pass (:mod:`spanlm.native`), and drawn again
from the same key in the backward pass instead of a stored mask; where that cannot be built, a float
multiplier comes from the words of :mod:`spanlm.models.splitmix` (numba) and an int16 clamp — the same
decisions and results bit for bit. On other devices (CUDA's fused Philox dropout is already cheap), under
``torch.compile`` (inductor fuses ``F.dropout`` itself) and at p = 0 or 1 it is
``torch.nn.functional.dropout``. bench/dropout.py: 8.7–12.5× faster than ``F.dropout`` (forward +
backward) on a layer's hidden states and attention probabilities at seq 128, 4.2–5.1× on 512 × 512
attention probabilities (4.9–5.3× and 2.2× without spanlm.native).

:func:`use_fast_dropout` puts it into a transformers encoder: every ``nn.Dropout`` module becomes a
:class:`FastDropout`, and SDPA attention becomes ``"spanlm_sdpa"`` (registered with transformers'
``AttentionInterface``): PyTorch's fused SDPA kernel whenever attention dropout is off (evaluation,
inference) and, in training, the same computation PyTorch's SDPA runs on CPU with dropout (its math
path: scores, softmax, dropout, weighted sum) with this dropout on the probabilities. BERT, RoBERTa and
ELECTRA self-attention modules also get :mod:`spanlm.models.attention`'s training forward (the same
arithmetic, projections to context in one autograd function). None of this changes a parameter, a
state-dict key or the saved ``config.json``: exported models load with stock transformers.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from spanlm import native

ATTENTION_NAME = "spanlm_sdpa"
_LEVELS = 1 << 16  # keep decisions are made on 16-bit words


def fast_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of ``x`` with P(drop) = round(p·2¹⁶)/2¹⁶ (see the module docstring)."""
    if not training or p == 0.0:
        return x
    dropped_levels = round(p * _LEVELS)
    # F.dropout: off the CPU, at p ≥ 1 − 2⁻¹⁷ (every level dropped: no finite scale) and under
    # torch.compile, where inductor fuses it into one kernel with its own seeded RNG stream (NumPy calls
    # would only break the graph).
    if x.device.type != "cpu" or not 0.0 < p < 1.0 or dropped_levels == _LEVELS or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    if dropped_levels == 0:  # p < 2⁻¹⁷: nothing would ever be dropped
        return x
    key, threshold, scale = dropout_stream(p)
    if x.dtype == torch.float32 and native.kernels() is not None:
        return _KeyedDropout.apply(x, key, threshold, scale)
    # A float multiplier (not a bool mask) keeps the whole thing one plain autograd multiply.
    return x * dropout_multiplier(x.shape, key, threshold, x.dtype, scale)


def fast_dropout_applies(p: float) -> bool:
    """Whether :func:`fast_dropout` draws its own mask at ``p`` (on CPU, outside torch.compile)."""
    return 0 < round(p * _LEVELS) < _LEVELS and not torch.compiler.is_compiling()


def dropout_stream(p: float) -> tuple[int, int, float]:
    """One dropout call at ``p`` (requires :func:`fast_dropout_applies`): the key of its random words, the
    threshold its 16-bit quarters (read as signed int16) are kept at or above — the lowest round(p·2¹⁶) of
    the 2¹⁶ values drop — and the scale 1 / (1 − P(drop)) of the kept elements."""
    dropped_levels = round(p * _LEVELS)
    return _stream_key(), dropped_levels - _LEVELS // 2, _LEVELS / (_LEVELS - dropped_levels)


class _KeyedDropout(torch.autograd.Function):
    """``x`` times the multiplier of the stream (key, threshold, kept), formed on the fly by spanlm.native's
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
    logical (row-major) order deciding on the stream's i-th quarter; ``out`` may be ``x`` itself, and both
    may be strided views with a dense last dimension. Applied again to the upstream gradient with the same
    stream, it is the backward pass (dropout is linear in x). spanlm.native's kernel forms the decisions
    on the fly (float32); elsewhere :func:`dropout_multiplier` draws them — the same results bit for bit."""
    kernels = native.kernels() if x.dtype == out.dtype == torch.float32 and x.device.type == "cpu" else None
    if kernels is not None:
        kernels.dropout_apply(x, out, key, threshold, kept)
        return out
    return torch.mul(x, dropout_multiplier(x.shape, key, threshold, x.dtype, kept), out=out)


def dropout_multiplier(shape: torch.Size | tuple[int, ...], key: int, threshold: int, dtype: torch.dtype = torch.float32,
                       kept: float = 1.0) -> Tensor:
    """A tensor of ``shape``: 0 where dropped, ``kept`` elsewhere, element i (row-major) deciding on the i-th
    16-bit quarter of the stream's words (four quarters per word; see :func:`dropout_stream`)."""
    n = math.prod(shape)
    from spanlm.models.splitmix import splitmix64  # numba: imported at the first draw, not with spanlm

    quarters = torch.from_numpy(splitmix64(key, (n + 3) // 4).view(np.int16)[:n]).view(shape)  # 4 per word
    # Clamping to {threshold − 1, threshold} and shifting gives 0 (drop) / 1 (keep) in int16 arithmetic,
    # which ATen vectorises ~5× better than a boolean comparison followed by a where (bench/dropout.py).
    keep = quarters.clamp(threshold - 1, threshold).sub_(threshold - 1).to(dtype)
    return keep.mul_(kept) if kept != 1.0 else keep


def _stream_key() -> int:
    """The key of one call's SplitMix64 stream of uniform 64-bit words: one draw of torch's default generator.

    Why not ``torch.Tensor.random_``: CPU torch draws from a serial Mersenne Twister at ~5 ns per 64-bit
    word, NumPy's PCG64 ``random_raw`` at 2.5–4.7 ns; the compiled SplitMix64 loop takes ~0.65 ns
    (:mod:`spanlm.models.splitmix`), which makes the whole SpanBERT training step of bench/train_step.py
    1–1.5% faster at seq 128 and 5% at seq 512 (alternating steps, paired medians). Keying each call's
    stream with a draw from torch's generator keeps dropout reproducible from ``torch.manual_seed`` and
    from the RNG states a checkpoint restores, exactly as ``nn.Dropout``'s samples are. (Every stream is
    a stretch of SplitMix64's one 2⁶⁴-long cycle starting at its key, so over a long run two calls'
    stretches may share some words at shifted positions (expected M²·c̄/2⁶³ such pairs over M calls of
    c̄ words: ~0.02 over a million calls at seq 128, ~0.17 at seq 512), which puts the same bits into
    unrelated positions of unrelated masks: harmless here.)
    """
    return int(torch.empty((), dtype=torch.int64).random_())  # uniform in [0, 2⁶³)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` computed by :func:`fast_dropout` (same ``p``, same ``train()`` / ``eval()`` switch).

    ``inplace`` is kept for the repr but not honoured: the output is always a new tensor.
    """

    def forward(self, x: Tensor) -> Tensor:
        return fast_dropout(x, self.p, self.training)


def fast_dropout_sdpa_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                                attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                                is_causal: bool | None = None, **kwargs):
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
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
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
    """Switch ``model``'s dropouts to :class:`FastDropout` and its SDPA attention to ``"spanlm_sdpa"``, in place;
    BERT / RoBERTa / ELECTRA self-attention then trains through :mod:`spanlm.models.attention` on CPU."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                replacement = FastDropout(child.p, child.inplace)
                replacement.train(child.training)
                setattr(parent, name, replacement)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        register_attention()
        model.set_attn_implementation(ATTENTION_NAME)
        from spanlm.models.attention import use_fused_self_attention  # it builds on this module

        use_fused_self_attention(model)
    return model
