"""The objective interface: the one seam between the training loop and what is being trained.

An objective bundles a masker (NumPy, runs in DataLoader workers), a model (backbone(s) + heads) whose
``forward(batch)`` returns ``{"loss": …, <logged parts>…}``, and ``export(directory)`` writing what a
downstream user loads. The loop never branches on which objective it is running: pretraining objectives
(spanlm.objectives) and fine-tuning tasks (spanlm.finetune.model.EncoderTask: NER, QA) implement it alike.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class Objective(nn.Module):
    """Base class of every objective (pretraining and fine-tuning alike)."""

    #: callable(BlockBatch, np.random.Generator) -> MaskedBatch; must be picklable for worker processes
    masker = None
    #: continued pretraining: head name → where its weights came from ("loaded (...)" / "fresh (why)")
    head_report: dict[str, str] | None = None
    #: reads packed batches (spanlm.data.packing: blocks in one stream, ``position_ids``) with per-block
    #: semantics; an objective that does not is always given padded batches
    supports_packing = False
    #: the arrays of a masked batch ``forward`` reads; the loader sends only these (None: every array)
    batch_fields: tuple[str, ...] | None = None

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``"loss"`` (a scalar to minimise) and any number of scalar parts to log (e.g. ``mlm_loss``)."""
        raise NotImplementedError

    def export(self, directory: Path, tokenizer) -> None:
        """Write the downstream artefact: a Hugging Face directory plus the heads beside it."""
        raise NotImplementedError

    def shard_units(self) -> list[nn.Module]:
        """Sub-modules FSDP2 shards one by one (the transformer layers); the rest goes with the root."""
        return []
