"""spanlm's compiled CPU kernels, built on first use with PyTorch's C++ extension tooling; optional.

Why: eager PyTorch runs every element-wise step as its own pass over memory. Where a hot loop makes
several passes over a tensor far larger than the cache — the cross-entropy over a 30k vocabulary makes
seven over its (N, V) logits, tens of MB per SpanBERT step — one compiled pass per row
keeps each row in cache from its first step to its last. Dropout multiplies by its keep decisions as it
draws them, in one pass, and its backward pass draws them again from the same key instead of reading a
stored mask (``x · m`` is linear in x). The clipping norm sums all gradients' squares in one call. The
kernels (``kernels.cpp``) use ATen's own vector types (the same Sleef ``exp`` as ``torch.exp``) and
PyTorch's own OpenMP threads, so they neither change the arithmetic beyond float rounding (dropout's
decisions and results not at all) nor compete with PyTorch for the cores.

The extension is compiled once per machine and instruction set (cached by
``torch.utils.cpp_extension`` under ``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``)
for the CPU capability PyTorch itself dispatches to (AVX-512, AVX2 or portable code), with the flags
PyTorch builds its own kernels of that capability with, so a cached build runs on every CPU of that
capability. The build's name carries a hash of the source, those flags and the PyTorch installation it
compiles against, and it is compiled from a copy of the source inside its own build directory: every
checkout on a machine with the same source and environment shares one build (a file time or a
checkout's path would make each rebuild it), and a changed source, flag or PyTorch builds anew. Only
CPU tensors ever use the kernels: a run on another device neither builds nor loads them. Where it cannot
be built (no C++ compiler or OpenMP, an unwritable cache directory) spanlm warns once and runs the
PyTorch path, which gives the same results up to float rounding.
``SPANLM_NATIVE=0`` switches the kernels off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import socket
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType

from spanlm.processes import process_alive

SOURCE = Path(__file__).with_name("kernels.cpp")

# The flags ATen compiles its own kernels of each capability with (cmake/Codegen.cmake).
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}


def enabled() -> bool:
    return os.environ.get("SPANLM_NATIVE", "1") != "0"


@functools.cache
def kernels() -> ModuleType | None:
    """The compiled kernels, or None (switched off, or not buildable here: warns once with the reason)."""
    if not enabled():
        return None
    try:
        import torch
        from torch.utils import cpp_extension

        capability = torch.backends.cpu.get_cpu_capability()
        flags = ["-O3", "-fopenmp", *_CAPABILITY_FLAGS.get(capability, [])]
        name = build_name(SOURCE.read_bytes(), capability, flags, toolchain())
        build_directory = _build_directory(cpp_extension, name)
        with build_lock(build_directory):
            if not _built(build_directory, name):
                # What it does and where, not a duration: a compile's time depends on the machine and its load
                print(
                    f"spanlm: compiling the native CPU kernels for {capability} with the C++ compiler into "
                    f"{build_directory} (once per machine and torch build; later runs load them)",
                    file=sys.stderr,
                )
            started = time.perf_counter()
            with _ninja_on_path():
                module = cpp_extension.load(
                    name=name, sources=[str(_source_copy(build_directory))], verbose=False, extra_cflags=flags
                )
    except Exception as error:  # noqa: BLE001 — any build failure means: use the PyTorch path
        warnings.warn(
            f"spanlm: the native CPU kernels could not be built ({_reason(error)}); using the PyTorch "
            "path (same results up to float rounding, slower). SPANLM_NATIVE=0 skips the attempt.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    if (elapsed := time.perf_counter() - started) > 2.0:
        print(f"spanlm: built the native CPU kernels in {elapsed:.0f} s; cached for later runs", file=sys.stderr)
    return module


def _build_directory(cpp_extension: ModuleType, name: str) -> Path | None:
    """Where PyTorch's builder keeps ``name`` (a private helper of torch.utils.cpp_extension: None if it moved)."""
    try:
        return Path(cpp_extension._get_build_directory(name, verbose=False))
    except (AttributeError, OSError, RuntimeError):
        return None


def toolchain() -> str:
    """The PyTorch the kernels compile against (its version and where it is installed: its headers and
    libraries; one torch's build must not load in another) and the ninja that builds them: ninja keeps a log of
    the commands it ran, and another ninja version finds that log foreign and rebuilds everything, so two
    environments with different ninjas sharing one build directory would rebuild each other's kernels."""
    import torch

    return f"{torch.__version__} {Path(torch.__file__).parent} ninja {ninja_binary()}"


def ninja_binary() -> str | None:
    """The ninja PyTorch's builder runs: PATH's, else the ``ninja`` package's (see ``_ninja_on_path``)."""
    found = shutil.which("ninja")
    if found is None:
        with contextlib.suppress(ImportError):
            import ninja

            found = shutil.which("ninja", path=ninja.BIN_DIR)
    return found


def build_name(source: bytes, capability: str, flags: list[str], toolchain: str = "") -> str:
    """The extension's name (and so its build directory): the capability and a hash of the source, the flags
    and the toolchain."""
    digest = hashlib.sha256(source + b"\0" + " ".join(flags).encode() + b"\0" + toolchain.encode()).hexdigest()[:16]
    return "spanlm_native_" + re.sub(r"\W", "_", capability.lower()) + "_" + digest


def _source_copy(build_directory: Path | None) -> Path:
    """The source as the build compiles it: a copy in the (content-keyed) build directory, so that the build
    commands PyTorch writes (and ninja compares) name the same file from every checkout."""
    if build_directory is None:
        return SOURCE
    copy, source = build_directory / SOURCE.name, SOURCE.read_bytes()
    if not copy.is_file() or copy.read_bytes() != source:  # under the build lock: no other writer
        partial = copy.with_suffix(".partial")
        partial.write_bytes(source)
        partial.replace(copy)
    return copy


def _built(build_directory: Path | None, name: str) -> bool:
    """Whether a build of ``name`` is in ``build_directory`` (False when unsure); the name keys its content."""
    try:
        return (build_directory / f"{name}.so").is_file()
    except TypeError:
        return False


LOCK_NAME = "spanlm-build.lock"  # beside PyTorch's own "lock"; holds "PID HOST BOOT_ID" of the process building
_UNWRITTEN_LOCK_S = 10.0  # a lock file still empty after this long: its owner died between creating and writing it


@contextlib.contextmanager
def build_lock(build_directory: Path | None, poll_s: float = 0.2):
    """Hold spanlm's build lock of ``build_directory`` while PyTorch builds or loads the kernels there.

    Why: PyTorch's builder waits silently, without a time limit, for its own ``lock`` file, which says
    nothing about who holds it; a build killed outright leaves it behind for ever. spanlm's lock names
    its owner (pid, host, boot), so a waiting process says whom it waits for, and a lock is taken over
    only when its owner is certainly gone (this machine, and no such process since its last boot) —
    never from a live build, however long it takes. Under spanlm's lock, PyTorch's ``lock`` can only
    be a killed build's: it is removed.
    """
    if build_directory is None:
        yield
        return
    lock, announced = build_directory / LOCK_NAME, False
    while True:
        try:
            descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            owner = _lock_owner(lock)
            if owner == "gone":
                lock.unlink(missing_ok=True)
                print(f"spanlm: removed the build lock {lock} of a build killed while it ran", file=sys.stderr)
                continue
            if not announced and owner is not None:
                print(
                    f"spanlm: waiting for process {owner} to finish building the native CPU kernels (lock {lock})",
                    file=sys.stderr,
                )
                announced = True
            time.sleep(poll_s)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(f"{os.getpid()} {socket.gethostname()} {_boot_id()}\n")
    try:
        (build_directory / "lock").unlink(missing_ok=True)
        yield
    finally:
        lock.unlink(missing_ok=True)


def _lock_owner(lock: Path) -> str | None:
    """ "gone" when the lock's owner is certainly not running; else its description ("1234 on host"),
    or None while the lock file is still being written (or was removed meanwhile)."""
    try:
        text, age = lock.read_text(encoding="utf-8"), time.time() - lock.stat().st_mtime
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    fields = text.split()
    if len(fields) != 3 or not fields[0].isdigit():
        return "gone" if age > _UNWRITTEN_LOCK_S else None
    pid, host, boot = int(fields[0]), fields[1], fields[2]
    if host != socket.gethostname():
        return f"{pid} on {host}"  # cannot be checked from here: waited for
    if boot != _boot_id() or not process_alive(pid):
        return "gone"
    return str(pid)


def _boot_id() -> str:
    """This boot of the machine (Linux); a pid recorded before a reboot names no process of this one."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


@contextlib.contextmanager
def _ninja_on_path():
    """PyTorch's extension builder runs ``ninja`` from PATH; the ``ninja`` package's binary is not there
    when a virtual environment's Python runs without the environment activated."""
    original = os.environ.get("PATH")
    if shutil.which("ninja") is None:
        with contextlib.suppress(ImportError):
            import ninja

            os.environ["PATH"] = os.pathsep.join(filter(None, [ninja.BIN_DIR, original]))
    try:
        yield
    finally:
        if original is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = original


def _reason(error: Exception) -> str:
    """The line of a build failure that says what went wrong (a compiler's first error), else its last line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and not line.startswith("Error building extension")]
    return f"{type(error).__name__}: {errors[0] if errors else (lines[-1] if lines else '')}"
