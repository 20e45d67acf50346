"""BERT-family self-attention in CPU training as one autograd function: hidden states in, context out.

Why: at the sizes spanlm pretrains on a CPU (hidden 256, seq 128), the matmuls of self-attention are
small and the work around them is not. transformers' ``BertSelfAttention`` runs three projections, each
with its bias copied into the output first, splits every result into heads with a copy, scales the query
in another pass, and autograd mirrors all of it in the backward pass (three gradient products for the
input and three for the weights, summed with two more passes, three bias reductions). Here:

* the three projections are one batched product (a head's slice of the stacked (3H, H) weight per
  batch) that writes straight into the head-major (3, heads, B, L, head_dim) layout the attention
  products need, biases included; the query's 1/√d is folded into its weight and bias;
* softmax runs in place on the scores, and dropout's 1 / (1 − p) goes into the product with the values;
* the backward pass takes the three heads' gradients back to the projections' layout in one pass and
  forms the input gradient, the three weight gradients and the three bias gradients with one product or
  one reduction each.

The arithmetic is that of transformers' SDPA path with :mod:`spanlm.accel.dropout`'s dropout on the
probabilities (Vaswani et al. 2017, softmax(QKᵀ/√d)V; BERT's attention-probability dropout), with the
same random draws in the same order, so a run gives the same losses either way up to float rounding
(tests/accel/test_attention.py). Parameters, state-dict keys and the saved config are untouched.

A packed stream (spanlm.models.packed: no mask, the block boundaries in transformers' varlen arguments
``cu_seq_lens_q``) takes :class:`_VarlenSelfAttention`: the same projections, then the attention per
group of blocks of similar length, never across blocks.

Only training on CPU in float32 takes this path (where spanlm.accel.native's kernels are built), with
dropout on and a boolean or no attention mask (what ``"spanlm_sdpa"`` receives), outside autocast and
torch.compile; everything else runs the module's own forward.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from transformers.models.bert.modeling_bert import BertSelfAttention
from transformers.models.electra.modeling_electra import ElectraSelfAttention
from transformers.models.roberta.modeling_roberta import RobertaSelfAttention

from spanlm.accel.dropout import apply_dropout, dropout_stream, fast_dropout_applies, kernels_for
from spanlm.accel.subclasses import use_subclasses


@dataclasses.dataclass(frozen=True)
class SegmentGroup:
    """Segments of similar length attended together: ``count`` rows of ``length`` slots, one segment a row.

    ``start``: the first stream position of the group's first segment (a lone segment is a slice of the
    stream); ``slots`` (count·length,): the stream position each slot reads (a padding slot repeats its
    segment's first token; it is masked as a key and its query discarded); ``real`` (count, length): the
    slot holds a token of its segment; ``real_slots``: the flat indices of those slots, ``tokens`` their
    stream positions.
    """

    count: int
    length: int
    start: int
    slots: Tensor
    real: Tensor
    real_slots: Tensor
    tokens: Tensor


# A group takes the next-longest segment while the scores (per head) its padding to the group's longest adds
# stay within this budget: short segments share one product (each product, softmax and dropout call is a
# parallel region of its own, a fixed cost that dominates short segments), long ones keep their own (their
# padding would cost more than the call).
GROUP_PADDING = 96 * 96


def segment_groups(bounds: list[int], padding: int = GROUP_PADDING) -> list[SegmentGroup]:
    """The segments ``[bounds[i], bounds[i + 1])`` of a stream in groups of similar length, longest first."""
    lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    members: list[list[int]] = []  # segment numbers per group, longest first (ties in stream order)
    for segment in sorted(range(len(lengths)), key=lambda number: -lengths[number]):
        group = members[-1] if members else []
        area = sum(lengths[member] ** 2 for member in group) + lengths[segment] ** 2
        if group and (len(group) + 1) * lengths[group[0]] ** 2 - area <= padding:
            group.append(segment)
        else:
            members.append([segment])
    groups = []
    for group in members:
        length = lengths[group[0]]
        within = torch.arange(length)
        real = within < torch.tensor([lengths[member] for member in group]).unsqueeze(1)  # (count, length)
        slots = (
            torch.tensor([bounds[member] for member in group]).unsqueeze(1) + torch.where(real, within, 0)
        ).flatten()
        real_slots = real.flatten().nonzero().flatten()
        groups.append(SegmentGroup(len(group), length, bounds[group[0]], slots, real, real_slots, slots[real_slots]))
    return groups


def _project(
    rows: Tensor,
    heads: int,
    scale: float,
    query_weight: Tensor,
    query_bias: Tensor,
    key_weight: Tensor,
    key_bias: Tensor,
    value_weight: Tensor,
    value_bias: Tensor,
) -> tuple[Tensor, Tensor]:
    """The stacked (3H, H) weight and the head-major (3·heads, N, d) projections of ``rows`` (N, H)."""
    width = rows.shape[1]
    head_dim = width // heads
    # The query's 1/√d goes into its weight and bias (a (H, H) product instead of a (B, L, H) one).
    weight = torch.cat([query_weight * scale, key_weight, value_weight])  # (3H, H)
    bias = torch.cat([query_bias * scale, key_bias, value_bias])  # (3H,)
    # One batched product per (projection, head) writes the head-major layout the attention products
    # need, (3·heads, N, d), with no copy of the (N, 3H) result.
    per_head = weight.view(3 * heads, head_dim, width).transpose(1, 2).contiguous()  # (3·heads, H, d)
    return weight, torch.baddbmm(bias.view(3 * heads, 1, head_dim), rows.expand(3 * heads, -1, -1), per_head)


def _project_backward(ctx, grad_projected: Tensor, rows: Tensor, weight: Tensor):
    """The gradients of hidden states (rows' layout), weights and biases from those of the projections,
    ``grad_projected`` (N, 3H) in the projections' output layout."""
    width = rows.shape[1]
    grad_hidden = torch.mm(grad_projected, weight) if ctx.needs_input_grad[0] else None
    grad_weight = torch.mm(grad_projected.t(), rows)  # (3H, H)
    grad_bias = grad_projected.sum(0)
    grad_weight[:width] *= ctx.scale  # back through the query's scaled weight and bias
    grad_bias[:width] *= ctx.scale
    grad_weights, grad_biases = grad_weight.split(width), grad_bias.split(width)  # row blocks: contiguous
    return (
        grad_hidden,
        None,
        None,
        None,
        None,
        grad_weights[0],
        grad_biases[0],
        grad_weights[1],
        grad_biases[1],
        grad_weights[2],
        grad_biases[2],
    )


class _SelfAttention(torch.autograd.Function):
    """Context (B, L, H) of multi-head self-attention over ``hidden`` (B, L, H), dropout ``p`` on the
    probabilities; ``allowed`` None or a boolean mask broadcastable to (B, heads, L, L), True = attend."""

    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        allowed: Tensor | None,
        heads: int,
        scale: float,
        p: float,
        query_weight: Tensor,
        query_bias: Tensor,
        key_weight: Tensor,
        key_bias: Tensor,
        value_weight: Tensor,
        value_bias: Tensor,
    ) -> Tensor:
        batch, length, width = hidden.shape
        head_dim = width // heads
        rows = hidden.reshape(batch * length, width)
        weight, qkv = _project(
            rows, heads, scale, query_weight, query_bias, key_weight, key_bias, value_weight, value_bias
        )
        query, key, value = qkv.view(3, heads * batch, length, head_dim)  # batches ordered (head, sequence)
        scores = torch.bmm(query, key.transpose(1, 2))  # (heads·B, L, L)
        if allowed is not None:  # (B, 1 or heads, L, L) → (1 or heads, B, L, L)
            scores.view(heads, batch, length, length).masked_fill_(
                ~allowed.transpose(0, 1), torch.finfo(scores.dtype).min
            )
        probabilities = torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # in place
        # Drawn in (B, heads) order, as transformers' layout would be, so that a seed drops the same
        # probabilities either way; read in (heads, B) order. The 1 / (1 − p) goes into the next product.
        # No mask is kept: the backward pass applies the same stream to the probabilities' gradient.
        key, threshold, keep_scale = dropout_stream(p)
        dropped = torch.empty_like(probabilities)
        by_sequence = (heads, batch, length, length)  # .transpose(0, 1): (B, heads, L, L), the draws' order
        apply_dropout(
            probabilities.view(by_sequence).transpose(0, 1),
            dropped.view(by_sequence).transpose(0, 1),
            key,
            threshold,
            1.0,
        )
        zero = hidden.new_zeros(())  # baddbmm's input, ignored at beta = 0
        context = torch.baddbmm(zero, dropped, value, beta=0.0, alpha=keep_scale)  # (heads·B, L, d)
        ctx.save_for_backward(rows, weight, qkv, probabilities, dropped)
        ctx.sizes, ctx.scale, ctx.keep_scale = (batch, length, width, heads, head_dim), scale, keep_scale
        ctx.stream = (key, threshold)
        return context.view(heads, batch, length, head_dim).permute(1, 2, 0, 3).reshape(batch, length, width)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):
        rows, weight, qkv, probabilities, dropped = ctx.saved_tensors
        batch, length, width, heads, head_dim = ctx.sizes
        query, key, value = qkv.view(3, heads * batch, length, head_dim)
        grad_context = (
            grad_output.reshape(batch, length, heads, head_dim)
            .permute(2, 0, 1, 3)
            .reshape(heads * batch, length, head_dim)
        )  # (heads·B, L, d)
        grad_qkv = torch.empty(3, heads * batch, length, head_dim, dtype=grad_output.dtype)
        zero = grad_output.new_zeros(())  # baddbmm's input, ignored at beta = 0
        torch.baddbmm(zero, dropped.transpose(1, 2), grad_context, beta=0.0, alpha=ctx.keep_scale, out=grad_qkv[2])
        grad_probabilities = torch.baddbmm(zero, grad_context, value.transpose(1, 2), beta=0.0, alpha=ctx.keep_scale)
        by_sequence = grad_probabilities.view(heads, batch, length, length).transpose(0, 1)
        apply_dropout(by_sequence, by_sequence, *ctx.stream, 1.0)  # in place
        grad_scores = torch._softmax_backward_data(grad_probabilities, probabilities, -1, probabilities.dtype)
        torch.bmm(grad_scores, key, out=grad_qkv[0])
        torch.bmm(grad_scores.transpose(1, 2), query, out=grad_qkv[1])
        # (3, heads, B, L, d) → (B·L, 3H), the projections' output layout, in one pass
        grad_projected = torch.empty(batch, length, 3, heads, head_dim, dtype=grad_output.dtype)
        grad_projected.permute(2, 3, 0, 1, 4).copy_(grad_qkv.view(3, heads, batch, length, head_dim))
        grads = _project_backward(ctx, grad_projected.view(batch * length, 3 * width), rows, weight)
        return (grads[0].view(batch, length, width) if grads[0] is not None else None, *grads[1:])


def _group_rows(qkv: Tensor, group, heads: int) -> Tensor:
    """A segment group's queries, keys and values (3, heads·count, length, d) from the stream's head-major
    (3·heads, T, d) projections: a slice for a lone segment, else its slots gathered."""
    head_dim = qkv.shape[-1]
    if group.count == 1:
        return qkv.view(3, heads, -1, head_dim)[:, :, group.start : group.start + group.length]
    return qkv.index_select(1, group.slots).view(3, heads * group.count, group.length, head_dim)


class _VarlenSelfAttention(torch.autograd.Function):
    """Context (R, W, H) of multi-head self-attention over a packed stream ``hidden`` (R, W, H), each segment
    ``[bounds[i], bounds[i + 1])`` of its flattened tokens attending only to itself; dropout ``p`` on the
    probabilities. transformers' varlen arguments give the bounds (``cu_seq_lens_q``, spanlm.models.packed).

    Segments of similar length are attended together (:func:`segment_groups`): a
    group's queries, keys and values are gathered into (heads·count, length, d) rows, its padding slots
    masked as keys, so each group is one product, one softmax and one dropout call (its own stream, drawn in
    (head, segment, query, key) order), as :class:`_SelfAttention` does for a padded batch. No (T, T) mask exists.
    """

    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        bounds: list[int],
        heads: int,
        scale: float,
        p: float,
        query_weight: Tensor,
        query_bias: Tensor,
        key_weight: Tensor,
        key_bias: Tensor,
        value_weight: Tensor,
        value_bias: Tensor,
    ) -> Tensor:
        width = hidden.shape[-1]
        tokens, head_dim = hidden.numel() // width, width // heads
        rows = hidden.reshape(tokens, width)
        weight, qkv = _project(
            rows, heads, scale, query_weight, query_bias, key_weight, key_bias, value_weight, value_bias
        )
        groups = segment_groups(bounds)
        saved, streams, parts = [], [], []
        for group in groups:
            batch, length = group.count, group.length
            query, key, value = _group_rows(qkv, group, heads)  # (heads·count, length, d) each, (head, segment) order
            scores = torch.bmm(query, key.transpose(1, 2))  # (heads·count, length, length)
            if batch > 1:  # padding slots are no keys
                scores.view(heads, batch, length, length).masked_fill_(
                    ~group.real[:, None, :], torch.finfo(scores.dtype).min
                )
            probabilities = torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # in place
            stream, threshold, keep_scale = dropout_stream(p)
            dropped = apply_dropout(probabilities, torch.empty_like(probabilities), stream, threshold, keep_scale)
            context = torch.bmm(dropped, value).view(heads, batch * length, head_dim)
            parts.append(context.index_select(1, group.real_slots) if batch > 1 else context)
            saved += [probabilities, dropped]
            streams.append((stream, threshold, keep_scale))
        order = torch.cat([group.tokens for group in groups])  # the stream position of each context row below
        context = torch.empty(tokens, heads, head_dim, dtype=hidden.dtype)
        context.index_copy_(0, order, torch.cat(parts, dim=1).transpose(0, 1))  # (T, heads, d): the (T, H) output
        ctx.save_for_backward(rows, weight, qkv, *saved)
        ctx.groups, ctx.streams, ctx.order, ctx.scale = groups, streams, order, scale
        return context.view(hidden.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):
        rows, weight, qkv, *saved = ctx.saved_tensors
        tokens, width = rows.shape
        heads = qkv.shape[0] // 3
        head_dim = width // heads
        grad_context = grad_output.reshape(tokens, heads, head_dim)  # token-major
        parts = []  # per group, its real slots' gradients (n, 3, heads, d): the projections' output layout
        for number, group in enumerate(ctx.groups):
            batch, length = group.count, group.length
            probabilities, dropped = saved[2 * number], saved[2 * number + 1]
            stream, threshold, keep_scale = ctx.streams[number]
            query, key, value = _group_rows(qkv, group, heads)
            if batch > 1:  # padding slots: no gradient
                grad_rows = grad_context.index_select(0, group.slots).masked_fill_(~group.real.view(-1, 1, 1), 0.0)
                grad_rows = grad_rows.permute(1, 0, 2).reshape(heads * batch, length, head_dim)
            else:
                grad_rows = grad_context[group.start : group.start + length].transpose(0, 1)  # (heads, n, d)
            grad_value = torch.bmm(dropped.transpose(1, 2), grad_rows)  # dropped holds the 1 / (1 − p)
            grad_weights = torch.bmm(grad_rows, value.transpose(1, 2))
            apply_dropout(grad_weights, grad_weights, stream, threshold, keep_scale)  # in place
            grad_scores = torch._softmax_backward_data(grad_weights, probabilities, -1, probabilities.dtype)
            grad_query = torch.bmm(grad_scores, key)
            grad_key = torch.bmm(grad_scores.transpose(1, 2), query)
            grad_slots = torch.stack([grad_query, grad_key, grad_value]).view(3, heads, batch * length, head_dim)
            parts.append(
                (grad_slots.index_select(2, group.real_slots) if batch > 1 else grad_slots).permute(2, 0, 1, 3)
            )
        grad_projected = torch.empty(tokens, 3, heads, head_dim, dtype=grad_output.dtype)
        grad_projected.index_copy_(0, ctx.order, torch.cat(parts))
        grads = _project_backward(ctx, grad_projected.view(tokens, 3 * width), rows, weight)
        return (grads[0].view(grad_output.shape) if grads[0] is not None else None, *grads[1:])


class _TrainingForward:
    """Mixin: the module's forward through :class:`_SelfAttention` whenever that applies (module docstring)."""

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None, *args, **kwargs):
        # The key/value cache: `past_key_values` up to transformers 5.23, `cache` from 5.24 (positional or keyword).
        cache = args[0] if args else kwargs.get("cache", kwargs.get("past_key_values"))
        p = self.dropout.p
        if (
            self.training
            and cache is None
            and not getattr(self, "is_causal", False)
            and fast_dropout_applies(p)
            and kernels_for(hidden_states) is not None
            and hidden_states.dim() == 3
            and self.all_head_size == hidden_states.shape[-1]
            and (attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.dim() == 4))
            and not torch.is_autocast_enabled("cpu")
            and all(
                layer.bias is not None and layer.weight.dtype == hidden_states.dtype
                for layer in (self.query, self.key, self.value)
            )
        ):
            weights = (
                self.query.weight,
                self.query.bias,
                self.key.weight,
                self.key.bias,
                self.value.weight,
                self.value.bias,
            )
            bounds = kwargs.get("cu_seq_lens_q")  # a packed stream's blocks (spanlm.models.packed)
            if bounds is not None and attention_mask is None:
                context = _VarlenSelfAttention.apply(
                    hidden_states, bounds.tolist(), self.num_attention_heads, self.scaling, p, *weights
                )
            else:
                context = _SelfAttention.apply(
                    hidden_states, attention_mask, self.num_attention_heads, self.scaling, p, *weights
                )
            return context, None
        return super().forward(hidden_states, attention_mask, *args, **kwargs)


class FusedBertSelfAttention(_TrainingForward, BertSelfAttention):
    pass


class FusedRobertaSelfAttention(_TrainingForward, RobertaSelfAttention):
    pass


class FusedElectraSelfAttention(_TrainingForward, ElectraSelfAttention):
    pass


FUSED = {
    BertSelfAttention: FusedBertSelfAttention,
    RobertaSelfAttention: FusedRobertaSelfAttention,
    ElectraSelfAttention: FusedElectraSelfAttention,
}


def use_fused_self_attention(model: nn.Module) -> nn.Module:
    """Make every BERT / RoBERTa / ELECTRA self-attention module of ``model`` its ``Fused…`` subclass, in place:
    the same parameters and state-dict keys, a training forward through :class:`_SelfAttention`."""
    return use_subclasses(model, FUSED)
