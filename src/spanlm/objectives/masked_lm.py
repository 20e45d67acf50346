"""Masked-LM objectives: BERT MLM, whole-word MLM and MacBERT — one model, different maskers.

Model: a backbone + BERT's MLM head (transform + decoder tied to the input embeddings), computed only
at the target rows: at 15% masking, projecting every position onto the vocabulary would be ~6.7×
wasted work. Loss: ``MLM_sum / n_targets`` over the original tokens of the targets.

- ``mlm``: any masker the recipe chooses (``masking.scheme``); BERT (Devlin et al. 2019) with ``mlm``.
- ``wwm``: whole-word masking (``masking.scheme: wwm``), words from the prepared shards (jieba for Chinese).
- ``macbert``: N-gram masking with similar-word correction (``masking.scheme: ngram``; Cui et al. 2020):
  the model reads similar words in place of [MASK] and predicts the original tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from spanlm.heads.losses import VocabTarget, masked_lm_loss, vocab_cross_entropies
from spanlm.heads.mlm import MLMHead
from spanlm.masking.base import build_masker
from spanlm.models.backbone import build_backbone, hidden_size, input_embeddings
from spanlm.models.packed import encoder_states
from spanlm.objectives import register
from spanlm.objectives.pretrained_heads import export_backbone, export_heads, load_heads
from spanlm.train.objective import Objective

# The batch arrays every MLM objective reads: the corrupted ids, the real tokens, the MLM targets and, in a
# packed batch, the blocks' positions, the segments' bounds and longest segment (computed with the batch, so
# the encoder derives nothing on the device) and where each token came from (Objective.batch_fields).
MLM_FIELDS = (
    "input_ids",
    "attention_mask",
    "target_index",
    "target_labels",
    "position_ids",
    "cu_seq_lens",
    "max_seq_len",
    "source_index",
)
SBO_FIELDS = ("sbo_left", "sbo_right", "sbo_relative", "sbo_labels")


def encode(backbone, batch: dict[str, torch.Tensor], input_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The backbone's last hidden states (B, L, H) for a masked batch, padded or packed (its ``position_ids``,
    ``cu_seq_lens`` and ``max_seq_len``); ``input_ids`` in place of the batch's own (ELECTRA's discriminator
    reads the generator's samples)."""
    ids = batch["input_ids"] if input_ids is None else input_ids
    return encoder_states(
        backbone,
        ids,
        batch["attention_mask"],
        batch.get("position_ids"),
        cu_seq_lens=batch.get("cu_seq_lens"),
        max_seq_len=batch.get("max_seq_len"),
    )


def gather_rows(hidden: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    """Rows of ``hidden`` (B, L, H) at flat positions b·L + t → (N, H)."""
    return hidden.flatten(0, 1).index_select(0, flat_index)


def export_with_heads(objective: Objective, directory: Path) -> None:
    """The backbone with its MLM head as transformers' ``*ForMaskedLM``; other heads in heads.safetensors."""
    written = {"mlm_head"} if export_backbone(objective.backbone, directory, objective.mlm_head, "mlm") else set()
    export_heads(objective, directory, written)


def load_heads_if_present(objective: Objective, model_path: str | None) -> None:
    """Continued pretraining from a checkpoint directory starts from every head it holds (the MLM head of a
    transformers ``*ForMaskedLM``, spanlm's other heads from heads.safetensors); the rest start fresh."""
    if model_path:
        load_heads(objective, Path(model_path), {"mlm_head": ("mlm", Path(model_path), objective.backbone.config)})


class MaskedLM(Objective):
    supports_packing = True
    batch_fields = MLM_FIELDS

    def __init__(self, name: str, backbone, masker, layer_norm_eps: float):
        super().__init__()
        self.name = name
        self.backbone = backbone
        self.masker = masker
        self.mlm_head = MLMHead(hidden_size(backbone), input_embeddings(backbone), layer_norm_eps=layer_norm_eps)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = encode(self.backbone, batch)  # (B, L, H)
        rows = self.mlm_head.features(gather_rows(hidden, batch["target_index"]))  # (N, E): targets only
        (mlm,) = vocab_cross_entropies([VocabTarget(rows, self.mlm_head.decoder, batch["target_labels"])])
        return masked_lm_loss(mlm)

    def export(self, directory: Path, tokenizer) -> None:
        export_with_heads(self, directory)

    def shard_units(self):
        return backbone_layers(self.backbone)


def backbone_layers(backbone) -> list:
    encoder = getattr(backbone, "encoder", None)
    return list(getattr(encoder, "layer", []))


def layer_norm_eps(backbone) -> float:
    return float(getattr(backbone.config, "layer_norm_eps", 1e-12))


def _builder(name: str):
    def build(recipe, corpus) -> MaskedLM:
        backbone = build_backbone(recipe.model, corpus)
        objective = MaskedLM(name, backbone, build_masker(recipe.masking, corpus), layer_norm_eps(backbone))
        load_heads_if_present(objective, recipe.model.path)
        return objective

    return build


register("mlm", schemes=("mlm", "wwm", "ngram", "span"))(_builder("mlm"))
register("wwm", schemes=("wwm",), needs="whole words")(_builder("wwm"))
register("macbert", schemes=("ngram",), needs="N-grams with similar-word replacements")(_builder("macbert"))
