"""Pretraining heads: pure torch modules applied to gathered target rows, decoders tied to the embedding."""

from spanlm.heads.losses import (
    IGNORE_INDEX,
    TokenLoss,
    VocabTarget,
    masked_lm_loss,
    span_bert_loss,
    token_cross_entropy,
    vocab_cross_entropies,
)
from spanlm.heads.mlm import MLMHead, TiedDecoder
from spanlm.heads.sbo import SBOHead, span_targets

__all__ = [
    "IGNORE_INDEX",
    "MLMHead",
    "SBOHead",
    "TiedDecoder",
    "TokenLoss",
    "VocabTarget",
    "masked_lm_loss",
    "span_bert_loss",
    "span_targets",
    "token_cross_entropy",
    "vocab_cross_entropies",
]
