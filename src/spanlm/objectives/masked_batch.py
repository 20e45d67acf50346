"""What the masked objectives share: the batch arrays they read and the encoder run over a masked batch."""

from __future__ import annotations

import torch

from spanlm.models.packed import encoder_states

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
    """Rows of ``hidden`` (B, L, H) at flat positions b·L + t → (N, H).

    Indexing, not ``index_select``: its backward accumulates the rows' gradients with one ``index_put_``, where
    ``index_select``'s goes through ``index_add_``, which the CPU runs a row at a time."""
    return hidden.flatten(0, 1)[flat_index]
