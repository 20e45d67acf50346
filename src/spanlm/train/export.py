"""`spanlm export CHECKPOINT --out DIR`: a checkpoint → the objective's downstream directory.

The directory holds what `transformers.AutoModel` / `AutoTokenizer` load without custom code
(config.json, model.safetensors, tokenizer files), the objective's heads beside it so pretraining can
continue, and the recipe (config.yaml).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from spanlm.errors import InputError
from spanlm.train.checkpoint import MARKER, latest_checkpoint


def load_objective_weights(objective, path: Path) -> None:
    """Load ``model.safetensors`` into an (unwrapped) objective; tied aliases may be absent."""
    from safetensors.torch import load_file

    every = {name for name, _ in objective.named_parameters(remove_duplicate=False)}
    aliases = every - {name for name, _ in objective.named_parameters()}
    result = objective.load_state_dict(load_file(str(path)), strict=False)
    missing = set(result.missing_keys) - aliases
    if missing or result.unexpected_keys:
        raise InputError(f"{path}: weights do not fit this objective (missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(result.unexpected_keys)[:5]})")


def write_directory(out: Path, fill: Callable[[Path], None]) -> Path:
    """Write ``out`` through ``fill(tmp)`` into a temporary sibling, fsync it and swap it into place.

    A crash or error midway leaves the previous ``out`` (if any) as it was and no partial directory.
    """
    from spanlm.data.shards import replace_directory

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        fill(tmp)
        replace_directory(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_checkpoint(checkpoint: str | Path, out: str | Path) -> Path:
    from spanlm.config import load_recipe, save_config
    from spanlm.data.shards import PreparedCorpus
    from spanlm.objectives import build_objective

    checkpoint, out = Path(checkpoint), Path(out)
    if not checkpoint.exists():
        raise InputError(f"{checkpoint}: no such checkpoint or run directory")
    if not (checkpoint / MARKER).is_file():
        latest = latest_checkpoint(checkpoint) if checkpoint.is_dir() else None
        if latest is None:
            raise InputError(f"{checkpoint}: not a complete checkpoint nor a run directory with one")
        checkpoint = latest
    recipe = load_recipe(checkpoint / "config.yaml")
    corpus = PreparedCorpus(recipe.data.prepared_dir)
    objective = build_objective(recipe, corpus)
    load_objective_weights(objective, checkpoint / "model.safetensors")
    objective.eval()

    def fill(directory: Path) -> None:
        objective.export(directory, corpus.tokenizer)
        corpus.tokenizer.save_pretrained(str(directory))
        save_config(recipe, directory / "config.yaml")

    return write_directory(out, fill)
