"""A pretraining curriculum in one recipe: ``phases``, run one after another in one output directory.

The encoders people start from in 2026 are trained in phases (ModernBERT, Warner et al. 2024; Ettin, Weller et al.
2025; mmBERT): a long phase at a short context, a context extension with a larger RoPE base, then a decay of the
learning rate while the masking rate falls. Each phase names its steps and the recipe keys it changes, on top of
the phase before::

    train: {schedule: wsd, decay_shape: 1-sqrt, warmup_steps: 30}
    phases:
      - {name: pretrain, steps: 400}
      - {name: extend, steps: 100, set: {data.max_len: 256, model.rope_theta: 160000}}
      - {name: decay, steps: 100, decay: true, set: {masking.mlm.rate: 0.15}}

A phase may change what leaves the weights' shapes alone (:data:`PHASE_KEYS`): the block length (the prepared corpus
is re-blocked, not prepared again), the batch, the masking (its rate or its schedule), the RoPE bases, the window of
ModernBERT's local layers. The learning-rate schedule is one over the whole run (``train.schedule_steps``); a
``decay: true`` phase is the decay of a ``wsd`` schedule. A masking-rate schedule counts the run's steps too, in
whichever phase it is set (``train.first_step``: where a phase's own batches start). The run's length is the phases'
steps.

Each phase is one engine run (:func:`spanlm.train.loop.train`) to the step its phase ends at, on its own resolved
recipe (``phase`` names it; every record carries it): the first starts the run, each next continues from the
checkpoint that ended the last (weights, optimiser, schedule, step and RNGs; its own data from its start, in an
order of its own, ``data.order_seed``). A run stopped anywhere resumes with ``--resume auto`` bit for bit: inside a
phase as any run resumes, at a boundary as the uninterrupted run continued. At the end of each phase the checkpoint
is exported to ``<run>/phase-<name>/`` (a transformers directory with its heads), so the phases' encoders can be
fine-tuned side by side.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from spanlm.errors import ConfigError

# The keys a phase may change: none of them changes a weight's shape, the objective or the tokenizer.
PHASE_KEYS = (
    "data.max_len",
    "data.packing",
    "data.tokens_per_batch",
    "data.prepared_shards",  # one tokenizer for all (checked): a source added for a phase, as mmBERT's decay adds
    "data.shard_weights",
    "data.input_weights",  # the inputs are prepared once: a phase changes only their weights
    "train.batch_size",
    "train.grad_accum",
    "train.log_every",
    "train.eval_every",
    "train.save_every",
    "train.keep_last",
    "model.rope_theta",
    "model.local_rope_theta",
    "model.local_attention",
    "model.max_position_embeddings",  # RoPE families only: a table of positions elsewhere
)
PHASE_PREFIXES = ("masking.",)  # the masking rate, its schedule, a scheme's settings (but masking.scheme itself)
FIXED = ("masking.scheme", "masking.span.max_targets")  # the objective; the SBO head's table of span positions
ROPE_FAMILIES = ("modernbert", "eurobert")
DEFAULT_MAX_STEPS = 200  # TrainConfig's: a phased recipe need not state train.max_steps


@dataclasses.dataclass
class PhaseConfig:
    """One phase: its name (its export is ``phase-<name>``), its steps and the recipe keys it changes."""

    name: str
    steps: int
    set: dict[str, Any] = dataclasses.field(default_factory=dict)
    decay: bool = False  # the decay of a wsd schedule (the last phase)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"a phase's name is letters, digits, '-' and '_' (it names a folder), got {self.name!r}")
        if self.steps < 1:
            raise ValueError(f"phase {self.name}: steps must be at least 1, got {self.steps}")


@dataclasses.dataclass(frozen=True)
class Phase:
    """A phase placed in its run: the steps it starts and ends at, its recipe resolved."""

    index: int
    config: PhaseConfig
    start: int
    end: int
    recipe: Any

    @property
    def export_dir(self) -> Path:
        return Path(self.recipe.train.output_dir) / f"phase-{self.config.name}"


def check_phases(recipe) -> None:
    """Refuse, at load, phases that cannot run: a key a phase may not change (naming the phase and the key), two
    phases of one name, a decay phase that is not the last or without a wsd schedule, a train.max_steps that is not
    the phases' steps."""
    phases = recipe.phases
    names = [phase.name for phase in phases]
    if len(set(names)) < len(names):
        raise ConfigError(f"phases: each phase needs its own name, got {names}")
    for index, phase in enumerate(phases):
        where = f"phases[{index}] ({phase.name})"
        for key in phase.set:
            allowed = key in PHASE_KEYS or (key.startswith(PHASE_PREFIXES) and key not in FIXED)
            if not allowed:
                raise ConfigError(
                    f"{where}: {key} cannot change between phases (it decides the weights' shapes, the objective, "
                    f"the tokenizer or the data); a phase may set {', '.join(PHASE_KEYS)}, masking.* but "
                    "masking.scheme"
                )
            if key == "model.max_position_embeddings" and recipe.model.family not in ROPE_FAMILIES:
                raise ConfigError(
                    f"{where}: model.max_position_embeddings is the shape of a {recipe.model.family} model's position "
                    f"table; only RoPE families ({', '.join(ROPE_FAMILIES)}) may change it between phases"
                )
        if phase.decay and (index != len(phases) - 1 or recipe.train.schedule != "wsd"):
            raise ConfigError(
                f"{where}: decay: true is the decay of a wsd schedule (train.schedule: wsd), the last phase"
            )
    if recipe.train.max_steps != DEFAULT_MAX_STEPS:  # a default stated is told apart from none by load_recipe
        check_run_length(recipe.train.max_steps, sum(phase.steps for phase in phases))


def check_run_length(stated_max_steps: int, total: int) -> None:
    """A phased run's length is its phases' steps (``total``): a stated ``train.max_steps`` must be that."""
    if stated_max_steps != total:
        raise ConfigError(
            f"train.max_steps {stated_max_steps}: a phased run's length is its phases' steps ({total}); "
            "leave train.max_steps out"
        )


def check_planned(recipe) -> None:
    """Refuse, at load, what would stop a later phase at its start after the earlier ones trained: a value its
    settings make invalid (:func:`plan` names the phase), blocks longer than its model numbers, shards that are not
    there."""
    from spanlm.data.shards import resolve_shards
    from spanlm.errors import InputError

    for phase in plan(recipe):
        where = f"phases[{phase.index}] ({phase.config.name})"
        schedule = phase.recipe.masking.rate_schedule
        ignored = [key for key in phase.config.set if key.startswith("masking.") and key.endswith(".rate")]
        if ignored and schedule.active:
            raise ConfigError(
                f"{where}: {ignored[0]} has no effect under masking.rate_schedule (kind {schedule.kind}), which "
                "sets the rate by the run's step; change the schedule instead, or end it in this phase "
                "(masking.rate_schedule: {kind: constant})"
            )
        if phase.index == 0:  # the first phase's start is the run's: it finds the rest at once
            continue
        limit = position_limit(recipe, phase)
        if limit is not None and phase.recipe.data.max_len > limit:
            raise ConfigError(
                f"{where}: data.max_len {phase.recipe.data.max_len} exceeds the {limit} positions the model numbers "
                "(model.max_position_embeddings, or the checkpoint of model.path)"
            )
        if "data.prepared_shards" in phase.config.set:
            try:
                shards = resolve_shards(phase.recipe.data.prepared_shards)
            except InputError as error:
                raise ConfigError(f"{where}: {error}") from None
            if missing := [str(shard) for shard in shards if not shard.is_dir()]:
                raise ConfigError(f"{where}: data.prepared_shards: {missing[0]} is not a prepared directory")
            first = resolve_shards(phase.recipe.data.held_out_shards) if phase.recipe.data.held_out_shards else []
            if not first or shards[: len(first)] != first:
                raise ConfigError(
                    f"{where}: data.prepared_shards must begin with the first phase's shards "
                    f"({', '.join(map(str, first)) or 'none: its corpus is data.prepared_dir'}) and may add others "
                    "after them (every phase holds out the same text, drawn from the first phase's corpus)"
                )


def position_limit(recipe, phase: Phase) -> int | None:
    """The most tokens ``phase``'s model numbers: its recipe's table, or the checkpoint's of ``model.path`` unless a
    phase up to this one sets ``model.max_position_embeddings`` (None where the checkpoint does not say)."""
    import json

    from spanlm.models.backbone import config_max_sequence_length

    model = phase.recipe.model
    set_here = any("model.max_position_embeddings" in p.set for p in recipe.phases[: phase.index + 1])
    if model.path is None or set_here:
        return model.max_position_embeddings
    try:
        config = json.loads((Path(model.path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no readable config: the run's own load of model.path says what is wrong
        return None
    return config_max_sequence_length(config) if isinstance(config, dict) else None


def plan(recipe) -> list[Phase]:
    """Each phase of ``recipe`` with its recipe resolved: the base recipe, every earlier phase's and this phase's
    settings applied in turn; the run's whole length as the schedule's; its own block order; ``phase`` its name."""
    from spanlm.config import from_dict, to_dict

    total = sum(phase.steps for phase in recipe.phases)
    decay = next((phase.steps for phase in recipe.phases if phase.decay), None)
    data = to_dict(recipe)
    data["phases"] = []
    resolved_phases, start = [], 0
    for index, phase in enumerate(recipe.phases):
        for key, value in phase.set.items():  # on top of the phases before
            *sections, last = key.split(".")
            node = data
            for section in sections:
                node = node.setdefault(section, {})
            node[last] = copy.deepcopy(value)
        end = start + phase.steps
        resolved = copy.deepcopy(data)
        train = resolved.setdefault("train", {})
        train.update({"max_steps": end, "schedule_steps": total, "first_step": start})
        if decay is not None:
            train["decay_share"] = decay / total
        resolved.setdefault("data", {})["order_seed"] = phase_order_seed(recipe, index)
        resolved["phase"] = phase.name
        resolved_phases.append((index, phase, start, end, resolved))
        start = end
    # every phase holds out the same text: blocks of the longest phase's length from the first phase's shards
    longest = max(r.get("data", {}).get("max_len", recipe.data.max_len) for *_, r in resolved_phases)
    first_shards = resolved_phases[0][-1].get("data", {}).get("prepared_shards", [])
    phases = []
    for index, phase, start, end, resolved in resolved_phases:
        resolved["data"].update(held_out_max_len=longest, held_out_shards=list(first_shards))
        try:
            phase_recipe = from_dict(type(recipe), resolved)
        except (ConfigError, ValueError) as error:
            raise ConfigError(f"phases[{index}] ({phase.name}): {error}") from None
        phases.append(Phase(index, phase, start, end, phase_recipe))
    return phases


def phase_order_seed(recipe, index: int) -> int | None:
    """The block order of phase ``index``: the recipe's own (``data.order_seed``, else ``seed``) for the first; for
    each next one a seed drawn from that one and the phase's index, so no phase of one seed repeats another seed's
    order (``seed + index`` would: seed 0's third phase would be seed 1's second)."""
    if index == 0:
        return recipe.data.order_seed
    base = recipe.seed if recipe.data.order_seed is None else recipe.data.order_seed
    return int(np.random.SeedSequence([base, index]).generate_state(1, dtype=np.uint32)[0])


def phase_at(recipe, step: int) -> Phase:
    """The phase of ``recipe`` that trains step ``step`` (from 0; past the end: the last)."""
    phases = plan(recipe)
    return next((phase for phase in phases if step < phase.end), phases[-1])


def pretrain_phases(recipe, resume: str | None, log, weights_from: str | None, train_phase, export) -> Path:
    """Run ``recipe``'s phases in turn (``train_phase(phase_recipe, resume=, weights_from=, phase_from=)`` runs one),
    each exported at its end (``export(checkpoint, directory)``); a resumed run (``--resume auto`` or a checkpoint)
    starts at the phase its checkpoint is in. Returns the run directory. A stop signal, wherever it lands (in a
    phase, its export or the next one's start), ends the curriculum at the checkpoint its phase saved, and the next
    ``--resume auto`` continues from there."""
    from spanlm.train import checkpoint as ckpt
    from spanlm.train.dist import is_main_process
    from spanlm.train.stop import StopSignal

    phases = plan(recipe)
    output = Path(recipe.train.output_dir)
    start = ckpt.resolve_resume(resume, output) if resume is not None else None
    done = ckpt.step_of(start) if start is not None else 0
    if resume not in (None, "auto") and start is not None and is_main_process():
        set_aside_later_phases(output, done, phases, log)

    def checkpoint_at(step: int) -> Path:
        return start if start is not None and ckpt.step_of(start) == step else ckpt.step_dir(output, step)

    with StopSignal() as stop:
        for phase in phases:
            if stop.received is not None:
                log(f"received {stop.received}: the curriculum stops before phase {phase.config.name}")
                return output
            if done < phase.end:
                log(f"phase {phase.config.name}: steps {phase.start + 1}–{phase.end} of {phases[-1].end}")
                if done == 0:
                    train_phase(phase.recipe, resume=resume, weights_from=weights_from)
                elif done == phase.start:
                    train_phase(phase.recipe, phase_from=str(checkpoint_at(phase.start)))
                else:  # inside the phase: from the checkpoint asked for (a later one is set aside, as any run's)
                    train_phase(phase.recipe, resume=str(start))
                start = ckpt.latest_checkpoint(output)
                done = ckpt.step_of(start) if start is not None else 0
                if done < phase.end or stop.received is not None:  # stopped: saved, to be resumed
                    return output
            if is_main_process() and not (phase.export_dir / "config.json").is_file():  # one writer under torchrun
                export(checkpoint_at(phase.end), phase.export_dir)
                log(f"phase {phase.config.name}: exported step {phase.end} to {phase.export_dir}")
    return output


def set_aside_later_phases(output: Path, step: int, phases: list[Phase], log) -> None:
    """A curriculum resumed from an earlier checkpoint of its own (``--resume PATH``) branches there: its later
    checkpoints and the exports of the phases that end after ``step`` move out of the way, as any run's later
    checkpoints do, so that neither ``--resume auto`` nor the exports keep the old branch."""
    from spanlm.train import checkpoint as ckpt

    aside = ckpt.set_aside_later(output, step)
    later = [phase.export_dir for phase in phases if phase.end > step and phase.export_dir.is_dir()]
    if later:
        if aside is None:
            aside = output / "checkpoints" / f"superseded-exports-{step}"
            aside.mkdir(parents=True, exist_ok=True)
        for directory in later:
            directory.rename(aside / directory.name)
    if aside is not None:
        log(f"this run now continues from step {step}: its later checkpoints and exports were moved to {aside}")
