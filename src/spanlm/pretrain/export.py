"""`spanlm export CHECKPOINT --out DIR`: a checkpoint → the objective's downstream directory.

The directory holds what `transformers.AutoModel` / `AutoTokenizer` load without custom code
(config.json, model.safetensors, tokenizer files), the objective's heads beside it so pretraining can
continue, and the recipe (config.yaml).
"""

from __future__ import annotations

import json
from fnmatch import fnmatch
from pathlib import Path

from spanlm.config import save_config
from spanlm.data.shards import PreparedCorpus, read_meta
from spanlm.data.tokenizer import save_tokenizer
from spanlm.errors import InputError
from spanlm.files import read_metadata, refuse_to_overwrite_inputs, write_directory
from spanlm.models.backbone import shortest_position_table
from spanlm.objectives import build_objective
from spanlm.objectives.pretrained_heads import OBJECTIVE_FILE
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

# What an export written before exports listed their files may hold: anything else in it is not the export's.
EARLIER_EXPORT_ENTRIES = (
    OBJECTIVE_FILE,
    "config.json",
    "config.yaml",
    "model*.safetensors",
    "model.safetensors.index.json",
    "heads.safetensors",
    "generator",
    "tokenizer*.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.py",
    "nlm_terms.json",
)


def check_replaceable(out: Path) -> None:
    """``out`` may become an export: absent, empty, or an earlier export (which the new one replaces whole).
    Anything else — a file, a run directory, a checkpoint of transformers', a directory of other things, an
    export that gained other files — would be lost with the swap."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory; --out names the directory to write")
    if not out.is_dir() or not any(out.iterdir()):
        return
    record = read_metadata(out / OBJECTIVE_FILE, "choose a new --out")
    if record is None:
        raise InputError(
            f"{out}: a directory that is not an earlier spanlm export (no {OBJECTIVE_FILE}) would be replaced "
            "with everything in it; choose a new --out"
        )
    listed = record.get("files")
    patterns = [OBJECTIVE_FILE, *listed] if isinstance(listed, list) else EARLIER_EXPORT_ENTRIES
    foreign = sorted(entry.name for entry in out.iterdir() if not any(fnmatch(entry.name, p) for p in patterns))
    if foreign:
        raise InputError(
            f"{out}: an earlier export that also holds {foreign[0]}"
            f"{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''}, which the new export would delete; "
            "choose a new --out or move it away"
        )


def record_files(directory: Path, objective_name: str) -> None:
    """The export's own record (``spanlm_objective.json``, which an objective may have begun) lists every entry the
    export wrote: what a later export into the same directory may replace (:func:`check_replaceable`)."""
    path = directory / OBJECTIVE_FILE
    record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"objective": objective_name}
    record["files"] = sorted(entry.name for entry in directory.iterdir() if entry.name != OBJECTIVE_FILE)
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")


def check_pretraining_run(checkpoint: Path) -> None:
    """A fine-tuning run's checkpoint has nothing to export: its run wrote its transformers directory already."""
    from spanlm.config import read_yaml

    recipe = read_yaml(checkpoint / "config.yaml")
    task = next((key for key in FINE_TUNING_SECTIONS if isinstance(recipe, dict) and key in recipe), None)
    if task is not None:
        run = checkpoint.parent.parent
        raise InputError(
            f"{checkpoint / 'config.yaml'}: a `spanlm {task} train` run, not a pretraining one; its transformers "
            f"directory is {run / 'model'} (written when the run finished; `--resume auto` finishes a stopped one)"
        )


FINE_TUNING_SECTIONS = ("ner", "qa", "cls")  # the recipe section that names each fine-tuning command's task


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
    check_pretraining_run(checkpoint)
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
        record_files(directory, recipe.objective.name)

    return write_directory(out, fill)
