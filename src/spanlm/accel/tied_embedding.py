"""The input word embedding of a model whose vocabulary decoder is tied to it: one gradient, no zero fill.

Why: a tied (V, E) table gets two gradients in every pretraining step — the decoder's dense one
(V × E, from the vocabulary projection) and the lookup's, which ``nn.Embedding``'s backward builds as a
dense (V, E) tensor of zeros with the ~B·L looked-up rows added in — and autograd then adds the two:
three passes over the whole table (a zero fill, a read-modify-write and a read) for a few thousand rows
of real data.

Here the decoder's backward (:mod:`spanlm.accel.cross_entropy`) hands its (V, E) weight gradient to
the lookup of the same forward pass, and the lookup's backward adds its rows into that tensor
(``index_add_``) and returns it: the table's one gradient, through the lookup's own autograd edge (so
DDP / FSDP hooks and ``.grad`` accumulation see it as usual). The hand-over only happens when it is
safe to: if autograd will still run this lookup's backward in the same backward pass
(``torch._C._will_engine_execute_node``, what ``torch.autograd.graph.register_multi_grad_hook`` uses)
and no other decoder has handed a gradient over to it in that pass; otherwise the decoder returns its
gradient itself, and the lookup starts from zeros as ``nn.Embedding`` does. Values equal
``nn.Embedding``'s (the padding row gets no gradient from the lookup).
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class TiedGradient:
    """A decoder's weight gradient on its way to the lookup of the same forward pass."""

    def __init__(self) -> None:
        self.node: weakref.ref | None = None  # the lookup's autograd node
        self.pending: Tensor | None = None  # (V, E), handed over by the decoder's backward
        self.pending_task: int | None = None  # the backward pass in which it was handed over
        self.delivered_task: int | None = None  # the backward pass in which the lookup ran

    def will_deliver(self) -> bool:
        """Called in a decoder's backward: may it hand its gradient over (see the module docstring)?"""
        node = self.node() if self.node is not None else None
        task = torch._C._current_graph_task_id()
        return (
            node is not None
            and self.delivered_task != task
            and self.pending_task != task
            and torch._C._will_engine_execute_node(node)
        )

    def hand_over(self, gradient: Tensor) -> None:
        self.pending, self.pending_task = gradient, torch._C._current_graph_task_id()


class _TiedLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: Tensor, ids: Tensor, padding_idx: int | None, slot: TiedGradient):
        ctx.save_for_backward(ids)
        ctx.padding_idx, ctx.slot, ctx.table_shape = padding_idx, slot, weight.shape
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (ids,) = ctx.saved_tensors
        slot = ctx.slot
        task = torch._C._current_graph_task_id()
        if slot.pending is not None and slot.pending_task == task:
            gradient, slot.pending = slot.pending, None  # the decoder's (V, E) gradient: the rows are added into it
        else:
            gradient = grad_output.new_zeros(ctx.table_shape)
        slot.delivered_task = task
        ids = ids.reshape(-1)
        rows = grad_output.reshape(ids.shape[0], -1)  # (B·L, E)
        if ctx.padding_idx is not None:
            keep = ids != ctx.padding_idx
            ids, rows = ids[keep], rows[keep]
        # index_add_, not index_put_ with accumulation: with more than one CPU thread index_put_ adds a repeated
        # token's rows by atomic float additions in whatever order the threads reach them, so two runs of the
        # same steps would differ in the last bits; index_add_ adds them in the order of ``ids``.
        gradient.index_add_(0, ids, rows.to(gradient.dtype))
        return gradient, None, None, None


class TiedEmbedding(nn.Embedding):
    """``nn.Embedding`` whose training-time lookup can take over a tied decoder's weight gradient.

    The hand-over applies to plain float32 CPU lookups with gradient (no ``max_norm``, ``scale_grad_by_freq``
    or sparse gradient) outside torch.compile; anything else is ``nn.Embedding.forward``.
    """

    gradient_slot: TiedGradient | None = None

    def forward(self, ids: Tensor) -> Tensor:
        plain = self.max_norm is None and not self.scale_grad_by_freq and not self.sparse
        cpu_eager = (
            self.weight.device.type == "cpu"
            and self.weight.dtype == torch.float32
            and not torch.compiler.is_compiling()
        )
        if not (plain and cpu_eager and torch.is_grad_enabled() and self.weight.requires_grad):
            self.gradient_slot = None
            return super().forward(ids)
        slot = TiedGradient()
        output = _TiedLookup.apply(self.weight, ids, self.padding_idx, slot)
        slot.node = weakref.ref(output.grad_fn)
        self.gradient_slot = slot
        return output


def tie_gradients(embedding: nn.Module) -> None:
    """Make a plain ``nn.Embedding`` (a backbone's word embedding) a :class:`TiedEmbedding`, in place.

    The class is switched on the existing module, so the backbone keeps its module, parameter and
    state-dict keys (exports are unchanged). Any other module is left as it is.
    """
    if type(embedding) is nn.Embedding:
        embedding.__class__ = TiedEmbedding
