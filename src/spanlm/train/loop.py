"""The training loop — the same for every objective, on one process or many (torchrun).

Read top to bottom: set up processes → data → objective → optimiser → resume → train steps (micro-
batches, clipping, non-finite guard, schedule) → log / evaluate / checkpoint / stop on a signal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from spanlm import accel
from spanlm.cli_support import set_library_progress_bars
from spanlm.config import save_config
from spanlm.errors import SpanlmError
from spanlm.train import checkpoint as ckpt
from spanlm.train import speed
from spanlm.train.checkpointer import Checkpointer, StartingPoint, starting_point
from spanlm.train.dist import DistEnv, all_reduce, any_rank, init_distributed, shutdown
from spanlm.train.health import LearningHealth, summarise_tallies
from spanlm.train.metrics import MetricsLogger, MetricsWindow, progress_bar, progress_fields, trackers_to_start
from spanlm.train.objective import Objective
from spanlm.train.optim import (
    build_optimizer,
    build_scheduler,
    clip_gradients,
    encoder_and_head_groups,
    total_norm,
)
from spanlm.train.parallel import no_sync, wrap
from spanlm.train.stop import StopSignal


class TrainingHalted(SpanlmError):
    """Training stopped on purpose (non-finite values) with a message naming the step."""


@dataclasses.dataclass
class TrainingSetup:
    """What a task hands the loop: the seam between pretraining / fine-tuning data and the one loop.

    ``loader`` yields dicts of tensors (with ``attention_mask``, whose sum counts the tokens) forever
    and is resumable (``state_dict`` / ``load_state_dict``, e.g. spanlm.train.loader.KeyedLoader).
    ``eval_batches()`` yields this rank's held-out batches, the same ones at every call; their mean
    output parts are the evaluation losses. ``evaluate(model)``, when given, adds task metrics computed
    by the task itself (e.g. NER F1), already reduced over ranks.
    """

    objective: Objective
    loader: Any
    eval_batches: Callable[[], Iterable[dict[str, torch.Tensor]]]
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None
    # The fingerprint of the tokenizer whose ids the data holds (pretraining: the prepared corpus's).
    # Checkpoints record it; resuming against data of another tokenizer is refused.
    tokenizer_fingerprint: str | None = None
    # Writes into the run directory what its checkpoints need besides their own files (pretraining:
    # the tokenizer); called on rank 0 before each checkpoint.
    keep_with_run: Callable[[Path], object] | None = None
    # The task's data settings a resume must keep, as recipe keys ("data.max_len"): they change every batch.
    # The engine checks every other section itself (spanlm.train.checkpoint.check_same_settings).
    resume_keeps: tuple[str, ...] = ()
    # The recipe with what the setup resolved (a label order, data.packing: auto → true / false), a copy: the
    # run's config.yaml, the resume check and the trackers record it. None: the recipe as given.
    recipe: Any = None
    # The model's FLOPs for one forward and backward pass over a micro-batch (a float64 scalar on its device,
    # computed there: no host read), from the model's dimensions and the batch's real tokens
    # (spanlm.models.flops); the records' ``mfu`` divides them by the device's peak. None: no ``mfu``.
    flops: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None = None
    # Called on rank 0 once the run is known to start — its resume checks passed, its trackers started — before the
    # first step: what the task writes outside the run's own directory (pretraining: the run's line in its prepared
    # corpus's runs.txt), so that a run refused or failing before it writes nothing there.
    on_start: Callable[[], object] | None = None
    # Learning health (spanlm.train.health): the recipe keys that usually make a run that is not learning learn, as
    # the task words them, and a fine-tuning task's training loss when it has learnt nothing (ln K for K labels).
    learning_hint: str | None = None
    chance_loss: float | None = None
    # Fields every record of this run carries (a phased run's ``phase``), after its kind and step
    record_fields: dict[str, Any] = dataclasses.field(default_factory=dict)


def train(
    recipe,
    build_setup: Callable[..., TrainingSetup],
    resume: str | None = None,
    log=print,
    weights_from: str | None = None,
    phase_from: str | None = None,
) -> Path:
    """Train what ``build_setup(recipe, env, log, start)`` sets up; returns the run directory.

    ``recipe`` is any typed recipe with ``seed``, ``train`` (TrainConfig) and ``logging`` sections.
    ``resume``: None, "auto" or a checkpoint / run directory. ``weights_from``: a checkpoint / run
    directory whose weights start a new run (``--resume-weights-only``; any settings may differ).
    ``phase_from``: the checkpoint that ended a phased run's last phase, which this one continues in the same
    output directory (everything but the data position; the settings its phase changes may differ).
    """
    env = init_distributed(recipe.train.device)
    try:
        quiet = log if env.is_main else (lambda *_: None)
        start = starting_point(Path(recipe.train.output_dir), resume, weights_from, env, quiet, phase_from)
        return Trainer(recipe, env, build_setup, log, start).run()
    except BaseException as error:
        # The failed frames hold the trainer, and so the process group, for as long as the error lives: let go
        # of their variables so that shutdown can destroy the group now (the traceback itself is kept).
        traceback.clear_frames(error.__traceback__)
        raise
    finally:
        shutdown(env)


class Trainer:
    def __init__(
        self,
        recipe,
        env: DistEnv,
        build_setup: Callable[..., TrainingSetup],
        log=print,
        start: StartingPoint = StartingPoint(),
    ):
        self.recipe, self.env, self.config, self.start = recipe, env, recipe.train, start
        self.log = log if env.is_main else (lambda *_: None)
        self.trackers = trackers_to_start(recipe.logging)  # a tracker named but not installed: refused before any work
        self.output_dir = Path(self.config.output_dir)

        # Bars only on a terminal: redirected to a file, a bar's every redraw is a line (the run logs a line per
        # window instead: _train)
        self.bars = recipe.logging.progress and sys.stderr.isatty()
        set_library_progress_bars(self.bars)  # before the setup loads a model or a dataset
        env.packs_by_default = accel.packs_by_default(env.device)  # what the setup resolves data.packing: auto to
        self.setup = build_setup(recipe, env, self.log, start)
        if self.setup.recipe is not None:  # what the setup resolved, never written into the recipe it was given
            self.recipe = recipe = self.setup.recipe
        # train.precision: auto resolved for this device, in a copy (the run's config.yaml and the resume check see
        # what ran), and said before anything is computed
        precision = speed.resolve_precision(recipe.train.precision, env.device)
        self.recipe = recipe = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, precision=precision))
        self.config = recipe.train
        self.log(f"precision: {speed.PRECISION_WORDS[precision]} on {env.device.type}")
        self.peak_flops = None  # FLOP/s of the device that mfu divides by: set once the run is known to train
        self.peak_measured_again = False  # once, if the model outruns a peak measured on a busy device
        self.peak_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.objective = self.setup.objective.to(env.device)
        # The device's speed backend, in place (spanlm.accel; on CPU its kernels are built now, not under the
        # progress bar), with a packed run's attention path
        packed = getattr(getattr(recipe, "data", None), "packing", False) is True
        self.accel = accel.apply(self.objective, env.device, self.config.accel, packed=packed)
        self.gradient_norm = accel.gradient_norm(self.accel, total_norm)
        self.model = wrap(self.objective, self.config, env)
        self.optimizer = build_optimizer(self.objective, self.config)
        self.scheduler = build_scheduler(self.optimizer, self.config)
        self.rate_groups = encoder_and_head_groups(self.objective, self.optimizer)
        self.health = LearningHealth(self.setup.learning_hint, self.setup.chance_loss, self.config.max_steps)
        self.loader = self.setup.loader
        self.checkpointer = Checkpointer(
            self.model, self.objective, self.optimizer, self.scheduler, self.loader, self.setup, recipe, env
        )
        torch.manual_seed(recipe.seed + env.rank)  # dropout differs across ranks, reproducibly
        self.step = 0
        self.elapsed_before = 0.0  # seconds trained before this process (a resumed checkpoint's); see elapsed()
        self.first_step_seconds, self.frames_after_first_step = None, 0  # train.compile's cost (_first_step_compiled)
        if env.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)

    def _autocast(self):
        if self.config.precision == "bf16":
            return torch.autocast(self.env.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def save(self) -> Path | None:
        return self.checkpointer.save(self.step, self.elapsed())

    # -- evaluation -------------------------------------------------------------------------------
    @torch.no_grad()
    @torch.compiler.set_stance("force_eager")
    def evaluate(self) -> dict[str, float]:
        # Eager under train.compile: a forward without gradients would be a second graph, compiled at the first
        # evaluation; the held-out batches are few, the training step is what the compiler is for.
        self.objective.eval()
        sums, tallies, batches = defaultdict(float), {}, 0
        for batch in self.setup.eval_batches():
            with self._autocast():
                output = self.model(_to(batch, self.env.device))
            for key, value in output.items():
                if value.dim() == 0:
                    sums[key] += float(value)
                else:  # a tally (spanlm.train.health): summed over the batches
                    tallies[key] = tallies[key] + value if key in tallies else value
            batches += 1
        metrics = {}
        if sums:
            keys = sorted(sums)
            means = all_reduce(
                torch.tensor([sums[k] / batches for k in keys], dtype=torch.float64, device=self.env.device), self.env
            )
            metrics = dict(zip(keys, means.tolist()))
        if tallies:
            metrics.update(summarise_tallies({k: all_reduce(v, self.env, op="sum") for k, v in tallies.items()}))
        if self.setup.evaluate is not None:
            with self._autocast():
                metrics.update(self.setup.evaluate(self.model))
        self.objective.train()
        return metrics

    # -- the loop -----------------------------------------------------------------------------------
    def run(self) -> Path:
        config, env, start = self.config, self.env, self.start
        self.started = time.monotonic()
        if start.checkpoint is not None and (loaded := self.checkpointer.load(start)) is not None:
            self.step, self.elapsed_before = loaded
        if start.weights_only:
            self.log(f"started from the weights of {start.checkpoint} (new optimiser, schedule and data position)")
        elif start.new_phase:
            self.log(f"continued from {start.checkpoint} at step {self.step} (the last phase's end; its own data)")
        elif start.checkpoint is not None:
            self.log(f"resumed from {start.checkpoint} at step {self.step}")
            if env.is_main and (note := ckpt.stretched_schedule(start.checkpoint, self.recipe, self.step)):
                self.log(note)
            if env.is_main and (aside := ckpt.set_aside_later(self.output_dir, self.step)) is not None:
                self.log(f"this run now continues from step {self.step}: its later checkpoints were moved to {aside}")
        resumed = start.checkpoint is not None and not start.weights_only  # a new run's metrics start afresh
        nothing_to_train = self.step >= config.max_steps
        if self.setup.flops is not None and not nothing_to_train:  # after the resume checks: a refusal is at once
            self._set_peak()
        logger = None if nothing_to_train else self._open_logger(self.step if resumed else None)
        with logger or contextlib.nullcontext():
            if env.is_main:  # only now: a refused or failed start (a tracker too) leaves the run's recipe as it was
                save_config(self.recipe, self.output_dir / "config.yaml")
                if self.setup.on_start is not None and not nothing_to_train:
                    self.setup.on_start()
            if nothing_to_train:
                self.log(
                    f"step {self.step} already reaches train.max_steps {config.max_steps}: nothing to train "
                    "(raise train.max_steps to continue)"
                )
                return self.output_dir
            return self._train(logger)

    def _open_logger(self, resumed_step: int | None) -> MetricsLogger | None:
        """Rank 0's metrics.jsonl and trackers (None on the other ranks); a tracker that cannot start stops every
        rank."""
        logger, failure = None, None
        if self.env.is_main:
            try:
                logger = MetricsLogger(self.output_dir, resumed_step, self.recipe, self.trackers, self.log)
            except SpanlmError as error:
                failure = error
        if any_rank(failure is not None, self.env):
            reason = [str(failure) if failure else None]
            if self.env.enabled:
                dist.broadcast_object_list(reason, src=0)  # every rank stops with rank 0's message
            raise failure or SpanlmError(reason[0])
        return logger

    def _train(self, logger: MetricsLogger | None) -> Path:
        config, env = self.config, self.env
        progress = progress_bar(config.max_steps, self.step, env.is_main and self.bars)
        window_lines = self.recipe.logging.progress and not self.bars  # a log that is a file: a line per window
        batches = iter(self.loader)
        window, started, skipped = MetricsWindow(env.device), time.perf_counter(), 0
        self.objective.train()
        # From the first evaluation to the last save, a stop signal only sets a flag: an evaluation runs to its
        # end, the step after it too, then the run saves; a save under way completes.
        try:
            with StopSignal() as stop:
                if config.eval_at_start and self.step == 0:
                    evaluation = self.evaluate()
                    if logger and evaluation:
                        logger.log(
                            {"kind": "eval", "step": 0, **self.setup.record_fields, **self._clock(), **evaluation}
                        )
                    self._say_health(logger, self.health.after_evaluation(0, evaluation))
                first_step, first_started = self.step + 1, time.perf_counter()
                while self.step < config.max_steps:
                    self._step(batches, window)
                    progress.update(1)
                    if self.step == first_step and config.compile:
                        self._first_step_compiled(window, first_started)

                    if self.step % config.log_every == 0 or self.step == config.max_steps:
                        record = self._log_record(window, started, skipped)  # the one host read of the window
                        skipped = record["skipped_steps"]
                        if logger:
                            logger.log(record)
                        self._say_health(logger, self.health.after_train_record(self.step, record.get("loss")))
                        progress.set_postfix(progress_fields(record))
                        if window_lines:
                            fields = " ".join(f"{k} {v}" for k, v in progress_fields(record).items())
                            self.log(f"step {self.step}/{config.max_steps}: {fields}")
                        window, started = MetricsWindow(env.device), time.perf_counter()
                    if config.eval_every and (self.step % config.eval_every == 0 or self.step == config.max_steps):
                        self._check_finite(window)
                        evaluation = self.evaluate()
                        if logger and evaluation:
                            logger.log(
                                {
                                    "kind": "eval",
                                    "step": self.step,
                                    **self.setup.record_fields,
                                    **self._clock(),
                                    **evaluation,
                                }
                            )
                        self._say_health(logger, self.health.after_evaluation(self.step, evaluation))
                    received = any_rank(stop.received is not None, env)  # host-side: no device sync
                    if received:
                        self._check_finite(window)
                        if self.step % config.log_every:  # the steps since the last record: kept (every rank reduces)
                            record = self._log_record(window, started, skipped)
                            if logger:
                                logger.log(record)
                        stop.note(stop.received or "a stop signal on another rank")
                        self.log(f"received {stop.received}: saved step {self.step}, exiting")
                        self.save()
                        return self.output_dir
                    if self.step % config.save_every == 0 and self.step < config.max_steps:
                        self._check_finite(window)
                        self.save()
                self._check_finite(window)
                self.save()
            return self.output_dir
        finally:
            progress.close()

    def _step(self, batches, window: "MetricsWindow") -> None:
        """One training step: forward/backward, the update unless a value is not finite, the schedule.

        At most one host read (none with fused AdamW): the metrics go to ``window``, on the device.
        """
        config = self.config
        parts, step_tokens, step_flops, data_wait = self._train_step(batches)
        bad = self._nonfinite(parts)
        if self._skips_on_device():
            # Fused AdamW leaves weights and moments alone where ``found_inf`` is set (the hook GradScaler
            # uses), on the device: no host read. Under nonfinite=stop nothing after the first bad step is
            # applied either; the run halts at the next record, save or evaluation (_check_finite).
            self.optimizer.found_inf = (bad | window.halted if config.nonfinite == "stop" else bad).float()
            self.optimizer.step()
        elif bool(bad):  # any other optimiser: the step's one host read decides
            if config.nonfinite == "stop":
                raise TrainingHalted(_nonfinite_message(self.step + 1, parts) + _STOPPED)
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        window.add(parts, bad, step_tokens, self.step, step_flops, data_wait)

    def _train_step(self, batches) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor | None, float]:
        """One optimiser step's forward/backward over ``grad_accum`` micro-batches; returns its metrics, token count
        and model FLOPs as tensors on the device (read only when a record is written: no host sync here), and the
        seconds the host waited for the loader's batches."""
        config = self.config
        parts, tokens = {}, torch.zeros((), dtype=torch.int64, device=self.env.device)
        flops, data_wait = None, 0.0
        for micro in range(config.grad_accum):
            asked = time.perf_counter()
            batch = _to(next(batches), self.env.device)
            data_wait += time.perf_counter() - asked
            tokens = tokens + batch["attention_mask"].sum()
            if self.setup.flops is not None:
                micro_flops = self.setup.flops(batch)
                flops = micro_flops if flops is None else flops + micro_flops
            with no_sync(self.model, self.objective, config, self.env, micro == config.grad_accum - 1):
                with self._autocast():
                    output = self.model(batch)
                (output["loss"] / config.grad_accum).backward()
            for key, value in output.items():
                share = value.detach().double() / config.grad_accum
                parts[key] = parts[key] + share if key in parts else share
        # Clipped here, or by optimizer.step() itself (fused AdamW: spanlm.train.optim.clip_gradients)
        parts["grad_norm"] = (
            clip_gradients(self.optimizer, self.objective.parameters(), config.max_grad_norm, self.gradient_norm)
            .detach()
            .double()
        )
        return parts, tokens, flops, data_wait

    def _nonfinite(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """A bool scalar on the device: a part or the gradient norm is not finite here or on another rank."""
        bad = ~torch.isfinite(torch.stack(list(parts.values()))).all()
        return all_reduce(bad.double()[None], self.env, op="max")[0] > 0 if self.env.enabled else bad

    def _skips_on_device(self) -> bool:
        return isinstance(self.optimizer, torch.optim.AdamW) and bool(self.optimizer.defaults.get("fused"))

    def _check_finite(self, window: "MetricsWindow") -> None:
        """Under nonfinite=stop, halt (naming the step) before anything reads or keeps weights of a bad window."""
        if self.config.nonfinite == "stop" and bool(window.halted):
            step, values = window.first_bad_step()
            raise TrainingHalted(_nonfinite_message(step, values) + _STOPPED)

    def _log_record(self, window: "MetricsWindow", started: float, skipped: int) -> dict:
        """Means over the steps since the last record (skipped steps excluded), reduced over ranks."""
        env = self.env
        self._check_finite(window)
        keys = window.keys
        counts = torch.stack([window.tokens.double(), window.flops, window.flops.new_tensor(window.data_wait)])
        means = all_reduce(torch.cat([window.sums / window.counted.clamp(min=1), counts]), env)
        if window.keys and bool(window.skipped):  # nonfinite=skip: say which step went bad first
            step, values = window.first_bad_step()
            more = int(window.skipped) - 1
            self.log(
                _nonfinite_message(step, values)
                + "; step skipped"
                + (f" ({more} more skipped by step {self.step})" if more else "")
            )
        values = means.tolist()
        tokens, flops, data_wait = values[-3:]
        seconds = max(time.perf_counter() - started, 1e-9)
        record = {"kind": "train", "step": self.step, **self.setup.record_fields, **self._clock()}
        record.update(zip(keys, values[:-3]))
        rates = self.scheduler.get_last_lr()
        record["lr"] = rates[0]  # the first parameter group's (fine-tuning: the encoder's, or a frozen one's head's)
        for name, group in self.rate_groups.items():  # fine-tuning: both, named (0.0: a frozen encoder)
            record[name] = rates[group] if group is not None else 0.0
        record["tokens_per_s"] = tokens * env.world_size / seconds
        if self.peak_flops is not None:  # the mean rank's FLOPs per second over its device's peak
            if flops / seconds > self.peak_flops and self.config.peak_tflops is None and not self.peak_measured_again:
                self._measure_peak_again(flops / seconds)
            record["mfu"] = flops / seconds / self.peak_flops
        record["data_wait"] = data_wait / seconds  # the mean rank's share of the window spent waiting for batches
        if self.config.compile:
            record["recompiles"] = speed.compiled_frames() - self.frames_after_first_step
        if self.first_step_seconds is not None:  # the first record of a compiled run: what compiling cost
            record["first_step_s"], self.first_step_seconds = self.first_step_seconds, None
        record["skipped_steps"] = skipped + int(window.skipped)
        return record

    def _set_peak(self) -> None:
        if self.config.peak_tflops is not None:
            self.peak_flops, how = self.config.peak_tflops * 1e12, "train.peak_tflops"
        else:
            self.peak_flops = speed.measure_peak_flops(self.env.device, self.peak_dtype)
            how = f"measured: the best {str(self.peak_dtype).removeprefix('torch.')} matmul"
        self.log(f"mfu: the model's FLOPs per second over a peak of {self.peak_flops / 1e12:.3g} TFLOP/s ({how})")

    def _measure_peak_again(self, reached: float) -> None:
        """The model computed faster than the peak measured at the start, which another process sharing the device
        held down then: measure it again now, while this run shows the device free, and keep the higher."""
        before, self.peak_measured_again = self.peak_flops, True
        self.peak_flops = max(before, speed.measure_peak_flops(self.env.device, self.peak_dtype))
        self.log(
            f"mfu: the model reached {reached / 1e12:.3g} TFLOP/s, over the {before / 1e12:.3g} measured at the start "
            f"(the device was busy then); measured again: a peak of {self.peak_flops / 1e12:.3g} TFLOP/s"
        )

    def _say_health(self, logger: MetricsLogger | None, lines: list[str]) -> None:
        """Each learning-health line in the log and, as a ``health`` record, in metrics.jsonl (spanlm report)."""
        for line in lines:
            self.log(line)
            if logger:
                logger.log(
                    {"kind": "health", "step": self.step, **self.setup.record_fields, **self._clock(), "message": line}
                )

    def _first_step_compiled(self, window: "MetricsWindow", started: float) -> None:
        """Under train.compile, after this process's first step: wait for it (one host read, once) and say how long
        it took, tracing and compiling included; count the frames compiled so far (``recompiles`` counts later
        ones)."""
        int(window.tokens)  # waits for the step's work on the device
        self.first_step_seconds = round(time.perf_counter() - started, 3)
        self.frames_after_first_step = speed.compiled_frames()
        self.log(f"train.compile: the first step took {self.first_step_seconds:.1f} s (tracing and compiling)")

    def elapsed(self) -> float:
        """Seconds of training so far: this process's since run() began, plus those of the checkpoint it resumed."""
        return self.elapsed_before + time.monotonic() - self.started

    def _clock(self) -> dict:
        """A record's wall-clock time (ISO 8601, UTC) and ``elapsed`` seconds."""
        return {
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "elapsed": round(self.elapsed(), 3),
        }


_STOPPED = "; stopped without updating the weights (nonfinite=skip skips such steps)"


def _nonfinite_message(step: int, parts: dict[str, float | torch.Tensor]) -> str:
    values = ", ".join(f"{k}={float(v):.4g}" for k, v in sorted(parts.items()))
    return f"non-finite loss or gradient norm at step {step} ({values})"


def _to(batch: dict[str, torch.Tensor | int], device: torch.device) -> dict[str, torch.Tensor | int]:
    # A packed batch's longest segment (max_seq_len) is an int the attention takes on the host: kept as it is.
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
