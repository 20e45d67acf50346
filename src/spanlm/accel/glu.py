"""ModernBERT's GeGLU feed-forward gate (Shazeer 2020, GLU variants) as one autograd function.

Why: transformers splits the input projection's output in two with ``chunk`` and computes ``gelu(input) · gate``;
autograd then builds the projection's gradient by concatenating the two halves' gradients, one more pass over the
widest activation of the layer. Here the backward pass writes both halves into one tensor:

    out = gelu(x₁)·x₂        ∂x₁ = gelu′(x₁)·(g·x₂)        ∂x₂ = g·gelu(x₁)

with ATen's own ``gelu`` and ``gelu_backward``, so the values are transformers' (tests/accel/test_glu.py).

Only float32 CPU tensors outside autocast and torch.compile, with the exact GELU (ModernBERT's default
``hidden_activation``), take this path; everything else runs the module's own forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn import functional as F
from transformers.models.modernbert.modeling_modernbert import ModernBertMLP

from spanlm.accel.subclasses import use_subclasses


class _GatedGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, projected: Tensor) -> Tensor:
        # projected (..., 2I): the input half, then the gate half, as ModernBERT's chunk(2) splits them.
        inputs, gate = projected.chunk(2, dim=-1)
        activated = F.gelu(inputs)
        ctx.save_for_backward(projected, activated)
        return activated * gate

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        projected, activated = ctx.saved_tensors
        inputs, gate = projected.chunk(2, dim=-1)
        grad_projected = torch.empty_like(projected)
        grad_inputs, grad_gate = grad_projected.chunk(2, dim=-1)
        torch.mul(grad, activated, out=grad_gate)
        torch.ops.aten.gelu_backward.grad_input(grad * gate, inputs, grad_input=grad_inputs)
        return grad_projected


def _exact_gelu(module: nn.Module) -> bool:
    return getattr(module, "act", None) is F.gelu  # transformers' GELUActivation around torch's exact GELU


class FusedGegluModernBertMLP(ModernBertMLP):
    """ModernBERT's feed-forward block with its gate through :class:`_GatedGelu` (module docstring)."""

    def forward(self, hidden_states: Tensor) -> Tensor:
        if (
            hidden_states.device.type == "cpu"
            and hidden_states.dtype == torch.float32
            and self.Wi.weight.dtype == torch.float32
            and _exact_gelu(self.act)
            and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling()
        ):
            return self.Wo(self.drop(_GatedGelu.apply(self.Wi(hidden_states))))
        return super().forward(hidden_states)


def use_fused_geglu(model: nn.Module) -> nn.Module:
    """Make every ModernBERT feed-forward block of ``model`` a :class:`FusedGegluModernBertMLP`, in place."""
    return use_subclasses(model, {ModernBertMLP: FusedGegluModernBertMLP})
