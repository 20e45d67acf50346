"""Checkpoints that never lose work.

A checkpoint directory ``step-000123/`` holds everything needed to continue exactly:

    model.safetensors      the objective's weights (backbone + heads; tied weights stored once)
    optimizer.pt           optimiser state (tensors and primitives only)
    trainer_state.pt       step, scheduler, data-loader position, metrics so far
    rng-rank{R}.pt         every RNG state of rank R (torch, CUDA, NumPy, Python) as tensors/primitives
    config.yaml            the resolved recipe
    manifest.json          every file above (and in subdirectories) with its size in bytes
    COMPLETE               written last

Its trainer state names the tokenizer the weights read (fingerprint); what else a checkpoint needs is
kept once per run beside it by the task (``TrainingSetup.keep_with_run``: pretraining keeps its tokenizer),
written before the first checkpoint that names it.

Whole or absent: it is written into a temporary directory, marked COMPLETE there once every file and
the manifest are fsynced, and renamed into place in one step. Rotation (``train.keep_last``) removes an
old checkpoint's marker first, makes that durable, and only then deletes the rest, so a kill midway
leaves a directory without the marker, never a half-deleted one that claims to be complete. Only
directories with the marker count; of those, one whose files disagree with its manifest (a missing
or cut file: a disk fault, a hand-edited run) is passed over by ``--resume auto`` for the previous whole
one, saying so. A restart removes the temporary and half-deleted directories killed processes left.
Everything loads with ``torch.load(weights_only=True)``.

Resuming from a checkpoint older than the run's latest starts a new branch of the run: the later
checkpoints are moved to ``checkpoints/superseded-<time>/`` (with a copy of ``metrics.jsonl``), never
deleted and never taken for the latest again.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from spanlm.config import to_dict
from spanlm.errors import InputError
from spanlm.files import (
    check_safetensors,
    fsync_directory,
    fsync_tree,
    out_of_space,
    read_metadata,
    refused_pickle,
    replace_directory,
)
from spanlm.processes import process_alive

MARKER = "COMPLETE"
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")
# What a killed save or rotation can leave: a temporary directory (".step-N.tmp-PID"), a checkpoint of
# the same step being replaced ("step-N.old-PID", see replace_directory), or one being deleted ("step-N").
LEFTOVER = re.compile(r"^(\.step-\d+\.tmp-(?P<tmp_pid>\d+)|step-\d+\.old-(?P<old_pid>\d+))$")


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


def missing_parts(path: Path) -> str | None:
    """What of a complete checkpoint is gone or cut short against its manifest (None: it is whole).

    Checkpoints written before manifests were kept are checked for the files every checkpoint has.
    """
    try:
        manifest = read_metadata(path / MANIFEST, "")
    except InputError:  # damaged: the checkpoint cannot be vouched for
        return f"{MANIFEST} unreadable"
    if manifest is None:
        manifest = {name: None for name in ("model.safetensors", "optimizer.pt", "trainer_state.pt", "config.yaml")}
    problems = []
    for name, size in manifest.items():
        try:
            found = (path / name).stat().st_size
        except FileNotFoundError:
            problems.append(f"{name} missing")
            continue
        if size is not None and found != size:
            problems.append(f"{name} has {found} of its {size} bytes")
    return ", ".join(problems) or None


def latest_checkpoint(output_dir: Path, log=None) -> Path | None:
    """The run's latest whole checkpoint; a complete one that is not whole is passed over (``log`` says so)."""
    for path in reversed(complete_checkpoints(output_dir)):
        problem = missing_parts(path)
        if problem is None:
            return path
        if log is not None:
            log(f"{path} is damaged ({problem}): passed over for the previous whole checkpoint")
    return None


def resolve_resume(resume: str | None, output_dir: Path, log=None) -> Path | None:
    """``auto`` → the latest whole checkpoint of this run (or None); a path → that checkpoint."""
    if not resume or resume == "none":
        return None
    if resume == "auto":
        latest = latest_checkpoint(output_dir, log)
        if latest is None and (damaged := complete_checkpoints(output_dir)):  # never start afresh over a run
            raise DamagedCheckpoint(
                f"{damaged[-1]}: damaged checkpoint ({missing_parts(damaged[-1])}), and no earlier one of "
                f"{output_dir} is whole; restore it, or set another train.output_dir"
            )
        return latest
    path = Path(resume)
    if (path / MARKER).is_file():
        if (problem := missing_parts(path)) is not None:
            earlier = [
                p
                for p in complete_checkpoints(path.parent.parent)
                if step_of(p) < step_of(path) and missing_parts(p) is None
            ]
            hint = f"; an earlier checkpoint is whole: --resume {earlier[-1]}" if earlier else ""
            raise DamagedCheckpoint(f"{path}: damaged checkpoint ({problem}){hint}")
        return path
    if path.is_dir() and (latest := latest_checkpoint(path, log)) is not None:  # a run directory
        return latest
    raise InputError(f"{path}: not a complete checkpoint (no {MARKER} marker) nor a run directory with one")


def remove_leftovers(output_dir: Path, log=None) -> None:
    """Remove what killed saves and rotations of this run left: temporary directories of processes no
    longer alive, and checkpoint directories without the marker (half written, or half deleted)."""
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return
    for path in root.iterdir():
        match = LEFTOVER.match(path.name)
        if match is not None:
            pid = int(match.group("tmp_pid") or match.group("old_pid"))
            if pid != os.getpid() and process_alive(pid):
                continue  # another process's save in progress
        elif not (STEP_DIR.match(path.name) and not (path / MARKER).exists()):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if log is not None:
            log(f"removed {path}, left by a save or rotation that was killed")


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
    """Write ``files`` (name → callable(path) writing it) atomically as the checkpoint of ``step``.

    A write that fails (a full disk, a file-size limit) removes the temporary directory and raises an
    InputError naming the checkpoint; the checkpoints already there are untouched.
    """
    final = step_dir(output_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for name, write in files.items():
            write(tmp / name)
        sizes = {str(file.relative_to(tmp)): file.stat().st_size for file in sorted(tmp.rglob("*")) if file.is_file()}
        (tmp / MANIFEST).write_text(json.dumps(sizes, indent=1), encoding="utf-8")
        fsync_tree(tmp)
        with open(tmp / MARKER, "w") as handle:  # only after every file is on disk
            handle.write(f"{step}\n")
            handle.flush()
            os.fsync(handle.fileno())
        replace_directory(tmp, final)  # a checkpoint of the same step is removed only once the new one is in place
        fsync_directory(final.parent)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if (reason := out_of_space(error)) is not None:
            latest = latest_checkpoint(output_dir)
            raise InputError(
                f"{final}: could not write the checkpoint ({reason}); "
                + (f"the latest checkpoint {latest} is intact" if latest else "no earlier checkpoint")
            ) from None
        raise
    for old in complete_checkpoints(output_dir)[:-keep_last]:
        remove_checkpoint(old)
    return final


def remove_checkpoint(path: Path) -> None:
    """Unmark first (durably), then delete: a kill midway leaves an unmarked directory, never a
    half-deleted one marked complete. A restart removes it (remove_leftovers)."""
    (path / MARKER).unlink(missing_ok=True)
    fsync_directory(path)
    shutil.rmtree(path, ignore_errors=True)


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
    expected = {
        name: tuple(tensor.shape) for name, tensor in module.state_dict().items()
    }  # global shapes, also under FSDP
    missing = sorted(set(expected) - set(weights) - alias_names(module))
    unexpected = sorted(set(weights) - set(expected))
    wrong = [
        f"{name} {tuple(weights[name].shape)} here vs {expected[name]} in the model"
        for name in sorted(weights)
        if name in expected and tuple(weights[name].shape) != expected[name]
    ]
    if missing or unexpected or wrong:
        problems = [f"{len(wrong)} of another shape ({'; '.join(wrong[:3])})"] if wrong else []
        problems += [f"missing {missing[:5]}"] if missing else []
        problems += [f"unexpected {unexpected[:5]}"] if unexpected else []
        raise InputError(
            f"{path}: the weights do not fit the model the recipe builds: {', '.join(problems)}. "
            "Use the recipe the checkpoint was trained with (its config.yaml) and the same prepared corpus"
        )
    return weights


def load_objective_weights(objective, path: Path) -> None:
    """Load ``model.safetensors`` into an (unwrapped) objective; tied aliases may be absent."""

    check_safetensors(path)  # whole and finite, or a one-line error naming the file and tensor
    objective.load_state_dict(load_weights(path, objective), strict=False)


def load_file(path: Path) -> dict:
    """A checkpoint's ``.pt`` file, loaded weights-only; a file that is not what spanlm wrote is a DamagedCheckpoint.

    Why not torch's message: for a file whose pickle names something beyond tensors and plain data, it says
    that loading with ``weights_only=False`` "will likely succeed" — wrong for a corrupt file, and for a
    tampered one the way to run its code. spanlm's checkpoints hold nothing that needs it.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{path}: missing from the checkpoint") from None
    except Exception as error:  # a corrupt file raises several types; a tampered one, UnpicklingError
        raise DamagedCheckpoint(f"{path}: damaged or not a spanlm checkpoint file ({refused_pickle(error)})") from None


# Settings a resume may change: they move where and how often the run reports, saves and evaluates, or
# how fast it runs, not which batches it trains on, the model, or the optimisation. (retain_freed_memory:
# what runs saved before train.accel took it over.)
HARMLESS_SETTINGS = {
    f"train.{key}"
    for key in (
        "output_dir",
        "max_steps",
        "log_every",
        "save_every",
        "eval_every",
        "keep_last",
        "num_workers",
        "device",
        "compile",
        "peak_tflops",
        "accel",
        "retain_freed_memory",
        "distributed",
        "nonfinite",
    )
}
# Sections a task checks itself (pretraining: the tokenizer and the corpus it prepares) or about reporting only;
# the data settings that change every batch are the task's to declare (TrainingSetup.resume_keeps).
UNCHECKED_SECTIONS = ("logging.", "tokenizer.", "data.")


def check_same_settings(
    path: Path, trainer_state: dict, recipe, world_size: int, kept_data_settings: tuple[str, ...] = ()
) -> None:
    """Refuse to resume with settings that change the data order, the model or the optimisation.

    Why: such a resume runs without error but is no longer the run it continues (another seed or
    batch size draws other batches; another schedule or model shape learns something else), and
    nothing in its metrics would say so. Every changed setting is listed, old → new.
    """

    try:
        saved = read_metadata(path / "config.yaml", "the checkpoint is damaged")
    except InputError as error:  # named with an earlier checkpoint to resume instead (_naming_an_earlier_checkpoint)
        raise DamagedCheckpoint(str(error)) from None
    if saved is None:
        raise DamagedCheckpoint(f"{path / 'config.yaml'}: missing from the checkpoint")
    old, new = _flatten(saved), _flatten(to_dict(recipe))
    # Keys only one side has are settings an older or newer spanlm did not record: nothing to compare.
    changed = [
        f"{key}: {old[key]!r} → {new[key]!r}"
        for key in sorted(old.keys() & new.keys())
        if old[key] != new[key]
        and key not in HARMLESS_SETTINGS
        and (key in kept_data_settings or not key.startswith(UNCHECKED_SECTIONS))
    ]
    if trainer_state["world_size"] != world_size:
        # Every rank's data position is its own share of the batches: another count would repeat or skip data.
        changed.append(f"processes: {trainer_state['world_size']} → {world_size}")
    if changed:
        raise InputError(
            f"{path}: resuming with changed settings would not continue the same run ({'; '.join(changed)}). "
            "Restore them (the checkpoint's config.yaml), or pass --resume-weights-only PATH with another "
            "train.output_dir to start a new run from its weights (new optimiser, schedule and data position)"
        )


def stretched_schedule(path: Path, recipe, step: int) -> str | None:
    """What a resume with another ``train.max_steps`` does to the learning rate, in one line; None when it does
    nothing (the same length, a constant schedule, a phased run's fixed ``schedule_steps``).

    Why say it: the schedule spans the new length from the step the run resumes at, so a decaying rate steps up
    (or down) there, and the run is neither the shorter one it continues nor the longer one it will look like."""
    import dataclasses

    from spanlm.train.optim import lr_factor, schedule_length

    saved = (read_metadata(path / "config.yaml", "the checkpoint is damaged") or {}).get("train") or {}
    train, old_steps = recipe.train, saved.get("max_steps")
    if not isinstance(old_steps, int) or old_steps == train.max_steps or train.schedule_steps is not None:
        return None
    old = dataclasses.replace(train, max_steps=old_steps)
    before, after = train.lr * lr_factor(step, old), train.lr * lr_factor(step, train)
    if before == after:
        return None
    return (
        f"train.max_steps {old_steps} → {train.max_steps}: the {train.schedule} schedule now spans "
        f"{schedule_length(train)} steps, so the learning rate from step {step + 1} is {after:.3g} (it would have "
        f"been {before:.3g}); for a schedule that a longer run does not change, use train.schedule: wsd and resume "
        "before its decay, or constant"
    )


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
