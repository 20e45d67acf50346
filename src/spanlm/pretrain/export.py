"""`spanlm export CHECKPOINT --out DIR`: a checkpoint → the objective's downstream directory.

The directory holds what `transformers.AutoModel` / `AutoTokenizer` load without custom code
(config.json, model.safetensors, tokenizer files), the objective's heads beside it so pretraining can
continue, and the recipe (config.yaml).
"""

from __future__ import annotations

from pathlib import Path

from spanlm.config import save_config
from spanlm.data.shards import PreparedCorpus, read_meta
from spanlm.data.tokenizer import save_tokenizer
from spanlm.errors import InputError
from spanlm.files import refuse_to_overwrite_inputs, write_directory
from spanlm.models.backbone import shortest_position_table
from spanlm.objectives import build_objective
from spanlm.pretrain.kept_tokenizer import KeptTokenizer, check_same_tokenizer, checkpoint_tokenizer_dir
from spanlm.pretrain.recipe import load_recipe
from spanlm.train.checkpoint import (
    MARKER,
    complete_checkpoints,
    load_file,
    load_objective_weights,
    missing_parts,
    step_of,
)


def check_replaceable(out: Path) -> None:
    """``out`` may become an export: absent, empty, or an earlier export (which the new one replaces whole).
    Anything else — a file, a directory of other things — would be lost with the swap."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory; --out names the directory to write")
    if (
        out.is_dir()
        and any(out.iterdir())
        and not any((out / name).is_file() for name in ("config.json", "config.yaml"))
    ):
        raise InputError(
            f"{out}: a directory that is not an earlier export (no config.json or config.yaml) would be "
            "replaced with everything in it; choose a new --out"
        )


def _corpus_of(checkpoint: Path, prepared: Path, fingerprint: str | None):
    """What the model is built from: the prepared corpus while it still holds the checkpoint's tokenizer
    (an objective may need its token arrays), else the run's kept copy of that tokenizer."""

    kept = checkpoint_tokenizer_dir(checkpoint, fingerprint)
    if kept is None or (read_meta(prepared) or {}).get("tokenizer_fingerprint") == fingerprint:
        return PreparedCorpus(prepared)  # a checkpoint from before runs kept their tokenizer: the corpus or nothing
    return KeptTokenizer(kept)


def export_checkpoint(checkpoint: str | Path, out: str | Path) -> Path:

    checkpoint, out = Path(checkpoint), Path(out)
    given = checkpoint
    check_replaceable(out)
    if not checkpoint.exists():
        raise InputError(f"{checkpoint}: no such checkpoint or run directory")
    if not (checkpoint / MARKER).is_file():
        complete = complete_checkpoints(checkpoint) if checkpoint.is_dir() else []
        if not complete:
            raise InputError(f"{checkpoint}: not a complete checkpoint nor a run directory with one")
        checkpoint = complete[-1]
    # The new export replaces --out whole: it must neither hold nor be the run's checkpoint, nor go inside it.
    refuse_to_overwrite_inputs(out, [given, checkpoint.parent.parent], "--out", replaces_directory=True)
    refuse_to_overwrite_inputs(out, [checkpoint], "--out", replaces_directory=True, enters=True)
    if (problem := missing_parts(checkpoint)) is not None:
        # An export is of the checkpoint asked for (a run's latest): never quietly of an older one.
        earlier = [
            p
            for p in complete_checkpoints(checkpoint.parent)
            if step_of(p) < step_of(checkpoint) and missing_parts(p) is None
        ]
        hint = f"; an earlier checkpoint is whole: spanlm export {earlier[-1]}" if earlier else ""
        raise InputError(f"{checkpoint}/{problem}: the checkpoint is damaged{hint}")
    recipe = load_recipe(checkpoint / "config.yaml")
    prepared = Path(recipe.data.prepared_dir)
    trainer_state = load_file(checkpoint / "trainer_state.pt")
    fingerprint = trainer_state.get("tokenizer_fingerprint")
    if (
        checkpoint_tokenizer_dir(checkpoint, fingerprint) is None
        and not prepared.is_absolute()
        and not prepared.exists()
    ):
        raise InputError(
            f"{checkpoint}: its recipe's data.prepared_dir '{prepared}' is relative to the directory the run was "
            f"started from and is not found from {Path.cwd()}; run `spanlm export` from there"
        )
    corpus = _corpus_of(checkpoint, prepared, fingerprint)
    check_same_tokenizer(checkpoint, trainer_state, corpus.meta["tokenizer_fingerprint"], recipe)
    objective = build_objective(recipe, corpus)
    load_objective_weights(objective, checkpoint / "model.safetensors")
    objective.eval()

    tokenizer = corpus.tokenizer
    # The exported tokenizer truncates (truncation=True) at what the model can number, as a hub checkpoint's does.
    tokenizer.model_max_length = shortest_position_table(objective) or tokenizer.model_max_length

    def fill(directory: Path) -> None:
        objective.export(directory, tokenizer)
        save_tokenizer(tokenizer, directory)
        save_config(recipe, directory / "config.yaml")

    return write_directory(out, fill)
