"""The toy span objective's model: embeddings, a 2-layer MLP with dropout, a decoder tied to the embeddings, and a
boundary head that predicts each run's first token from the token before it. Per token, so it reads packed
batches as padded ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from spanlm.masking.base import build_masker
from spanlm.train.objective import Objective


@dataclasses.dataclass
class ToySpanObjectiveConfig:
    """``objective.toy_span``: L = MLM + w·boundary."""

    boundary_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.boundary_weight < 0:
            raise ValueError(f"boundary_weight must be non-negative, got {self.boundary_weight}")


class ToySpan(Objective):
    supports_packing = True
    # attention_mask: the loop counts tokens with it
    batch_fields = ("input_ids", "attention_mask", "target_index", "target_labels", "boundary_index", "boundary_labels")
    name = "toy_span"

    def __init__(self, vocab_size: int, masker, boundary_weight: float, hidden: int = 16):
        super().__init__()
        self.masker, self.boundary_weight = masker, boundary_weight
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(0.1)) for _ in range(2)]
        )
        self.norm = nn.LayerNorm(hidden)
        self.boundary = nn.Linear(hidden, hidden)
        self.decoder = nn.Linear(hidden, vocab_size)
        self.decoder.weight = self.embedding.weight  # tied

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = self.embedding(batch["input_ids"])  # (B, L, H), or (1, T, H) packed
        for layer in self.layers:
            hidden = hidden + layer(hidden)
        rows = self.norm(hidden).flatten(0, 1)
        mlm = self._part(rows[batch["target_index"]], batch["target_labels"])
        boundary = self._part(self.boundary(rows[batch["boundary_index"]]), batch["boundary_labels"])
        return {
            "loss": mlm + self.boundary_weight * boundary,
            "mlm_loss": mlm.detach(),
            "boundary_loss": boundary.detach(),
        }

    def _part(self, rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        total = nn.functional.cross_entropy(self.decoder(rows).float(), labels, reduction="sum")
        return total / max(labels.numel(), 1)

    def export(self, directory: Path, tokenizer) -> None:
        from safetensors.torch import save_model

        save_model(self, str(directory / "toy_span.safetensors"))

    def shard_units(self):
        return list(self.layers)


def build_toy_span(recipe, corpus) -> ToySpan:
    return ToySpan(corpus.vocab_size, build_masker(recipe.masking, corpus), recipe.objective.section().boundary_weight)
