"""Corpus reading, tokenizers, word boundaries, prepared token shards and pretraining blocks."""
