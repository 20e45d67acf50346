"""Start/end span head (BERT, Devlin et al. 2019, §4.2): one linear layer H → 2 over every token.

The answer span i..j scores ``start[i] + end[j]``; the null answer (SQuAD v2.0) scores
``start[CLS] + end[CLS]``. Only context tokens and [CLS] may be chosen: every other position (question,
separators, padding) gets the dtype's minimum, which stays finite under bf16/fp16 where a constant
such as -1e12 would overflow.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SpanHead(nn.Module):
    def __init__(self, hidden_size: int, initializer_range: float = 0.02):
        super().__init__()
        self.qa_outputs = nn.Linear(hidden_size, 2)
        # BERT initialises every dense layer from N(0, initializer_range), biases at zero.
        nn.init.normal_(self.qa_outputs.weight, std=initializer_range)
        nn.init.zeros_(self.qa_outputs.bias)

    def forward(self, hidden: torch.Tensor, context_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L, H) hidden states, (B, L) context mask → (B, L) start and end logits, masked."""
        logits = self.qa_outputs(hidden)  # (B, L, 2)
        start, end = logits.unbind(-1)  # (B, L) each
        allowed = context_mask.clone()
        allowed[:, 0] = True  # [CLS]: the null answer, and the target of windows without the answer
        minimum = torch.finfo(logits.dtype).min
        return start.masked_fill(~allowed, minimum), end.masked_fill(~allowed, minimum)


def span_loss(
    start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor, end_positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BERT's loss: the mean of the start and end cross-entropies (each averaged over windows)."""
    start_loss = F.cross_entropy(start_logits.float(), start_positions)
    end_loss = F.cross_entropy(end_logits.float(), end_positions)
    return (start_loss + end_loss) / 2, start_loss, end_loss
