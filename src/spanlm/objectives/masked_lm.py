"""The masked-LM model that BERT MLM, whole-word MLM and MacBERT share — one model, different maskers.

Model: a backbone + BERT's MLM head (transform + decoder tied to the input embeddings), computed only
at the target rows: at 15% masking, projecting every position onto the vocabulary would be ~6.7×
wasted work. Loss: ``MLM_sum / n_targets`` over the original tokens of the targets.

Each registers itself from its own folder (``spanlm.objectives.mlm``, ``.wwm``, ``.macbert``) with the builder
:func:`masked_lm_builder`:

- ``mlm``: any masker the recipe chooses (``masking.scheme``); BERT (Devlin et al. 2019) with ``mlm``.
- ``wwm``: whole-word masking (``masking.scheme: wwm``), words from the prepared shards (jieba for Chinese).
- ``macbert``: N-gram masking with similar-word correction (``masking.scheme: ngram``; Cui et al. 2020):
  the model reads similar words in place of [MASK] and predicts the original tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from spanlm.heads.losses import VocabTarget, masked_lm_loss, vocab_cross_entropies
from spanlm.masking.base import build_masker
from spanlm.models.backbone import backbone_layers, build_backbone, layer_norm_eps, mlm_head
from spanlm.objectives.masked_batch import MLM_FIELDS, encode, gather_rows
from spanlm.objectives.pretrained_heads import export_with_heads, load_heads_if_present
from spanlm.train.objective import Objective


class MaskedLM(Objective):
    supports_packing = True
    batch_fields = MLM_FIELDS

    def __init__(self, name: str, backbone, masker, layer_norm_eps: float):
        super().__init__()
        self.name = name
        self.backbone = backbone
        self.masker = masker
        self.mlm_head = mlm_head(backbone, initializer_range=0.02)  # the family's head; eps from the backbone

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = encode(self.backbone, batch)  # (B, L, H)
        rows = self.mlm_head.features(gather_rows(hidden, batch["target_index"]))  # (N, E): targets only
        (mlm,) = vocab_cross_entropies([VocabTarget(rows, self.mlm_head.decoder, batch["target_labels"])])
        return masked_lm_loss(mlm)

    def export(self, directory: Path, tokenizer) -> None:
        export_with_heads(self, directory)

    def shard_units(self):
        return backbone_layers(self.backbone)


def masked_lm_builder(name: str):
    """The builder of the masked-LM objective ``name``: a backbone, the recipe's masker and the MLM head."""

    def build(recipe, corpus) -> MaskedLM:
        backbone = build_backbone(recipe.model, corpus)
        objective = MaskedLM(name, backbone, build_masker(recipe.masking, corpus), layer_norm_eps(backbone))
        load_heads_if_present(objective, recipe.model.path)
        return objective

    return build
