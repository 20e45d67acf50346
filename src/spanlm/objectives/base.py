"""The objective interface: the one seam between the training loop and what is being trained.

An objective bundles a masker (NumPy, runs in DataLoader workers), a model (backbone(s) + heads) whose
``forward(batch)`` returns ``{"loss": …, <logged parts>…}``, and ``export(directory)`` writing what a
downstream user loads. The loop never branches on which objective it is running.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


TOKENIZER_FINGERPRINT_FILE = "tokenizer_fingerprint.txt"  # in a task model directory, beside the tokenizer files


class Objective(nn.Module):
    """Base class of every objective (pretraining and fine-tuning alike)."""

    #: callable(BlockBatch, np.random.Generator) -> MaskedBatch; must be picklable for worker processes
    masker = None
    #: continued pretraining: head name → where its weights came from ("loaded (...)" / "fresh (why)")
    head_report: dict[str, str] | None = None
    #: reads packed batches (spanlm.data.packing: blocks in one stream, ``position_ids``) with per-block
    #: semantics; an objective that does not is always given padded batches
    supports_packing = False

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``"loss"`` (a scalar to minimise) and any number of scalar parts to log (e.g. ``mlm_loss``)."""
        raise NotImplementedError

    def export(self, directory: Path, tokenizer) -> None:
        """Write the downstream artefact: a Hugging Face directory plus the heads beside it."""
        raise NotImplementedError

    def shard_units(self) -> list[nn.Module]:
        """Sub-modules FSDP2 shards one by one (the transformer layers); the rest goes with the root."""
        return []


class EncoderTask(Objective):
    """A fine-tuning objective: ``encoder`` (:mod:`spanlm.models.encoder`) + a task ``head``.

    Its export is the encoder's directory (which ``load_encoder`` and ``AutoModel`` load) with the head's
    weights beside it in ``head_file``.
    """

    encoder: nn.Module
    head: nn.Module
    head_file: str
    supports_packing = True  # the encoder unpacks its states to one window per row before the head

    def export(self, directory: Path, tokenizer=None) -> None:
        from safetensors.torch import save_file

        from spanlm.data.tokenizer import tokenizer_fingerprint

        self.encoder.save(directory)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(directory / self.head_file))
        # The ids the model was trained on mean these tokens only: a loader checks the tokenizer beside it.
        (directory / TOKENIZER_FINGERPRINT_FILE).write_text(tokenizer_fingerprint(self.encoder.tokenizer) + "\n", encoding="utf-8")

    def shard_units(self) -> list[nn.Module]:
        return self.encoder.shard_units()


def check_task_directory(directory: Path, files: tuple[str, ...], task: str) -> None:
    """A clear error unless ``directory`` holds every file a fine-tuned ``task`` model is made of."""
    from spanlm.errors import InputError

    for name in files:
        if not (directory / name).is_file():
            raise InputError(f"{directory}: not a spanlm {task} model (no {name}); "
                             f"pass the model/ directory of a `spanlm {task.lower()} train` run")


def ready_for_inference(objective: EncoderTask, directory: Path, device: str) -> torch.device:
    """Load the head's weights from ``directory``, move ``objective`` to ``device`` (auto: CUDA when present), eval mode."""
    from safetensors.torch import load_file

    from spanlm.data.tokenizer import tokenizer_fingerprint
    from spanlm.errors import InputError
    from spanlm.models.encoder import check_safetensors

    recorded = directory / TOKENIZER_FINGERPRINT_FILE
    if recorded.is_file():  # directories exported before it was recorded have none
        expected, found = recorded.read_text(encoding="utf-8").strip(), tokenizer_fingerprint(objective.encoder.tokenizer)
        if found != expected:
            raise InputError(f"{directory}: its tokenizer (fingerprint {found}) is not the one the model was trained with "
                             f"({expected}, in {TOKENIZER_FINGERPRINT_FILE}); the token ids would mean other words: "
                             "restore the tokenizer files exported with the model")
    head = directory / objective.head_file
    check_safetensors(head)
    try:
        objective.head.load_state_dict(load_file(str(head)))
    except RuntimeError as error:  # other shapes or names: another head's file
        raise InputError(f"{head}: does not fit this model's head: {error}".replace("\n", " ")) from None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    objective.to(device).eval()
    return torch.device(device)
