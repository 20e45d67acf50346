"""One code path for 1 process, `torchrun --nproc_per_node N` and `torchrun --nnodes M`.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; without them this is a single process and no process
group is created. nccl on GPUs, gloo on CPUs.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def is_main_process() -> bool:
    """Rank 0 under torchrun, or the only process: the one that prints results and writes outputs."""
    return int(os.environ.get("RANK", "0")) == 0


@dataclasses.dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    # A gloo group for host-side flags (a stop signal, a setup failure): agreeing on them never touches a
    # GPU stream, so checking every step costs no device synchronisation. None on one process.
    host_group: object | None = None
    # The FSDP model's device mesh (one dimension: every rank), made when the model is sharded.
    mesh: DeviceMesh | None = None
    # What data.packing: auto becomes on this device: the speed backend's decision, set by the trainer before
    # the setup runs (spanlm.accel.packs_by_default); padded until then.
    packs_by_default: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def uses_cuda(device: str) -> bool:
    """Whether ``train.device`` (auto / cpu / cuda) puts the run on a GPU."""
    return torch.cuda.is_available() if device == "auto" else device == "cuda"


def init_distributed(device: str = "auto") -> DistEnv:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = uses_cuda(device)
    if use_cuda:
        torch.cuda.set_device(local_rank)
        target = torch.device("cuda", local_rank)
    else:
        target = torch.device("cpu")
    host_group = None
    if world_size > 1:
        if not dist.is_initialized():
            dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(minutes=30))
        host_group = dist.new_group(backend="gloo") if use_cuda else dist.group.WORLD
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=target, host_group=host_group)


def shutdown(env: DistEnv) -> None:
    """Destroy the process groups while the interpreter is whole, so that their threads are joined now.

    gloo's worker threads let go of a collective's tensors after the caller has moved on. A group that outlives
    the interpreter's finalisation can do so while the interpreter is torn down, and abort a process whose work
    is done. So nothing may hold a group by now: not the trainer's DDP or FSDP model (it may sit in reference
    cycles, hence the collection), nor the FSDP mesh (which DTensor's caches keep), nor the host group.
    """
    if env.enabled and dist.is_initialized():
        gc.collect()
        if env.mesh is not None:
            env.mesh._pg_registry.clear()  # DeviceMesh has no public way to let go of its groups
        env.host_group = env.mesh = None
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def all_reduce(values: torch.Tensor, env: DistEnv, op: str = "mean") -> torch.Tensor:
    """Reduce a tensor of metrics over ranks (mean, sum or max); a no-op on one process."""
    if not env.enabled:
        return values
    values = values.clone()
    dist.all_reduce(values, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return values / env.world_size if op == "mean" else values


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every rank when the host-side flag is set on any rank (a stop signal, a setup failure): a CPU
    collective over ``env.host_group``, which no GPU stream waits for."""
    if not env.enabled:
        return flag
    value = torch.tensor([float(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=env.host_group)
    return bool(value.item())
