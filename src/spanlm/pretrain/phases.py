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
``decay: true`` phase is the decay of a ``wsd`` schedule. The run's length is the phases' steps.

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
    "model.rope_theta",
    "model.local_rope_theta",
    "model.local_attention",
    "model.max_position_embeddings",  # RoPE families only: a table of positions elsewhere
)
PHASE_PREFIXES = ("masking.",)  # the masking rate, its schedule, a scheme's settings (but masking.scheme itself)
FIXED = ("masking.scheme",)
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
    total = sum(phase.steps for phase in phases)
    if recipe.train.max_steps not in (DEFAULT_MAX_STEPS, total):
        raise ConfigError(
            f"train.max_steps {recipe.train.max_steps}: a phased run's length is its phases' steps ({total}); "
            "leave train.max_steps out"
        )


def plan(recipe) -> list[Phase]:
    """Each phase of ``recipe`` with its recipe resolved: the base recipe, every earlier phase's and this phase's
    settings applied in turn; the run's whole length as the schedule's; its own block order; ``phase`` its name."""
    from spanlm.config import from_dict, to_dict

    total = sum(phase.steps for phase in recipe.phases)
    decay = next((phase.steps for phase in recipe.phases if phase.decay), None)
    data = to_dict(recipe)
    data["phases"] = []
    phases, start = [], 0
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
        train.update({"max_steps": end, "schedule_steps": total})
        if decay is not None:
            train["decay_share"] = decay / total
        resolved.setdefault("data", {})["order_seed"] = None if index == 0 else recipe.seed + index
        resolved["phase"] = phase.name
        phases.append(Phase(index, phase, start, end, from_dict(type(recipe), resolved)))
        start = end
    return phases


def phase_at(recipe, step: int) -> Phase:
    """The phase of ``recipe`` that trains step ``step`` (from 0; past the end: the last)."""
    phases = plan(recipe)
    return next((phase for phase in phases if step < phase.end), phases[-1])


def pretrain_phases(recipe, resume: str | None, log, weights_from: str | None, train_phase, export) -> Path:
    """Run ``recipe``'s phases in turn (``train_phase(phase_recipe, resume=, weights_from=, phase_from=)`` runs one),
    each exported at its end (``export(checkpoint, directory)``); a resumed run starts at the phase its latest
    checkpoint is in. Returns the run directory. A phase stopped by a signal ends the curriculum there (the next
    ``--resume auto`` continues it)."""
    from spanlm.train import checkpoint as ckpt

    phases = plan(recipe)
    output = Path(recipe.train.output_dir)
    latest = ckpt.latest_checkpoint(output) if resume is not None else None
    done = ckpt.step_of(latest) if latest is not None else 0
    for phase in phases:
        if done < phase.end:
            log(f"phase {phase.config.name}: steps {phase.start + 1}–{phase.end} of {phases[-1].end}")
            if done == 0:
                train_phase(phase.recipe, resume=resume, weights_from=weights_from)
            elif done == phase.start:
                train_phase(phase.recipe, phase_from=str(ckpt.step_dir(output, phase.start)))
            else:
                train_phase(phase.recipe, resume="auto")
            latest = ckpt.latest_checkpoint(output)
            done = ckpt.step_of(latest) if latest is not None else 0
            if done < phase.end:  # stopped by a signal: saved, to be resumed
                return output
        if not (phase.export_dir / "config.json").is_file():
            export(ckpt.step_dir(output, phase.end), phase.export_dir)
            log(f"phase {phase.config.name}: exported step {phase.end} to {phase.export_dir}")
    return output
