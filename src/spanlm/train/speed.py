"""How fast a run computes and says so: the precision it computes in, the matmul peak its MFU divides by, compiles.

MFU (model FLOPs utilisation; Chowdhery et al. 2022, PaLM, appendix B) is the model's FLOPs per second — counted
from its dimensions and the real tokens by the task (``TrainingSetup.flops``), never from what the kernels happened
to compute — over what the device can do. That peak is measured, not read from a datasheet: the best of a few
square matrix products in the dtype the run computes in (bf16 under autocast), once at the start (and once
more if the model outruns it: the device was shared then), or given by
``train.peak_tflops`` (a cluster's agreed figure, or a datasheet's, to compare runs across machines).
"""

from __future__ import annotations

import time

import torch

PRECISION_WORDS = {"bf16": "bf16 autocast (fp32 weights and optimiser)", "fp32": "fp32"}


def resolve_precision(precision: str, device: torch.device) -> str:
    """``train.precision`` on ``device``: ``auto`` is bf16 autocast on a CUDA GPU that computes bf16 natively
    (Ampere and later), where it runs the matmuls on the tensor cores at several times the fp32 rate, and fp32
    elsewhere (the CPU's bf16 is emulated on most hosts and changes the numerics of the tests' references)."""
    if precision != "auto":
        return precision
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return "bf16"
    return "fp32"


# The side of the measured products: large enough to reach the tensor cores' rate on a GPU, small enough on the CPU
# to cost a fraction of a second at every start.
PEAK_SIZE = {"cuda": 8192}
DEFAULT_PEAK_SIZE = 512


def measure_peak_flops(device: torch.device, dtype: torch.dtype, repeats: int = 10) -> float:
    """The best FLOP/s of ``repeats`` products of two ``n × n`` ``dtype`` matrices on ``device`` (after a warm-up)."""
    size = PEAK_SIZE.get(device.type, DEFAULT_PEAK_SIZE)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    best = float("inf")
    for index in range(repeats + 1):
        _synchronize(device)
        started = time.perf_counter()
        torch.mm(a, b)
        _synchronize(device)
        if index:  # the first is the warm-up (the library picks its kernel)
            best = min(best, time.perf_counter() - started)
    return 2.0 * size**3 / best


def compiled_frames() -> int:
    """The frames torch.compile has compiled in this process so far (dynamo's count): a run that compiles once
    has the same count at every step after its first."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
