"""Parallelisation of the objective the loop trains: activation checkpointing, torch.compile, and DDP or FSDP2
across the processes torchrun started. The loop calls :func:`wrap` once and :func:`no_sync` per micro-batch."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch

from spanlm.errors import ConfigError
from spanlm.train.dist import DistEnv
from spanlm.train.objective import Objective


def wrap(objective: Objective, config, env: DistEnv) -> torch.nn.Module:
    """``objective`` (changed in place) as the module the loop calls: its layers checkpointed and its forward
    compiled when ``config`` (TrainConfig) says so, in DDP or sharded by FSDP2 under torchrun."""
    if config.activation_checkpointing:
        checkpoint_layers(objective)
    if config.compile:
        objective.forward = compile_forward(objective.forward, env.device)
    if not env.enabled:
        return objective
    if config.distributed == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        policy = fsdp_precision(config.precision)
        env.mesh = mesh = init_device_mesh(env.device.type, (env.world_size,))
        for unit in objective.shard_units():
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        fully_shard(objective, mesh=mesh, mp_policy=policy)
        return objective
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [env.device.index] if env.device.type == "cuda" else None
    # Gradients live in DDP's all-reduce buckets (no copy in or out of them each step). static_graph:
    # the loop already needs every parameter used at every step (find_unused_parameters is off), so the
    # graph never changes; DDP then overlaps reductions from the second step on by the recorded order.
    # Not with micro-batches: DDP's reducer fails an internal assertion when its first backward pass
    # runs under no_sync with a static graph.
    return DistributedDataParallel(
        objective, device_ids=device_ids, gradient_as_bucket_view=True, static_graph=config.grad_accum == 1
    )


def no_sync(model: torch.nn.Module, objective: Objective, config, env: DistEnv, last_micro_batch: bool):
    """A context for one micro-batch's backward pass: gradients are reduced across processes on the last only."""
    if last_micro_batch or not env.enabled:
        return contextlib.nullcontext()
    if config.distributed == "fsdp":
        objective.set_requires_gradient_sync(False)
        return _RestoreGradientSync(objective)
    return model.no_sync()


def fsdp_precision(precision: str):
    """FSDP2's policy for ``train.precision``: under bf16, layers all-gather and compute in bf16 (half the
    traffic and memory of fp32) while gradients are reduced in fp32 and weights and optimiser stay fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def checkpoint_layers(objective: Objective) -> None:
    """Recompute each of ``objective.shard_units()`` (its transformer layers) in the backward pass.

    The layer's forward is wrapped in place (not the module: parameter and state-dict names stay the
    same); the non-reentrant checkpoint restores the RNG state, so the recomputed dropout is the
    original's and the gradients are those without checkpointing.
    """
    from torch.utils.checkpoint import checkpoint

    units = objective.shard_units()
    if not units:
        raise ConfigError(
            f"train.activation_checkpointing: objective {type(objective).__name__} names no layers to checkpoint"
        )
    for unit in units:
        unit.forward = functools.partial(checkpoint, unit.forward, use_reentrant=False)


def compile_forward(forward: Callable, device: torch.device) -> Callable:
    """``forward(batch)`` compiled once for every batch of the run.

    A batch's lengths change from step to step (the longest block of a padded batch, a packed stream's width, its
    number of segments and its longest one, the number of masked targets). Dynamo would compile the first batch's
    sizes as constants and compile again, with them symbolic, at the first batch that differs: every size and
    integer of the batch is symbolic from the first call instead (``dynamic=True``), but a matrix's rows, the
    recipe's batch size, which never changes. Two sizes equal at the first call are not assumed equal ever after
    (duck sizing off): the masked targets and the SBO pairs of a batch may count the same once, and differ next.
    """
    from torch.fx.experimental import _config as shapes

    compiled = shapes.patch(use_duck_shape=False)(torch.compile(forward, dynamic=True))
    if device.type != "cpu":
        compiled = compile_recurrent_layers(compiled)

    @functools.wraps(forward)
    def with_fixed_rows(batch):
        for value in batch.values():
            if isinstance(value, torch.Tensor) and value.dim() > 1:
                torch._dynamo.mark_static(value, 0)
        return compiled(batch)

    return with_fixed_rows


def compile_recurrent_layers(function: Callable) -> Callable:
    """``function`` traced with its recurrent layers (CharBERT's BiGRU) inside the graph, not around it.

    Dynamo leaves ``nn.GRU`` out of the graph by default (a graph break before and after each call);
    with ``allow_rnn`` it traces the layer as one recurrent operator, which is cuDNN's on a GPU. Not on
    the CPU, where that operator decomposes into one step per character and compiling it takes minutes.
    """
    return torch._dynamo.config.patch(allow_rnn=True)(function)


class _RestoreGradientSync:
    def __init__(self, module):
        self.module = module

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.module.set_requires_gradient_sync(True)
