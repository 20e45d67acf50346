"""Pretraining heads: pure torch modules applied to gathered target rows, decoders tied to the embedding."""

from spanlm.heads.losses import (
    IGNORE_INDEX,
    DecodedTarget,
    TokenLoss,
    count_targets,
    decoded_cross_entropies,
    decoded_cross_entropy,
    masked_lm_loss,
    masked_lm_weight,
    span_bert_loss,
    span_bert_weights,
    token_cross_entropy,
)
from spanlm.heads.mlm import MLMHead, TiedDecoder
from spanlm.heads.sbo import SBOHead, span_targets

__all__ = [
    "IGNORE_INDEX",
    "DecodedTarget",
    "MLMHead",
    "SBOHead",
    "TiedDecoder",
    "TokenLoss",
    "count_targets",
    "decoded_cross_entropies",
    "decoded_cross_entropy",
    "masked_lm_loss",
    "masked_lm_weight",
    "span_bert_loss",
    "span_bert_weights",
    "span_targets",
    "token_cross_entropy",
]
