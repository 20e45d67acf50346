"""Checkpoints that never lose work.

A checkpoint directory ``step-000123/`` holds everything needed to continue exactly:

    model.safetensors      the objective's weights (backbone + heads; tied weights stored once)
    optimizer.pt           optimiser state (tensors and primitives only)
    trainer_state.pt       step, scheduler, data-loader position, metrics so far
    rng-rank{R}.pt         every RNG state of rank R (torch, CUDA, NumPy, Python) as tensors/primitives
    config.yaml            the resolved recipe
    COMPLETE               written last

Its trainer state names the tokenizer the weights read (fingerprint); the tokenizer itself is kept
once per run in ``tokenizers/<fingerprint>/`` (:mod:`spanlm.train.kept_tokenizer`), written before
the first checkpoint that names it.

It is written into a temporary directory, marked COMPLETE there once every file is fsynced, and
renamed into place in one step; `latest_checkpoint` ignores any directory without the marker, so a
process killed mid-write leaves the previous checkpoint as the latest. Everything loads with
``torch.load(weights_only=True)``.

Resuming from a checkpoint older than the run's latest starts a new branch of the run: the later
checkpoints are moved to ``checkpoints/superseded-<time>/`` (with a copy of ``metrics.jsonl``), never
deleted and never taken for the latest again.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from spanlm.data.shards import fsync_directory, fsync_tree, replace_directory
from spanlm.errors import InputError

MARKER = "COMPLETE"
STEP_DIR = re.compile(r"^step-(\d+)$")


class DamagedCheckpoint(InputError):
    """A file of a complete checkpoint is missing or unreadable (a disk fault, a hand-edited run)."""


def step_dir(output_dir: Path, step: int) -> Path:
    return output_dir / "checkpoints" / f"step-{step:07d}"


def step_of(path: Path) -> int:
    """The step of a ``step-N`` checkpoint directory (-1 for any other name)."""
    match = STEP_DIR.match(path.name)
    return int(match.group(1)) if match else -1


def complete_checkpoints(output_dir: Path) -> list[Path]:
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=step_of)


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def resolve_resume(resume: str | None, output_dir: Path) -> Path | None:
    """``auto`` → the latest complete checkpoint of this run (or None); a path → that checkpoint."""
    if not resume or resume == "none":
        return None
    if resume == "auto":
        return latest_checkpoint(output_dir)
    path = Path(resume)
    if (path / MARKER).is_file():
        return path
    if path.is_dir() and (latest := latest_checkpoint(path)) is not None:  # a run directory
        return latest
    raise InputError(f"{path}: not a complete checkpoint (no {MARKER} marker) nor a run directory with one")


def rng_state() -> dict:
    numpy_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(numpy_state[1].astype(np.int64)),
        "numpy_rest": [numpy_state[0], int(numpy_state[2]), int(numpy_state[3]), float(numpy_state[4])],
        "python": _python_state_to_primitives(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    kind, pos, has_gauss, gauss = state["numpy_rest"]
    np.random.set_state((kind, state["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _python_state_to_primitives(state) -> list:
    version, internal, gauss_next = state
    return [version, list(internal), gauss_next]


def write_checkpoint(output_dir: Path, step: int, files: dict[str, object], keep_last: int) -> Path:
    """Write ``files`` (name → callable(path) writing it) atomically as the checkpoint of ``step``."""
    final = step_dir(output_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, write in files.items():
        write(tmp / name)
    fsync_tree(tmp)
    with open(tmp / MARKER, "w") as handle:  # only after every file is on disk
        handle.write(f"{step}\n")
        handle.flush()
        os.fsync(handle.fileno())
    replace_directory(tmp, final)  # a checkpoint of the same step is removed only once the new one is in place
    fsync_directory(final.parent)
    for old in complete_checkpoints(output_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def set_aside_later(output_dir: Path, step: int) -> Path | None:
    """Move the run's complete checkpoints past ``step`` (and a copy of metrics.jsonl) out of the way.

    Why: resuming from an older checkpoint branches the run; ``--resume auto`` would otherwise take
    the old branch's later checkpoint and drop the new branch's steps. Returns where they went.
    """
    later = [p for p in complete_checkpoints(output_dir) if step_of(p) > step]
    if not later:
        return None
    target = output_dir / "checkpoints" / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    target.mkdir()
    if (output_dir / "metrics.jsonl").is_file():
        shutil.copy2(output_dir / "metrics.jsonl", target / "metrics.jsonl")
    for path in later:
        path.rename(target / path.name)
    return target


def alias_names(module: torch.nn.Module) -> set[str]:
    """Names under which a tied parameter appears a second time (decoder = embedding): stored once."""
    every = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    return every - {name for name, _ in module.named_parameters()}


def load_weights(path: Path, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A checkpoint's ``model.safetensors``, checked to fit ``module`` (names and shapes) before loading.

    Why check here: a checkpoint resumed or exported with another recipe (a different size, another
    run's checkpoint) or a corpus prepared again with a different vocabulary would otherwise fail
    deep inside ``load_state_dict`` with a size-mismatch traceback.
    """
    from safetensors.torch import load_file as load_safetensors

    if not path.is_file():
        raise DamagedCheckpoint(f"{path}: missing from the checkpoint")
    try:
        weights = load_safetensors(str(path))
    except Exception as error:  # a truncated or corrupt file raises several types
        raise DamagedCheckpoint(f"{path}: unreadable checkpoint file ({error})".split("\n")[0]) from None
    expected = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}  # global shapes, also under FSDP
    missing = sorted(set(expected) - set(weights) - alias_names(module))
    unexpected = sorted(set(weights) - set(expected))
    wrong = [f"{name} {tuple(weights[name].shape)} here vs {expected[name]} in the model" for name in sorted(weights)
             if name in expected and tuple(weights[name].shape) != expected[name]]
    if missing or unexpected or wrong:
        problems = [f"{len(wrong)} of another shape ({'; '.join(wrong[:3])})"] if wrong else []
        problems += [f"missing {missing[:5]}"] if missing else []
        problems += [f"unexpected {unexpected[:5]}"] if unexpected else []
        raise InputError(f"{path}: the weights do not fit the model the recipe builds: {', '.join(problems)}. "
                         "Use the recipe the checkpoint was trained with (its config.yaml) and the same prepared corpus")
    return weights


def load_file(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{path}: missing from the checkpoint") from None
    except Exception as error:  # a corrupt file raises several types
        raise DamagedCheckpoint(f"{path}: unreadable checkpoint file ({error})".split("\n")[0]) from None


def check_same_tokenizer(path: Path, trainer_state: dict, fingerprint: str | None, recipe) -> None:
    """Refuse a checkpoint whose token ids came from another tokenizer than the data's now.

    Why: ``pretrain`` prepares the corpus again when its inputs or settings change (or with
    ``--force``), which trains a new tokenizer — and the WordPiece / Unigram trainers of `tokenizers`
    do not reproduce their vocabulary (tokens, numbering) from run to run. The weights would silently
    read other tokens.
    """
    saved = trainer_state.get("tokenizer_fingerprint")
    if saved is None or fingerprint is None or saved == fingerprint:
        return
    from spanlm.train.kept_tokenizer import checkpoint_tokenizer_dir

    where = getattr(getattr(recipe, "data", None), "prepared_dir", "the data")
    kept = checkpoint_tokenizer_dir(path, saved)
    how = (f"to continue it, prepare a corpus with its tokenizer: tokenizer.path={kept / 'tokenizer'}" if kept is not None
           else "restore the corpus it was trained on, or start a new run")
    raise InputError(f"{path} was trained on the ids of tokenizer {saved}, but {where} now holds tokenizer {fingerprint} "
                     f"(the corpus was prepared again: its inputs or settings changed, or --force). Its weights would read "
                     f"other tokens: {how}")
