"""Typed configuration of the training engine."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal


@dataclasses.dataclass
class TrainConfig:
    """Optimisation, evaluation, checkpointing and distribution of one run."""

    output_dir: str = "runs/pretrain"
    max_steps: int = 200  # optimiser steps
    batch_size: int = 16  # blocks per process per micro-batch
    grad_accum: int = 1  # micro-batches per optimiser step
    optimizer: Literal["adamw", "lamb"] = "adamw"  # LAMB for large batches, as MacBERT used
    lr: float = 5e-4
    # Fine-tuning (NER, QA): the peak rate of the pretrained encoder's parameters, the task head keeping
    # ``lr``; a new head learns fast while the encoder's weights are only adjusted. None: ``lr`` for all.
    encoder_lr: float | None = None
    # Fine-tuning: layer-wise learning-rate decay (ELECTRA, Clark et al. 2020, appendix A; DeBERTa-V3): the encoder's
    # layer i of L at its rate · layer_decay^(L + 1 − i), its embeddings at · layer_decay^(L + 2), the task head at
    # ``lr``: the lower layers, which hold what pretraining taught, move least. 1.0: every layer at one rate.
    layer_decay: float = 1.0
    # Fine-tuning: the first probe_steps train the task head alone (the encoder's rate held at 0), then the encoder
    # joins with its own warmup and decay over the steps left: linear probing, then fine-tuning (LP-FT; Kumar et
    # al. 2022, "Fine-Tuning can Distort Pretrained Features"): a random head's first gradients no longer reshape
    # the pretrained features before the head has learnt to read them. 0: the whole model trains from the start.
    probe_steps: int = 0
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-6
    weight_decay: float = 0.01  # not applied to biases and LayerNorm weights
    warmup_steps: int = 20
    schedule: Literal["linear", "cosine", "constant", "wsd"] = "linear"  # decay after warmup
    # wsd (warmup-stable-decay; Hu et al. 2024, MiniCPM; Hägele et al. 2024): the peak rate until the last
    # ``decay_share`` of max_steps, then down to 0 in that ``decay_shape`` (1-sqrt: Hägele et al.'s cooldown).
    decay_share: float = 0.1
    # The steps the schedule spans when they are more than this run trains: a phased run's whole length, each
    # phase training to its own max_steps on one schedule (spanlm.pretrain.phases). None: max_steps.
    schedule_steps: int | None = None
    # The run's step this run's first batch trains: a phase's start in its run (spanlm.pretrain.phases), so that a
    # masking-rate schedule, which counts the run's steps, goes on across phases where each has its own batches.
    first_step: int = 0
    decay_shape: Literal["linear", "cosine", "1-sqrt"] = "1-sqrt"
    max_grad_norm: float = 1.0  # 0 disables clipping
    # bf16 = autocast (weights and optimiser stay fp32); auto = bf16 where the device computes it natively (a
    # CUDA GPU that supports it), fp32 elsewhere (the CPU). The run's config.yaml records what auto became.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    compile: bool = False  # torch.compile the objective's forward
    # The device's peak in TFLOP/s that the logged ``mfu`` divides by; None: measured at the start (the best of a
    # few matrix products in the run's dtype: bf16 under autocast).
    peak_tflops: float | None = None
    # Recompute each transformer layer's activations in the backward pass instead of keeping them: less
    # memory for longer blocks or larger batches, one more forward pass of compute.
    activation_checkpointing: bool = False
    eval_every: int = 50  # steps; 0 disables periodic evaluation
    eval_at_start: bool = False  # also evaluate the initial weights (a step-0 point) when a run starts afresh
    eval_blocks: int = 64  # held-out blocks (never trained on)
    save_every: int = 100  # steps; a final checkpoint is always written
    keep_last: int = 2  # complete checkpoints kept
    log_every: int = 10
    num_workers: int = 1  # DataLoader worker processes running the masker
    distributed: Literal["ddp", "fsdp"] = "ddp"  # FSDP2 (fully_shard) for models that do not fit
    nonfinite: Literal["stop", "skip"] = "stop"  # non-finite loss / grad norm: halt, or skip the step
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # The device's speed backend (spanlm.accel): "auto" = spanlm's CPU path on CPU (compiled kernels, fused
    # attention and cross-entropy, host-memory tuning), nothing on other devices; "off" = the model as built.
    accel: Literal["auto", "off"] = "auto"

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "grad_accum", "keep_last", "log_every", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.schedule_steps is not None and self.schedule_steps < self.max_steps:
            raise ValueError(f"schedule_steps {self.schedule_steps} is less than max_steps {self.max_steps}")
        for name in ("eval_every", "eval_blocks", "num_workers", "warmup_steps", "max_grad_norm", "probe_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr}")
        if self.encoder_lr is not None and not (math.isfinite(self.encoder_lr) and self.encoder_lr > 0):
            raise ValueError(f"encoder_lr must be a positive finite number or null, got {self.encoder_lr}")
        if self.probe_steps >= self.max_steps:
            raise ValueError(f"probe_steps {self.probe_steps} leaves none of max_steps {self.max_steps} to fine-tune")
        if not 0 < self.layer_decay <= 1:
            raise ValueError(f"layer_decay must be in (0, 1], got {self.layer_decay}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"eps must be a positive finite number, got {self.eps}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must not be negative, got {self.weight_decay}")
        if not 0 < self.decay_share <= 1:
            raise ValueError(f"decay_share must be in (0, 1], got {self.decay_share}")
        if self.peak_tflops is not None and not (math.isfinite(self.peak_tflops) and self.peak_tflops > 0):
            raise ValueError(f"peak_tflops must be a positive finite number or null, got {self.peak_tflops}")
        if not math.isfinite(self.max_grad_norm):
            raise ValueError(f"max_grad_norm must be finite, got {self.max_grad_norm}")
        if len(self.betas) != 2:
            raise ValueError("betas must be two numbers")
        if not all(0 <= beta < 1 for beta in self.betas):
            raise ValueError(f"betas must be in [0, 1), got {self.betas}")

    @staticmethod
    def from_older(data: dict) -> dict:
        """The section as runs saved it before ``accel``: ``retain_freed_memory`` is part of ``accel: auto`` now."""
        return {key: value for key, value in data.items() if key != "retain_freed_memory"}


Tracker = Literal["tensorboard", "wandb", "mlflow"]


@dataclasses.dataclass
class LoggingConfig:
    """Where rank 0 reports the run: metrics.jsonl always, plus the experiment trackers of ``report_to``."""

    # None: TensorBoard when it is installed, else metrics.jsonl only. A list names the trackers, each of
    # which must be installed (its extra: pip install 'spanlm[wandb]'); [] is metrics.jsonl only.
    report_to: list[Tracker] | None = None
    project: str | None = (
        None  # W&B project / MLflow experiment; None: $WANDB_PROJECT / $MLFLOW_EXPERIMENT_NAME, else "spanlm"
    )
    run_name: str | None = None  # None: the name of train.output_dir
    progress: bool = True  # a progress bar on rank 0

    def __post_init__(self) -> None:
        repeated = sorted({name for name in self.report_to or [] if self.report_to.count(name) > 1})
        if repeated:
            raise ValueError(f"report_to names {repeated[0]} twice")

    @staticmethod
    def from_older(data: dict) -> dict:
        """The section as recipes saved before ``report_to`` wrote it (runs, exports, NER / QA models): ``tensorboard:
        true`` was the default, ``false`` meant metrics.jsonl only."""
        if "tensorboard" not in data:
            return data
        data = dict(data)
        if data.pop("tensorboard") is False and "report_to" not in data:
            data["report_to"] = []
        return data
