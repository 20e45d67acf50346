"""SpanBERT (Joshi et al. 2020, arXiv 1907.10529): span masking + MLM + the Span Boundary Objective.

Every masked token of a span [s, e] is predicted twice: by the MLM head from its own hidden state, and
by the SBO head from the span's boundary tokens x_{s-1}, x_{e+1} and its relative position. Loss
(the authors' criterion): ``MLM_sum / n_mlm + w_sbo · SBO_sum / (n_sbo + 1)``, each part logged.
Both heads decode through the input embeddings (tied) and run only on their real targets.
"""

from __future__ import annotations

from pathlib import Path

import torch

from spanlm.heads.losses import VocabTarget, span_bert_loss, vocab_cross_entropies
from spanlm.heads.sbo import SBOHead
from spanlm.masking.base import build_masker
from spanlm.models.backbone import (
    backbone_layers,
    build_backbone,
    hidden_size,
    input_embeddings,
    layer_norm_eps,
    mlm_head,
)
from spanlm.objectives.masked_batch import MLM_FIELDS, SBO_FIELDS, encode, gather_rows
from spanlm.objectives.pretrained_heads import export_with_heads, load_heads_if_present
from spanlm.train.objective import Objective


class SpanBERT(Objective):
    supports_packing = True
    batch_fields = (*MLM_FIELDS, *SBO_FIELDS)
    name = "spanbert"

    def __init__(self, backbone, masker, max_targets: int, sbo_weight: float, eps: float):
        super().__init__()
        self.backbone = backbone
        self.masker = masker
        self.sbo_weight = sbo_weight
        embedding = input_embeddings(backbone)
        self.mlm_head = mlm_head(backbone, initializer_range=0.02)
        self.sbo_head = SBOHead(hidden_size(backbone), embedding, max_targets=max_targets, layer_norm_eps=eps)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = encode(self.backbone, batch)  # (B, L, H)
        mlm_rows = self.mlm_head.features(gather_rows(hidden, batch["target_index"]))  # (N, E)
        sbo_rows = self.sbo_head.features(
            hidden, batch["sbo_left"], batch["sbo_right"], batch["sbo_relative"]
        )  # (M, E)
        mlm, sbo = vocab_cross_entropies(
            [
                VocabTarget(mlm_rows, self.mlm_head.decoder, batch["target_labels"]),
                VocabTarget(sbo_rows, self.sbo_head.decoder, batch["sbo_labels"]),
            ]
        )
        return span_bert_loss(mlm, sbo, self.sbo_weight)

    def export(self, directory: Path, tokenizer) -> None:
        export_with_heads(self, directory)

    def shard_units(self):
        return backbone_layers(self.backbone)


def build_spanbert(recipe, corpus) -> SpanBERT:
    backbone = build_backbone(recipe.model, corpus)
    objective = SpanBERT(
        backbone,
        build_masker(recipe.masking, corpus),
        recipe.masking.span.max_targets,
        recipe.objective.sbo_weight,
        layer_norm_eps(backbone),
    )
    load_heads_if_present(objective, recipe.model.path)
    return objective
