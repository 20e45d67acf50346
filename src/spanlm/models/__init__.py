"""Encoders: the Hugging Face backbone builder/loader (embedding sharing and CharBERT live here too)."""

from spanlm.models.backbone import (
    ATTENTION,
    BackboneConfig,
    build_backbone,
    check_vocabulary,
    hidden_size,
    input_embeddings,
    max_sequence_length,
)

__all__ = [
    "ATTENTION",
    "BackboneConfig",
    "build_backbone",
    "check_vocabulary",
    "hidden_size",
    "input_embeddings",
    "max_sequence_length",
]
