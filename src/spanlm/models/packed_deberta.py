"""DeBERTa-V2 / V3 over a packed stream: every layer on the stream's tokens, the attention on its segments.

transformers' ``DebertaV2Model`` builds its attention mask and relative positions over the whole row, (L, L) each:
over a packed stream of T tokens that is T × T, and every block would see every other. So a packed DeBERTa runs
its own loop over the same modules (:func:`packed_deberta_states`): the embeddings, each layer's projections,
feed-forward and norms on the stream as it is (no padding computed), and inside each layer only the attention on
the stream's segments laid out one per row, (S, W) for S segments and the longest W (:class:`SegmentLayout`),
where the relative terms are those of a padded row (He et al. 2021, §3.1: a score depends on ``i − j`` only, the
same inside a block and inside its row). The layout is device indexing from the bounds the batch carries, so the
forward reads nothing from the device; the parameters, state-dict keys and exports are the model's own.

The attention module gets the layout in place of its mask: :class:`PackedDisentangledSelfAttention` (switched in
by :func:`use_packed_disentangled_attention`, the module's class only) lays its input out, runs transformers' own
attention on the rows and gathers the result back; a device's speed backend (spanlm.accel.disentangled) subclasses
it to project on the stream and lay out only the queries, keys and values.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

from spanlm.models.modeling_charbert import varlen_arguments


class SegmentLayout(NamedTuple):
    """A packed stream's segments one per row, (S, W): what a DeBERTa-V2 layer's attention gets in place of a mask."""

    slots: Tensor  # (S·W,) the stream position each place of the layout holds; T (a zero row appended) past its end
    places: Tensor  # (T,) each stream token's flat place in the layout
    tokens: Tensor  # (S, W) bool: the places that hold a token (not padding of the stream, not past a segment)
    # (S, 1, W, W) bool: query and key both tokens, as DebertaV2Encoder.get_attention_mask builds it for padded rows
    # (bool already: each layer's attention reads it as bool, so no layer converts it again)
    attention_mask: Tensor
    rows: int
    width: int

    def pad(self, values: Tensor) -> Tensor:
        """(T, ...) → (S, W, ...), zeros where no token is: a gather (the backward a scatter-add)."""
        stream = torch.cat([values, values.new_zeros(1, *values.shape[1:])])
        return stream[self.slots].view(self.rows, self.width, *values.shape[1:])

    def unpad(self, values: Tensor) -> Tensor:
        """(S, W, ...) → (T, ...): each stream token's row back."""
        return values.flatten(0, 1)[self.places]


def padded_places(bounds: Tensor, width: int, tokens: int) -> Tensor:
    """Each token's place (T,) in the segments of ``bounds`` (S + 1,) padded to ``width``: (S, width) flattened."""
    position = torch.arange(tokens, device=bounds.device)  # (T,)
    segment = torch.searchsorted(bounds[1:], position, right=True)  # (T,) each token's segment
    return segment * width + position - bounds[segment]


def segment_layout(
    position_ids: Tensor, attention_mask: Tensor, cu_seq_lens: Tensor | None = None, max_seq_len: int | None = None
) -> SegmentLayout:
    """The layout of a packed stream (1, T): its segments from the batch's ``cu_seq_lens`` (S + 1,) and longest
    ``max_seq_len`` when it carries them, else derived from the positions (a wait for an accelerator)."""
    bounds = varlen_arguments(position_ids, attention_mask, cu_seq_lens, max_seq_len)
    starts, width = bounds["cu_seq_lens_q"].long(), int(bounds["max_length_q"])
    rows, total = starts.shape[0] - 1, attention_mask.numel()
    places = padded_places(starts, width, total)
    slot = starts[:-1, None] + torch.arange(width, device=starts.device)  # (S, W) the stream position of each place
    inside = slot < starts[1:, None]
    slots = torch.where(inside, slot, total).flatten()
    real = torch.cat([attention_mask.flatten().bool(), attention_mask.new_zeros(1, dtype=torch.bool)])
    tokens = real[slots].view(rows, width)
    pairs = tokens[:, None, :, None] & tokens[:, None, None, :]
    return SegmentLayout(slots, places, tokens, pairs, rows, width)


class PackedDisentangledSelfAttention(DisentangledSelfAttention):
    """transformers' ``DisentangledSelfAttention``; given a :class:`SegmentLayout` as its mask, it attends within each
    segment of the packed stream (1, T, H) and returns the stream's (1, T, H)."""

    def forward(
        self,
        hidden_states,
        attention_mask,
        output_attentions=False,
        query_states=None,
        relative_pos=None,
        rel_embeddings=None,
    ):
        if not isinstance(attention_mask, SegmentLayout):
            return super().forward(
                hidden_states, attention_mask, output_attentions, query_states, relative_pos, rel_embeddings
            )
        layout = attention_mask
        rows = layout.pad(hidden_states[0])  # (S, W, H)
        context, _ = super().forward(rows, layout.attention_mask, rel_embeddings=rel_embeddings)
        return layout.unpad(context)[None], None  # (1, T, H)


def use_packed_disentangled_attention(model) -> None:
    """Switch transformers' DeBERTa-V2 self-attention modules of ``model`` to :class:`PackedDisentangledSelfAttention`
    (the class only), in place; a subclass a backend switched in already stays."""
    for module in model.modules():
        if type(module) is DisentangledSelfAttention:
            module.__class__ = PackedDisentangledSelfAttention


def packed_deberta_states(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    token_type_ids: Tensor | None = None,
    cu_seq_lens: Tensor | None = None,
    max_seq_len: int | None = None,
) -> Tensor:
    """A ``DebertaV2Model``'s last hidden states (1, T, H) of a packed stream (1, T), each segment of ``cu_seq_lens``
    attending only to itself: the model's forward, with the layout in place of its (T, T) mask and positions."""
    if not isinstance(model.encoder.layer[0].attention.self, PackedDisentangledSelfAttention):
        use_packed_disentangled_attention(model)  # a model called outside the trainer (which switches it first)
    layout = segment_layout(position_ids, attention_mask, cu_seq_lens, max_seq_len)
    encoder = model.encoder
    embeddings = model.embeddings(
        input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids, mask=attention_mask
    )
    relative = encoder.get_rel_embedding()
    hidden = embeddings
    for index, layer in enumerate(encoder.layer):
        hidden, _ = layer(hidden, layout, rel_embeddings=relative)
        if index == 0 and encoder.conv is not None:  # a convolution over each segment's row, not across the stream
            rows = encoder.conv(layout.pad(embeddings[0]), layout.pad(hidden[0]), layout.tokens.long())
            hidden = layout.unpad(rows)[None]
    return hidden
