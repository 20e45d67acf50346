"""Rotary position embeddings (Su et al. 2021, RoFormer) of ModernBERT and EuroBERT as one autograd function.

Why: transformers applies RoPE as ``q·cos + rotate_half(q)·sin`` on the query and on the key, where
``rotate_half`` slices both halves, negates one and concatenates them. At the sizes spanlm pretrains on a CPU each
of those is a pass over the tensor, and autograd mirrors them backwards (a zero-filled gradient per slice, the
concatenation's split, the negation). Here, with ``x = [x₁, x₂]`` split at the middle of the head dimension:

    out₁ = x₁·cos₁ − x₂·sin₁        ∂x₁ = g₁·cos₁ + g₂·sin₂
    out₂ = x₂·cos₂ + x₁·sin₂        ∂x₂ = g₂·cos₂ − g₁·sin₁

four element-wise passes each way, written into one output, and ModernBERT's query and key rotated together as
part of its fused projection, whose gradient comes back whole. The arithmetic is transformers' (the same
products and sums per element), so a run gives the same losses either way up to float rounding
(tests/accel/test_rotary.py). ``cos`` and ``sin`` are functions of the positions only: no gradient reaches them.

Only float32 CPU tensors outside autocast and torch.compile take this path; everything else runs the module's own
forward. Parameters, state-dict keys and configs are untouched.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.eurobert.modeling_eurobert import EuroBertAttention
from transformers.models.modernbert.modeling_modernbert import ModernBertAttention

from spanlm.accel.subclasses import use_subclasses


class _Rotary(torch.autograd.Function):
    """Rotate the first ``rotated`` entries of ``x``'s dimension −3 (all of them when None); the rest pass through.

    ModernBERT's fused projection (B, L, 3, heads, D) goes in whole, its query and key rotated and its value
    copied: the gradient comes back as one tensor, where slicing the query and key out first would make autograd
    zero-fill and copy a projection-sized gradient per slice."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor, rotated: int | None) -> Tensor:
        # x (..., D) any strides; cos, sin broadcast to its rotated part.
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if rotated is None:
            _rotate(x, cos, sin, out)
        else:
            _rotate(x[..., :rotated, :, :], cos, sin, out[..., :rotated, :, :])
            out[..., rotated:, :, :] = x[..., rotated:, :, :]
        ctx.save_for_backward(cos, sin)
        ctx.rotated = rotated
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        grad_x = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
        if ctx.rotated is None:
            _rotate_back(grad, cos, sin, grad_x)
        else:
            rotated = ctx.rotated
            _rotate_back(grad[..., :rotated, :, :], cos, sin, grad_x[..., :rotated, :, :])
            grad_x[..., rotated:, :, :] = grad[..., rotated:, :, :]
        return grad_x, None, None, None


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor) -> None:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    torch.mul(x1, cos[..., :half], out=out[..., :half])
    out[..., :half].addcmul_(x2, sin[..., :half], value=-1.0)
    torch.mul(x2, cos[..., half:], out=out[..., half:])
    out[..., half:].addcmul_(x1, sin[..., half:])


def _rotate_back(grad: Tensor, cos: Tensor, sin: Tensor, out: Tensor) -> None:
    """The transpose of :func:`_rotate`: sin's halves swap places and the sign moves to the second half."""
    half = grad.shape[-1] // 2
    g1, g2 = grad[..., :half], grad[..., half:]
    torch.mul(g1, cos[..., :half], out=out[..., :half])
    out[..., :half].addcmul_(g2, sin[..., half:])
    torch.mul(g2, cos[..., half:], out=out[..., half:])
    out[..., half:].addcmul_(g1, sin[..., :half], value=-1.0)


def rotary(x: Tensor, cos: Tensor, sin: Tensor, rotated: int | None = None) -> Tensor:
    """``x·cos + rotate_half(x)·sin`` (``cos``, ``sin`` broadcast to ``x``), as transformers' RoPE computes it; with
    ``rotated``, only on ``x[..., :rotated, :, :]`` and the rest of ``x`` as it is (module docstring)."""
    return _Rotary.apply(x, cos.detach(), sin.detach(), rotated)


def _applies(states: Tensor, cos: Tensor) -> bool:
    return (
        states.device.type == "cpu"
        and states.dtype == torch.float32
        and cos.dtype == torch.float32
        and states.shape[-1] % 2 == 0
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


class FusedRotaryModernBertAttention(ModernBertAttention):
    """ModernBERT's attention with the query and key rotated together by :func:`rotary` (module docstring)."""

    def forward(self, hidden_states: Tensor, position_embeddings=None, attention_mask=None, **kwargs):
        if (
            position_embeddings is None
            or not _applies(hidden_states, position_embeddings[0])
            or self.Wqkv.weight.dtype != torch.float32
        ):
            return super().forward(hidden_states, position_embeddings, attention_mask, **kwargs)
        input_shape = hidden_states.shape[:-1]
        qkv = self.Wqkv(hidden_states).view(*input_shape, 3, -1, self.head_dim)  # (B, L, 3, heads, head_dim)
        cos, sin = (table[..., None, None, :] for table in position_embeddings)  # (B, L, 1, 1, head_dim)
        qkv = rotary(qkv, cos, sin, rotated=2)  # the query and key rotated, the value as it was
        query_states, key_states, value_states = (states.transpose(1, 2) for states in qkv.unbind(dim=-3))
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, None)
        attn_output, attn_weights = attention(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.head_dim**-0.5,
            sliding_window=self.sliding_window,
            deterministic=self.deterministic_flash_attn,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.out_drop(self.Wo(attn_output)), attn_weights


class FusedRotaryEuroBertAttention(EuroBertAttention):
    """EuroBERT's attention with the query and key each rotated by :func:`rotary` (module docstring)."""

    def forward(self, hidden_states: Tensor, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        if (
            cache is not None
            or position_embeddings is None
            or not _applies(hidden_states, position_embeddings[0])
            or self.q_proj.weight.dtype != torch.float32
        ):
            return super().forward(hidden_states, position_embeddings, attention_mask, cache, **kwargs)
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        cos, sin = (table[..., None, :] for table in position_embeddings)  # (B, L, 1, head_dim)
        query_states = rotary(self.q_proj(hidden_states).view(hidden_shape), cos, sin).transpose(1, 2)
        key_states = rotary(self.k_proj(hidden_states).view(hidden_shape), cos, sin).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # (B, kv heads, L, head_dim)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, None)
        attn_output, attn_weights = attention(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


FUSED = {ModernBertAttention: FusedRotaryModernBertAttention, EuroBertAttention: FusedRotaryEuroBertAttention}


def use_fused_rotary(model: nn.Module) -> nn.Module:
    """Make every ModernBERT / EuroBERT attention module of ``model`` its ``FusedRotary…`` subclass, in place."""
    return use_subclasses(model, FUSED)
