"""Keep freed host memory inside the process, so a CPU training step does not page-fault its way through.

Why: glibc's malloc serves large requests (above a threshold that adapts up to 32 MB) with a fresh
``mmap`` and returns them to the kernel on ``free``, and it gives the top of its heap back once more than
128 KB there are free. A training step frees and re-allocates the same large tensors every time — the
tied embedding's (V, H) gradients, attention probabilities (B·heads·L² floats), the optimiser's
temporaries — so every step touches tens of MB of brand-new pages, and the first touch of each 4 KB page
is a page fault the kernel answers by zero-filling it. Keeping freed memory mapped removes nearly all of
those faults at long sequences, for a somewhat higher peak resident size (glibc's heap keeps some
fragmentation), which plateaus over steps of mixed lengths rather than growing.

:func:`retain_freed_memory` switches both behaviours off for the rest of the process (``mallopt``:
no mmap-served blocks, no heap trimming): freed memory stays mapped and is reused by the next
allocation of the step. The price is that resident memory stays at its peak (plus that fragmentation),
which a training process reaches in every step anyway; ``train.accel: off`` keeps glibc's defaults.
Other C libraries (macOS, musl) are left alone.
"""

from __future__ import annotations

import ctypes
import platform
import sys

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1  # mallopt takes a C int


def retain_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse (see the module docstring); True when it took effect."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the C library already loaded into this process
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _INT_MAX))
