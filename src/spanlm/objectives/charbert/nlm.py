"""CharBERT's noisy-LM head: the char channel's hidden state at a noised token → the original word.

Ma et al. 2020, §3.3: every sub-word of a noised word predicts the original
(lower-cased) word from a term vocabulary of the ~30k most frequent words of the corpus
(:class:`spanlm.objectives.charbert.masker.NoiseTables`). The head is the MLM head's shape — dense H→H, activation,
LayerNorm — then a projection onto the term vocabulary with its own weights (terms are words, not
tokens, so nothing to tie to). Like the MLM head it runs only on the gathered target rows.
"""

from __future__ import annotations

from torch import Tensor, nn


class NLMHead(nn.Module):
    def __init__(self, hidden_size: int, n_terms: int, layer_norm_eps: float = 1e-12, initializer_range: float = 0.02):
        super().__init__()
        if n_terms < 1:
            raise ValueError("the NLM head needs a non-empty term vocabulary")
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.GELU()  # exact (erf) GeLU, BERT's hidden_act
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, n_terms)
        self.initializer_range = initializer_range
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # BERT's init: N(0, 0.02) weights, zero biases, LayerNorm γ = 1 and β = 0.
        for linear in (self.dense, self.decoder):
            nn.init.normal_(linear.weight, mean=0.0, std=self.initializer_range)
            nn.init.zeros_(linear.bias)
        nn.init.ones_(self.layer_norm.weight)
        nn.init.zeros_(self.layer_norm.bias)

    def features(self, char_hidden_at_targets: Tensor) -> Tensor:
        """(K, H) char-channel rows at the noised tokens → (K, H) rows the decoder projects."""
        return self.layer_norm(self.activation(self.dense(char_hidden_at_targets)))

    def forward(self, char_hidden_at_targets: Tensor) -> Tensor:
        """(K, H) → term logits (K, T)."""
        return self.decoder(self.features(char_hidden_at_targets))
