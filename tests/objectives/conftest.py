"""The objective folders' masker tests use the masking tests' corpora and hand-built batches."""

from masking.conftest import blocks, chinese, english, english_recipe, make_batch, vocab  # noqa: F401
