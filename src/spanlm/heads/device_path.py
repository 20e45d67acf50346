"""Which path the heads' training-time code takes: the CPU speed path, or the device-agnostic one.

The CPU path (:func:`spanlm.heads.losses.decoded_cross_entropies`' row-block loop, the tied embedding's
gradient hand-over) is tuned for a CPU's caches and pays for it with Python control flow and host
reads of tensor values, which a GPU would wait on at every one and ``torch.compile`` cannot trace.
Every other device, and any code being compiled, takes the device-agnostic path instead: plain
tensor operations, the same values to float tolerance, no host synchronisation and no graph break.

:func:`force_device_agnostic` selects that path on the CPU too, so tests (and a user comparing the two)
can run it on a machine without an accelerator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_forced = False


def device_agnostic(device: torch.device) -> bool:
    """Whether code running on ``device`` takes the device-agnostic path."""
    return _forced or device.type != "cpu" or torch.compiler.is_compiling()


@contextlib.contextmanager
def force_device_agnostic(enabled: bool = True) -> Iterator[None]:
    """Within the block, the CPU takes the device-agnostic path too (``enabled=False``: the usual choice)."""
    global _forced
    previous, _forced = _forced, enabled
    try:
        yield
    finally:
        _forced = previous
