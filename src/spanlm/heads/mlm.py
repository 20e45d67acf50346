"""BERT's masked-LM head, computed only at the target rows, with the decoder tied to the input embedding.

Devlin et al. 2019 (arXiv 1810.04805) and the reference BERT code: the final hidden state of a
masked position goes through a transform (dense H→H, GeLU, LayerNorm) and then a projection onto the
vocabulary whose weight is the input word-embedding matrix, plus an output-only bias.

Speed: the vocabulary projection dominates the head (H·V multiply-adds per row against H² for the
transform), so the caller gathers the target rows (BERT's 15%) first and the head never sees the
others — projecting every position would spend most of the head's work on rows no loss reads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class TiedDecoder(nn.Module):
    """Projection onto the vocabulary whose weight *is* the input word embedding, with its own bias.

    The embedding module is referenced, not registered as a submodule: the backbone owns it. So the
    head's ``parameters()`` and ``state_dict()`` hold only the head's own tensors (the bias here), the
    tied weight is saved once (with the backbone, safetensors-friendly: no shared tensors in one file)
    and an optimiser over ``objective.parameters()`` sees it once. The weight is read from the module on
    every call, so tying survives anything that swaps the module's Parameter (``.to()``, loading,
    ``set_input_embeddings`` followed by :meth:`tie`). Move the head together with its backbone
    (``objective.to(device)``); ``head.to()`` alone does not move a weight it does not own.
    """

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.tie(embedding)
        weight = embedding.weight
        self.bias = nn.Parameter(torch.zeros(weight.shape[0], device=weight.device, dtype=weight.dtype))

    def tie(self, embedding: nn.Embedding) -> None:
        # object.__setattr__ bypasses nn.Module.__setattr__, which would register `embedding` as a child.
        object.__setattr__(self, "embedding", embedding)

    @property
    def weight(self) -> Tensor:
        return self.embedding.weight

    def forward(self, hidden: Tensor) -> Tensor:
        # (N, E) @ (V, E)ᵀ + (V,) → (N, V)
        return F.linear(hidden, self.weight, self.bias)

    def extra_repr(self) -> str:
        vocab, width = self.weight.shape
        return f"in_features={width}, out_features={vocab}, tied to the input embedding"


class OwnDecoder(nn.Module):
    """A projection onto the vocabulary with its own weight (V, E) — an untied output embedding, as EuroBERT's
    ``lm_head`` — under the same interface as :class:`TiedDecoder` (``weight``, ``bias``)."""

    def __init__(self, vocab_size: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, width))
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.weight, self.bias)  # (N, E) → (N, V)


class MLMHead(nn.Module):
    """BERT's MLM head: dense + GeLU + LayerNorm, then the tied vocabulary projection.

    ``hidden_size`` is the encoder's output width H; the transform maps to the embedding width E (= H in
    BERT; E < H only for an ELECTRA-style factorised embedding, where ELECTRA's generator head likewise
    maps H→E before the tied decoder).

    The modern families' heads are variants of it (``spanlm.models.backbone.mlm_head`` picks them): ModernBERT's
    ``ModernBertPredictionHead`` is the same transform without the dense and norm biases (``bias=False``);
    EuroBERT's ``lm_head`` has no transform (``transform=False``) and an untied, bias-free decoder
    (``tied=False, decoder_bias=False``). A missing bias is a zero buffer, so every decoder has one to add.
    """

    def __init__(
        self,
        hidden_size: int,
        embedding: nn.Embedding,
        layer_norm_eps: float = 1e-12,
        initializer_range: float = 0.02,
        *,
        bias: bool = True,
        transform: bool = True,
        tied: bool = True,
        decoder_bias: bool = True,
    ):
        super().__init__()
        width = embedding.embedding_dim
        self.transform = transform
        if transform:
            self.dense = nn.Linear(hidden_size, width, bias=bias)
            self.activation = nn.GELU()  # exact (erf) GeLU, as BERT's `gelu` and ModernBERT's
            self.layer_norm = nn.LayerNorm(width, eps=layer_norm_eps, bias=bias)
        self.decoder = TiedDecoder(embedding) if tied else OwnDecoder(embedding.num_embeddings, width)
        if not decoder_bias:  # a constant zero: not trained, not saved
            del self.decoder.bias
            self.decoder.register_buffer("bias", torch.zeros(embedding.num_embeddings), persistent=False)
        self.initializer_range = initializer_range
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # BERT's init_bert_weights: N(0, 0.02) weights, zero biases, LayerNorm γ = 1 and β = 0. The tied
        # weight belongs to (and is initialised by) the backbone.
        if self.transform:
            nn.init.normal_(self.dense.weight, mean=0.0, std=self.initializer_range)
            nn.init.ones_(self.layer_norm.weight)
            for bias in (self.dense.bias, self.layer_norm.bias):
                if bias is not None:
                    nn.init.zeros_(bias)
        if isinstance(self.decoder, OwnDecoder):
            nn.init.normal_(self.decoder.weight, mean=0.0, std=self.initializer_range)
        nn.init.zeros_(self.decoder.bias)

    @property
    def decoder_weight(self) -> Tensor:
        """The vocabulary projection: the very Parameter of the input embedding (V, E)."""
        return self.decoder.weight

    def features(self, hidden_at_targets: Tensor) -> Tensor:
        """``hidden_at_targets`` (N, H) → the transformed rows (N, E) the decoder projects."""
        if not self.transform:
            return hidden_at_targets
        return self.layer_norm(self.activation(self.dense(hidden_at_targets)))

    def forward(self, hidden_at_targets: Tensor) -> Tensor:
        """``hidden_at_targets`` (N, H): final hidden states at the N target positions → logits (N, V)."""
        return self.decoder(self.features(hidden_at_targets))  # (N, V)
