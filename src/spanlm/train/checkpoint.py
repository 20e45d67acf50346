"""Checkpoints that never lose work.

A checkpoint directory ``step-000123/`` holds everything needed to continue exactly:

    model.safetensors      the objective's weights (backbone + heads; tied weights stored once)
    optimizer.pt           optimiser state (tensors and primitives only)
    trainer_state.pt       step, scheduler, data-loader position, metrics so far
    rng-rank{R}.pt         every RNG state of rank R (torch, CUDA, NumPy, Python) as tensors/primitives
    config.yaml            the resolved recipe
    COMPLETE               written last

It is written into a temporary directory, fsynced, renamed into place, and only then marked COMPLETE;
`latest_checkpoint` ignores any directory without the marker, so a process killed mid-write leaves the
previous checkpoint as the latest. Everything loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from spanlm.data.shards import fsync_tree
from spanlm.errors import InputError

MARKER = "COMPLETE"
STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(output_dir: Path, step: int) -> Path:
    return output_dir / "checkpoints" / f"step-{step:07d}"


def complete_checkpoints(output_dir: Path) -> list[Path]:
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


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
    if final.exists():  # a checkpoint of the same step (e.g. the final one after a periodic one)
        shutil.rmtree(final)
    tmp.rename(final)
    marker = final / MARKER
    with open(marker, "w") as handle:
        handle.write(f"{step}\n")
        handle.flush()
        os.fsync(handle.fileno())
    for old in complete_checkpoints(output_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_file(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(f"{path}: missing from the checkpoint") from None
    except Exception as error:  # a corrupt file raises several types
        raise InputError(f"{path}: unreadable checkpoint file ({error})".split("\n")[0]) from None
