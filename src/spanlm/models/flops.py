"""The training FLOPs of a model's encoders, from their dimensions: what a run's MFU divides by the device's peak.

The dense formula of Kaplan et al. (2020) and PaLM's MFU (Chowdhery et al. 2022, appendix B): per token,
``6·N`` for the forward and backward matmuls of the ``N`` dense weights it passes through (embeddings excluded:
a lookup, not a product); per attention layer of width ``d`` (heads × head size) and segment of ``n`` tokens,
``12·d·n·r`` for the score and context products (``2·2·d·n·r`` forward, twice that backward), ``r`` the keys a
query reaches: the segment's ``n``, or at most ``2·w + 1`` in a sliding-window layer of half-width ``w``
(ModernBERT's local layers). Padding is never credited; neither are DeBERTa's relative-position terms nor the
task heads (most run on a few positions: the masked targets, the span boundaries).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn


@dataclasses.dataclass(frozen=True)
class TrainingFlops:
    """One forward and backward pass of a model, as a function of its batch's tokens and segments."""

    dense_weights: int  # N: the encoders' matmul weights each token passes through
    # per distinct reach (None: the whole segment), the summed width of the attention layers with that reach
    attention: dict[int | None, int]

    def __call__(self, batch: dict[str, Tensor]) -> Tensor:
        """FLOPs of one forward and backward pass over ``batch`` (a float64 scalar on its device)."""
        return self.of(batch["attention_mask"].sum(), segment_lengths(batch))

    def of(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """FLOPs of ``tokens`` real tokens in attention segments of ``lengths`` (S,)."""
        n = lengths.double()
        flops = 6.0 * self.dense_weights * tokens.double()
        for reach, width in self.attention.items():
            attended = n if reach is None else n.clamp(max=reach)
            flops = flops + 12.0 * width * (n * attended).sum()
        return flops


def training_flops(model: nn.Module) -> TrainingFlops:
    """The FLOP count of ``model``'s encoders: each outermost transformers ``PreTrainedModel`` in it (ELECTRA's
    generator and discriminator are two), its ``nn.Linear`` weights but those tied to an embedding (a decoder
    sharing the input table), and its attention layers from its config (``num_hidden_layers``, ``hidden_size``,
    the ``layer_types`` that slide and their ``sliding_window``)."""
    from transformers import PreTrainedModel

    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    encoders: list[PreTrainedModel] = []
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and not any(_contains(outer, module) for outer in encoders):
            encoders.append(module)
    dense, attention = 0, {}
    for encoder in encoders:
        dense += sum(
            m.weight.numel()
            for m in encoder.modules()
            if isinstance(m, nn.Linear) and id(m.weight) not in embedding_weights
        )
        for reach in attention_reaches(encoder.config):
            attention[reach] = attention.get(reach, 0) + encoder.config.hidden_size
    return TrainingFlops(dense, attention)


def attention_reaches(config) -> list[int | None]:
    """Per attention layer of a transformers ``config``: the most keys a query reaches (None: its whole segment)."""
    layers = getattr(config, "num_hidden_layers", 0)
    types = getattr(config, "layer_types", None) or ["full_attention"] * layers
    window = getattr(config, "sliding_window", None)
    return [2 * window + 1 if kind == "sliding_attention" and window else None for kind in types[:layers]]


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(module is inner for module in outer.modules())


def segment_lengths(batch: dict[str, Tensor]) -> Tensor:
    """The lengths of a batch's attention segments (S,): a packed stream's segments (``cu_seq_lens``), else each
    row's real tokens."""
    bounds = batch.get("cu_seq_lens")
    if isinstance(bounds, torch.Tensor) and bounds.numel() > 1:
        return bounds[1:] - bounds[:-1]
    return batch["attention_mask"].reshape(batch["attention_mask"].shape[0], -1).sum(-1)
