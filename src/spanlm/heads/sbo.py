"""SpanBERT's Span Boundary Objective head (Joshi et al. 2020, arXiv 1907.10529, §3.2).

For a masked span (x_s, ..., x_e) the paper predicts every token x_i of the span from the encoder's
outputs at the two *external* boundary tokens and a relative position embedding (§3.2)::

    y_i = f(x_{s-1}, x_{e+1}, p_{i-s+1})
    h_0 = [x_{s-1}; x_{e+1}; p_{i-s+1}]
    h_1 = LayerNorm(GeLU(W_1 h_0))
    y_i = LayerNorm(GeLU(W_2 h_1))

then y_i is projected onto the vocabulary by the output matrix tied to the input embeddings, plus a
bias. The relative position embedding p has its own width (200 in the authors' code,
``position_embedding_size=200``), independent of the hidden size, so W_1 maps 2H + 200 → H.

Layout. The authors' ``BertPairTargetPredictionHead`` evaluates this for ``bs × n_pairs × max_targets``
slots — every span padded to ``max_targets`` targets and every block to the largest pair count of the
batch — and masks the padding out of the loss afterwards, so most rows through the vocabulary
projection are padding. Here the caller
passes one row per *real* target (flat gather indices), so the head computes exactly the targets and
nothing else; the values and gradients are those of the padded layout at its real slots
(tests/heads/test_sbo.py checks both).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from spanlm.heads.mlm import TiedDecoder

# Rows of the relative-position table: targets per span that get an SBO prediction. The authors'
# pretraining runs used --max_pair_targets 15 (their argparse default is 20); the masker must cap
# targets per span at the same number (see span_targets).
MAX_TARGETS = 15
# Width of the relative-position embedding, from the authors' code (position_embedding_size=200).
POSITION_SIZE = 200


class SBOHead(nn.Module):
    """The two-layer SBO MLP of §3.2 on gathered boundary pairs, decoder tied to the input embedding.

    Args:
        hidden_size: the encoder's output width H.
        embedding: the backbone's input word embedding (V, E); the decoder's weight *is* its weight.
        max_targets: rows of the relative-position table, i.e. the most targets one span can have.
        position_size: width of the relative-position embedding p (200 in the paper's code).
        layer_norm_eps: epsilon of both LayerNorms (the backbone's ``layer_norm_eps``).

    W_2 maps H → E; E = H in every SpanBERT model, E < H only for an ELECTRA-style factorised embedding,
    where the tied decoder needs E-wide inputs.
    """

    def __init__(
        self,
        hidden_size: int,
        embedding: nn.Embedding,
        max_targets: int = MAX_TARGETS,
        position_size: int = POSITION_SIZE,
        layer_norm_eps: float = 1e-12,
        initializer_range: float = 0.02,
    ):
        super().__init__()
        width = embedding.embedding_dim
        self.max_targets = max_targets
        # p_1 .. p_max_targets of the paper, stored 0-based: row r is p_{r+1} (see forward).
        self.position_embeddings = nn.Embedding(max_targets, position_size)
        self.dense1 = nn.Linear(2 * hidden_size + position_size, hidden_size)  # W_1
        self.layer_norm1 = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dense2 = nn.Linear(hidden_size, width)  # W_2
        self.layer_norm2 = nn.LayerNorm(width, eps=layer_norm_eps)
        self.activation = nn.GELU()  # exact (erf) GeLU, as the authors' `gelu`
        self.decoder = TiedDecoder(embedding)
        self.initializer_range = initializer_range
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The authors' init_bert_weights: N(0, 0.02) for Linear and Embedding weights (the position
        # table included), zero biases, LayerNorm γ = 1, β = 0.
        for linear in (self.dense1, self.dense2):
            nn.init.normal_(linear.weight, mean=0.0, std=self.initializer_range)
            nn.init.zeros_(linear.bias)
        nn.init.normal_(self.position_embeddings.weight, mean=0.0, std=self.initializer_range)
        for norm in (self.layer_norm1, self.layer_norm2):
            nn.init.ones_(norm.weight)
            nn.init.zeros_(norm.bias)
        nn.init.zeros_(self.decoder.bias)

    @property
    def decoder_weight(self) -> Tensor:
        """The vocabulary projection: the very Parameter of the input embedding (V, E)."""
        return self.decoder.weight

    def forward(self, hidden: Tensor, left: Tensor, right: Tensor, relative: Tensor) -> Tensor:
        """Logits (M, V) for M span targets (arguments as :meth:`features`)."""
        return self.decoder(self.features(hidden, left, right, relative))  # (M, V)

    def features(self, hidden: Tensor, left: Tensor, right: Tensor, relative: Tensor) -> Tensor:
        """The rows (M, E) the decoder projects, for M span targets.

        Args:
            hidden: encoder output (B, L, H).
            left: (M,) flat index b·L + (s-1) of each target's left boundary token x_{s-1}.
            right: (M,) flat index b·L + (e+1) of its right boundary token x_{e+1}.
            relative: (M,) 0-based offset i - s of the target inside its span, < ``max_targets``. The
                paper's p_{i-s+1} is 1-based (the first token of a span uses p_1); the table is 0-based,
                so p_{i-s+1} is row i - s — the same rows the authors' code uses (their slot j of a pair
                is span token s + j and takes position row j).
        """
        batch, length, width = hidden.shape
        flat = hidden.reshape(batch * length, width)  # (B·L, H): row b·L + t is hidden[b, t]
        h0 = torch.cat(
            [
                flat.index_select(0, left),  # (M, H)   x_{s-1}
                flat.index_select(0, right),  # (M, H)   x_{e+1}
                self.position_embeddings(relative),  # (M, 200) p_{i-s+1}
            ],
            dim=-1,
        )  # (M, 2H + 200)
        h1 = self.layer_norm1(self.activation(self.dense1(h0)))  # (M, H)
        return self.layer_norm2(self.activation(self.dense2(h1)))  # (M, E)


def span_targets(
    batch_index: Tensor, starts: Tensor, ends: Tensor, length: int, max_targets: int = MAX_TARGETS
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Turn K SBO spans into the per-target gather indices :class:`SBOHead` takes (vectorised).

    Args:
        batch_index, starts, ends: (K,) block index and inclusive token range [s, e] of each span that
            gets SBO targets (the masker has already left out spans without both boundary tokens).
        length: block length L (the flat index of hidden[b, t] is b·L + t).
        max_targets: only the first ``max_targets`` tokens of a longer span get an SBO target, as in
            the authors' code.

    Returns ``(left, right, relative, target)``, each (M,): boundary indices and 0-based relative
    positions for :meth:`SBOHead.forward`, and the flat index of each target token (to gather labels).
    Targets are ordered span by span, left to right.
    """
    if bool(((starts < 1) | (ends > length - 2) | (ends < starts)).any()):
        raise ValueError("every SBO span [s, e] needs 1 ≤ s ≤ e ≤ L-2 (both boundary tokens inside the block)")
    counts = (ends - starts + 1).clamp(max=max_targets)  # (K,) targets per span
    span = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)  # (M,) span of each target
    first = torch.cumsum(counts, 0) - counts  # (K,) index of each span's first target in the output
    relative = torch.arange(len(span), device=counts.device) - first[span]  # (M,) i - s
    row = batch_index[span] * length  # (M,) flat index of position 0 of the target's block
    left = row + starts[span] - 1
    right = row + ends[span] + 1
    target = row + starts[span] + relative
    return left, right, relative, target
