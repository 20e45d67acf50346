"""The fine-tuning objective every task (NER, QA) builds on: an encoder plus a task head, and the model
directory a run exports (the encoder's Hugging Face directory, the head's weights, the task's own files).

The interface the loop trains is :class:`spanlm.train.objective.Objective`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from spanlm.data.tokenizer import tokenizer_fingerprint
from spanlm.errors import InputError
from spanlm.files import check_safetensors, write_directory
from spanlm.train.checkpoint import latest_checkpoint, load_objective_weights
from spanlm.train.objective import Objective

TOKENIZER_FINGERPRINT_FILE = "tokenizer_fingerprint.txt"  # in a task model directory, beside the tokenizer files
# In a fine-tuning run directory beside eval.json: the final dev evaluation per example (NER: per document, the
# counts its micro scores sum; QA: per question, EM and F1), which a bootstrap over the dev set resamples.
PER_EXAMPLE_FILE = "per_example.json"


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

        self.encoder.save(directory)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(directory / self.head_file))
        # The ids the model was trained on mean these tokens only: a loader checks the tokenizer beside it.
        (directory / TOKENIZER_FINGERPRINT_FILE).write_text(
            tokenizer_fingerprint(self.encoder.tokenizer) + "\n", encoding="utf-8"
        )

    def shard_units(self) -> list[nn.Module]:
        return self.encoder.shard_units()


def check_task_directory(directory: Path, files: tuple[str, ...], task: str) -> None:
    """A clear error unless ``directory`` holds every file a fine-tuned ``task`` model is made of."""

    for name in files:
        if not (directory / name).is_file():
            raise InputError(
                f"{directory}: not a spanlm {task} model (no {name}); "
                f"pass the model/ directory of a `spanlm {task.lower()} train` run"
            )


def ready_for_inference(
    objective: EncoderTask, directory: Path, device: str, head_state: dict | None = None
) -> torch.device:
    """Load the head's weights (``head_state``, or else the objective's ``head_file`` in ``directory``), move
    ``objective`` to ``device`` (auto: CUDA when present), eval mode."""
    from safetensors.torch import load_file

    recorded = directory / TOKENIZER_FINGERPRINT_FILE
    if recorded.is_file():  # directories exported before it was recorded have none
        expected, found = (
            recorded.read_text(encoding="utf-8").strip(),
            tokenizer_fingerprint(objective.encoder.tokenizer),
        )
        if found != expected:
            raise InputError(
                f"{directory}: its tokenizer (fingerprint {found}) is not the one the model was trained with "
                f"({expected}, in {TOKENIZER_FINGERPRINT_FILE}); the token ids would mean other words: "
                "restore the tokenizer files exported with the model"
            )
    head = directory / objective.head_file
    if head_state is None:
        check_safetensors(head)
        head_state = load_file(str(head))
    try:
        objective.head.load_state_dict(head_state)
    except RuntimeError as error:  # other shapes or names: another head's file
        raise InputError(f"{head}: does not fit this model's head: {error}".replace("\n", " ")) from None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    objective.to(device).eval()
    return torch.device(device)


def export_task_model(run_dir: Path, build: Callable[[], EncoderTask], write_files: Callable[[Path], None]) -> Path:
    """``<run>/model/`` from the run's latest checkpoint: ``build()`` gives the task's objective (the run's
    architecture; the checkpoint's weights replace its fresh ones), which exports the encoder and head, and
    ``write_files(directory)`` adds the task's own files. Written to a temporary directory, then renamed."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise InputError(f"{run_dir}: no complete checkpoint to export")
    objective = build()
    load_objective_weights(objective, checkpoint / "model.safetensors")

    def fill(directory: Path) -> None:
        objective.export(directory)
        write_files(directory)

    return write_directory(run_dir / "model", fill)
