"""The checkpointer: where a run starts (afresh, resumed, or from another run's weights), and the whole training
state — weights, optimiser, schedule, every rank's data position and RNGs, the recipe — saved and loaded through
:mod:`spanlm.train.checkpoint`'s atomic directories. Under FSDP2 the full state is gathered to rank 0."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from spanlm.config import save_config
from spanlm.errors import ConfigError, SpanlmError
from spanlm.train import checkpoint as ckpt
from spanlm.train.dist import DistEnv, barrier


@dataclasses.dataclass(frozen=True)
class StartingPoint:
    """Where a run starts: afresh, from a checkpoint (resume), or from a checkpoint's weights only
    (``--resume-weights-only``). The checkpoint's trainer state is read once, here."""

    checkpoint: Path | None = None
    weights_only: bool = False
    trainer_state: dict = dataclasses.field(default_factory=dict)
    # A new phase of a phased run from the checkpoint that ended the last: its weights, optimiser, schedule, step
    # and RNGs, a fresh data position, and the settings the phase changes (spanlm.pretrain.phases)
    new_phase: bool = False

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """The tokenizer whose ids the checkpoint was trained on (None afresh, or for an older checkpoint)."""
        return self.trainer_state.get("tokenizer_fingerprint")


def starting_point(
    output_dir: Path,
    resume: str | None,
    weights_from: str | None,
    env: DistEnv,
    log=print,
    phase_from: str | None = None,
) -> StartingPoint:
    """Resolve ``--resume`` / ``--resume-weights-only`` against ``output_dir`` once, before anything is built.

    Rank 0 first removes what killed saves left. A run directory that already holds a run is refused
    unless it is being resumed, or continued by a new phase (``phase_from``: the checkpoint it starts from).
    """
    if env.is_main:
        ckpt.remove_leftovers(output_dir, log)
    if phase_from is not None:
        checkpoint = ckpt.resolve_resume(phase_from, output_dir, log)
        with naming_an_earlier_checkpoint(checkpoint):
            state = ckpt.load_file(checkpoint / "trainer_state.pt")
        return StartingPoint(checkpoint, False, state, new_phase=True)
    if weights_from is not None and resume:
        raise ConfigError("--resume and --resume-weights-only exclude each other: pass one")
    checkpoint = ckpt.resolve_resume(weights_from or resume, output_dir, log)
    existing = ckpt.latest_checkpoint(output_dir)
    if existing is not None and (weights_from is not None or (checkpoint is None and resume != "auto")):
        raise SpanlmError(
            f"{output_dir} already holds a run (latest checkpoint {existing.name}); "
            + (
                "a run from another's weights starts at step 0: set another train.output_dir"
                if weights_from is not None
                else "pass --resume auto to continue it, or set another train.output_dir"
            )
        )
    if checkpoint is None:
        return StartingPoint()
    with naming_an_earlier_checkpoint(checkpoint):
        state = ckpt.load_file(checkpoint / "trainer_state.pt")
    return StartingPoint(checkpoint, weights_from is not None, state)


@contextlib.contextmanager
def naming_an_earlier_checkpoint(path: Path):
    """A damaged checkpoint's error names the latest earlier one that is whole, if any."""
    try:
        yield
    except ckpt.DamagedCheckpoint as error:
        earlier = [
            p
            for p in ckpt.complete_checkpoints(path.parent.parent)
            if ckpt.step_of(p) < ckpt.step_of(path) and ckpt.missing_parts(p) is None
        ]
        if not earlier:
            raise
        raise ckpt.DamagedCheckpoint(
            f"{error}; an earlier checkpoint may still be whole: --resume {earlier[-1]}"
        ) from None


class Checkpointer:
    """Saves and loads the state of one run's ``model`` (as wrapped: DDP or FSDP2), ``optimizer``, ``scheduler``
    and ``loader``; ``setup`` (the task's TrainingSetup) adds what the run keeps beside its checkpoints and the
    data settings a resume must keep."""

    def __init__(self, model, objective, optimizer, scheduler, loader, setup, recipe, env: DistEnv):
        self.model, self.objective, self.optimizer, self.scheduler = model, objective, optimizer, scheduler
        self.loader, self.setup, self.recipe, self.env = loader, setup, recipe, env
        self.output_dir = Path(recipe.train.output_dir)

    def save(self, step: int, elapsed: float) -> Path | None:
        """Write checkpoint ``step`` (rank 0; every rank takes part): its path on rank 0, None on the others."""
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        env = self.env
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.model, options=options)
        optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        rng, loader = ckpt.rng_state(), self.loader.state_dict()
        if env.enabled:  # every rank's RNG and data position, written by rank 0
            rngs, loaders = [None] * env.world_size, [None] * env.world_size
            dist.all_gather_object(rngs, rng)
            dist.all_gather_object(loaders, loader)
        else:
            rngs, loaders = [rng], [loader]
        path = None
        if env.is_main:
            aliases = ckpt.alias_names(self.objective)  # tied weights (decoder = embedding) are stored once
            tensors = {k: v.contiguous() for k, v in weights.items() if k not in aliases}
            trainer_state = {
                "step": step,
                "scheduler": self.scheduler.state_dict(),
                "loaders": loaders,
                "world_size": env.world_size,
                "seed": self.recipe.seed,
                "elapsed": elapsed,
                "tokenizer_fingerprint": self.setup.tokenizer_fingerprint,
            }

            files = {
                "model.safetensors": lambda p: save_file(tensors, str(p)),
                "optimizer.pt": lambda p: torch.save(optimizer, p),
                "trainer_state.pt": lambda p: torch.save(trainer_state, p),
                "config.yaml": lambda p: save_config(self.recipe, p),
            }
            for rank, state in enumerate(rngs):
                files[f"rng-rank{rank}.pt"] = lambda p, state=state: torch.save(state, p)
            if self.setup.keep_with_run is not None:  # before the checkpoint: a COMPLETE one always has it
                self.setup.keep_with_run(self.output_dir)
            path = ckpt.write_checkpoint(self.output_dir, step, files, self.recipe.train.keep_last)
        barrier(env)
        return path

    def load(self, start: StartingPoint) -> tuple[int, float] | None:
        """Load ``start``'s checkpoint: everything, returning its step and seconds trained, or only the weights for
        a new run from them (None: step 0, a fresh optimiser, schedule and data position)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        path, trainer_state, env = start.checkpoint, start.trainer_state, self.env
        with naming_an_earlier_checkpoint(path):
            if start.new_phase and trainer_state["world_size"] != env.world_size:
                raise ConfigError(
                    f"{path}: a phase continues on {trainer_state['world_size']} processes, not {env.world_size}"
                )
            if not (start.weights_only or start.new_phase):  # a new phase changes the settings its phase names
                ckpt.check_same_settings(path, trainer_state, self.recipe, env.world_size, self.setup.resume_keeps)
            weights = ckpt.load_weights(path / "model.safetensors", self.objective)
            set_model_state_dict(self.model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
            if start.weights_only:
                return None
            set_optimizer_state_dict(
                self.model,
                self.optimizer,
                ckpt.load_file(path / "optimizer.pt"),
                options=StateDictOptions(full_state_dict=True),
            )
            self.scheduler.load_state_dict(trainer_state["scheduler"])
            if not start.new_phase:  # a new phase reads its own data from its start
                self.loader.load_state_dict(trainer_state["loaders"][env.rank])
            ckpt.set_rng_state(ckpt.load_file(path / f"rng-rank{env.rank}.pt"))
        # Checkpoints written before the seconds trained were kept: 0.
        return int(trainer_state["step"]), float(trainer_state.get("elapsed", 0.0))
