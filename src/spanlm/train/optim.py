"""Optimiser and learning-rate schedule.

Weight decay is not applied to biases and LayerNorm weights (BERT, SpanBERT, ELECTRA all exclude
them). LAMB (You et al. 2020) is provided for the large-batch setting MacBERT used.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable

import torch
from torch import nn

from spanlm.errors import ConfigError
from spanlm.train.config import TrainConfig


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into decayed (matrices) and not decayed (biases, norms, 1-d)."""
    no_decay_ids = set()
    for module in model.modules():
        if isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d)) or "LayerNorm" in type(module).__name__:
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
    decay, no_decay, seen = [], [], set()
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad or id(parameter) in seen:  # tied weights appear once
            continue
        seen.add(id(parameter))
        if parameter.ndim < 2 or id(parameter) in no_decay_ids or name.endswith(".bias"):
            no_decay.append(parameter)
        else:
            decay.append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def encoder_groups(model: nn.Module, groups: list[dict], encoder_lr: float) -> list[dict]:
    """``groups`` each split in two: the parameters of ``model.encoder`` at ``encoder_lr`` (marked ``encoder``: the
    schedule holds them back during ``probe_steps``), the rest (the task head) at the optimiser's ``lr``. The
    schedule scales each group's own peak rate."""
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, nn.Module):
        raise ConfigError(
            f"train.encoder_lr, train.layer_decay and train.probe_steps apply to fine-tuning an encoder (NER, QA, "
            f"cls); {type(model).__name__} has none"
        )
    in_encoder = {id(p) for p in encoder.parameters()}
    split = []
    for group in groups:
        encoder_params = [p for p in group["params"] if id(p) in in_encoder]
        split.append({**group, "params": encoder_params, "lr": encoder_lr, "encoder": True})
        split.append({**group, "params": [p for p in group["params"] if id(p) not in in_encoder]})
    return [group for group in split if group["params"]]


# A transformer layer's index in its parameter's name (BERT's encoder.layer.3., ModernBERT's layers.3.)
_LAYER = re.compile(r"(?:^|\.)(?:layer|layers)\.(\d+)\.")


def layer_depth(name: str, layers: int) -> int:
    """The depth of an encoder parameter as ELECTRA's layer-wise decay counts it: the embeddings 0, layer i
    (from 0) i + 1, anything above the layers (a pooler, a final norm) layers + 1."""
    if (match := _LAYER.search(name)) is not None:
        return int(match.group(1)) + 1
    return 0 if "embed" in name else layers + 1


def layer_decay_groups(model: nn.Module, groups: list[dict], decay: float) -> list[dict]:
    """``groups`` (encoder and head split, encoder_groups) with each encoder group split by depth, its rate times
    ``decay^(layers + 2 − depth)``; the head's groups unchanged."""
    names = {id(p): name for name, p in model.encoder.named_parameters()}
    layers = 1 + max((int(m.group(1)) for n in names.values() if (m := _LAYER.search(n))), default=-1)
    split = []
    for group in groups:
        if not all(id(p) in names for p in group["params"]):
            split.append(group)  # the task head's
            continue
        depths: dict[int, list] = {}
        for parameter in group["params"]:
            depths.setdefault(layer_depth(names[id(parameter)], layers), []).append(parameter)
        for depth, parameters in sorted(depths.items()):
            split.append({**group, "params": parameters, "lr": group["lr"] * decay ** (layers + 2 - depth)})
    return split


def encoder_and_head_groups(objective: torch.nn.Module, optimizer) -> dict[str, int | None]:
    """For a fine-tuning objective (one with an ``encoder``): the index of the first optimiser group holding
    encoder parameters (``lr_encoder``) and of the first holding others, the head's (``lr_head``); None where
    no group does (a frozen encoder). Empty for pretraining objectives."""
    encoder = getattr(objective, "encoder", None)
    if not isinstance(encoder, torch.nn.Module):
        return {}
    in_encoder = {id(p) for p in encoder.parameters()}
    groups: dict[str, int | None] = {"lr_encoder": None, "lr_head": None}
    for index, group in enumerate(optimizer.param_groups):
        found = {id(p) in in_encoder for p in group["params"]}
        for name, wanted in (("lr_encoder", True), ("lr_head", False)):
            if wanted in found and groups[name] is None:
                groups[name] = index
    return groups


class Lamb(torch.optim.Optimizer):
    """LAMB: Adam's update rescaled per parameter tensor by the trust ratio ‖w‖ / ‖update‖."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                step = state["step"]  # a tensor: the bias corrections below stay on the device (no host read)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                correction1, correction2 = 1 - beta1**step, 1 - beta2**step
                update = (exp_avg / correction1) / ((exp_avg_sq / correction2).sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                weight_norm, update_norm = p.norm(), update.norm()
                trust = torch.where(
                    (weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, torch.ones_like(weight_norm)
                )
                p.add_(update * trust, alpha=-group["lr"])
        return loss


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    groups = parameter_groups(model, config.weight_decay)
    if config.encoder_lr is not None or config.layer_decay < 1 or config.probe_steps:
        groups = encoder_groups(model, groups, config.encoder_lr or config.lr)
    if config.layer_decay < 1:
        groups = layer_decay_groups(model, groups, config.layer_decay)
    if config.optimizer == "lamb":
        return Lamb(groups, lr=config.lr, betas=config.betas, eps=config.eps)
    # The fused kernel (one pass over each parameter, CPU and CUDA) is what Hugging Face's Trainer uses
    # by default; FSDP2's sharded DTensor parameters keep the multi-tensor (foreach) implementation.
    fused = config.distributed != "fsdp"
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps, fused=fused)


# Gradients at least this large get their norm as the norm of their rows' norms (see total_norm).
_ROW_WISE_NUMEL = 1 << 20


def total_norm(gradients: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all ``gradients`` together, as ``torch.nn.utils.get_total_norm`` defines it.

    Why not ``get_total_norm`` itself for large matrices: ATen's float32 norm kernel adds its squares
    into float32 partial sums serially (``torch.sum`` sums in a cascade; the norm does not), so on a
    (V, E) embedding gradient of millions of elements its rounding error grows with the length of that
    sum. The norm of the rows' norms is the same quantity with short sums only, so it stays near a
    float64 reference (tests/train/test_optim.py) and is faster (a short reduction per row, then one
    over V values).
    Smaller gradients and FSDP2's sharded DTensors keep ``get_total_norm``. (On CPU, spanlm.accel's
    backend takes one kernel call instead: :func:`spanlm.accel.gradient_norm`.)
    """
    large, rest = [], []
    for g in gradients:
        (large if g.dim() >= 2 and g.numel() >= _ROW_WISE_NUMEL and type(g) is torch.Tensor else rest).append(g)
    if not large:
        return torch.nn.utils.get_total_norm(gradients)
    norms = [torch.linalg.vector_norm(torch.linalg.vector_norm(g, dim=-1)) for g in large]
    if rest:
        norms.append(torch.nn.utils.get_total_norm(rest))
    return torch.linalg.vector_norm(torch.stack(norms))


def clip_gradients(
    optimizer: torch.optim.Optimizer,
    parameters,
    max_norm: float,
    norm: Callable[[list[torch.Tensor]], torch.Tensor] = total_norm,
) -> torch.Tensor:
    """The total gradient norm; the gradients are scaled to ``max_norm`` when above it (``max_norm`` ≤ 0
    or inf: no clipping), as ``torch.nn.utils.clip_grad_norm_`` scales them.

    Why not ``clip_grad_norm_``: it multiplies every gradient by the clip factor, one more pass over all
    of them (even by 1.0 when nothing is clipped). Fused AdamW can take that factor inside its own single
    pass: its ``grad_scale`` (the hook ``torch.amp.GradScaler`` uses) divides each gradient by it and
    writes the result back, so after ``optimizer.step()`` the gradients and the update are those of
    clipping first. Any other optimiser (LAMB, the foreach AdamW under FSDP) gets the clipped gradients
    before its step.
    """
    parameters = [p for p in parameters if p.grad is not None]
    total = norm([p.grad for p in parameters])
    optimizer.grad_scale = None
    if 0 < max_norm < math.inf:
        if isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults.get("fused"):
            # clip_grad_norm_'s factor max_norm / (norm + 1e-6), clamped at 1, as a divisor
            optimizer.grad_scale = torch.clamp((total.float() + 1e-6) / max_norm, min=1.0)
        else:
            torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total.full_tensor() if hasattr(total, "full_tensor") else total


def schedule_length(config: TrainConfig) -> int:
    """The steps the schedule spans: ``schedule_steps`` (a phased run's whole length) or ``max_steps``."""
    return config.schedule_steps or config.max_steps


def decay_steps(config: TrainConfig) -> int:
    """The steps of a wsd schedule's decay: the last ``decay_share`` of the schedule, at least one."""
    return max(1, round(config.decay_share * schedule_length(config)))


def lr_factor(step: int, config: TrainConfig) -> float:
    """Linear warmup to the peak, then linear or cosine decay to 0 at max_steps (or constant); wsd: the peak
    until the last ``decay_steps``, then down to 0 in ``decay_shape``."""
    if config.warmup_steps and step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    if config.schedule == "wsd":
        decay = decay_steps(config)
        progress = min(max((step - (schedule_length(config) - decay)) / decay, 0.0), 1.0)
        if config.decay_shape == "linear":
            return 1.0 - progress
        if config.decay_shape == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - math.sqrt(progress)
    progress = (step - config.warmup_steps) / max(1, schedule_length(config) - config.warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    return 1.0 - progress if config.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


def encoder_factor(step: int, probe_steps: int, rest: TrainConfig) -> float:
    """An encoder group's rate factor: 0 for the first ``probe_steps`` (the head trains alone), then ``rest``'s
    schedule (a run ``probe_steps`` shorter, :func:`after_probe`), its warmup starting when the encoder joins."""
    return 0.0 if step < probe_steps else lr_factor(step - probe_steps, rest)


def after_probe(config: TrainConfig) -> TrainConfig:
    """The schedule of the encoder once it joins: the run less its ``probe_steps``."""
    return dataclasses.replace(
        config,
        max_steps=config.max_steps - config.probe_steps,
        schedule_steps=config.schedule_steps and config.schedule_steps - config.probe_steps,
        probe_steps=0,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Each group's rate follows :func:`lr_factor`; under ``probe_steps`` the encoder's, :func:`encoder_factor`."""
    head = functools.partial(lr_factor, config=config)
    if not config.probe_steps:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, head)
    encoder = functools.partial(encoder_factor, probe_steps=config.probe_steps, rest=after_probe(config))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, [encoder if group.get("encoder") else head for group in optimizer.param_groups]
    )
