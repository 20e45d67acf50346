"""Saves and rotates checkpoints of a tiny model forever, continuing its run directory: the process
the kill tests (tests/train/test_kill.py) SIGKILL at random points. Every file of step N is a pure
function of N (``expected``).

Run as a script it serves those processes: for each line ``RUN_DIR`` on stdin it forks one (which
prints ``ready PID`` once started and saves until killed), waits for it to die, and prints ``reaped``.
Why fork from here: torch is imported once, so a trial costs its saves, not an interpreter start; and
this process runs no threads, so a fork inherits no held lock (a pytest process may)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from spanlm.train import checkpoint as ckpt


def expected(step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    return {"weight": torch.randn(512, 512, generator=generator), "bias": torch.randn(512, generator=generator)}


def files(step: int) -> dict:
    return {
        "model.safetensors": lambda p: save_file(expected(step), str(p)),
        "optimizer.pt": lambda p: torch.save({"state": {k: v * 2 for k, v in expected(step).items()}}, p),
        "trainer_state.pt": lambda p: torch.save({"step": step}, p),
        "config.yaml": lambda p: p.write_text(f"step: {step}\n"),
    }


def save_forever(run: Path) -> None:
    ckpt.remove_leftovers(run)  # as the trainer does at start-up
    latest = ckpt.latest_checkpoint(run)
    step = ckpt.step_of(latest) if latest is not None else 0
    print(f"ready {os.getpid()}", flush=True)
    while True:
        step += 1
        ckpt.write_checkpoint(run, step, files(step), keep_last=2)


def serve() -> None:
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            try:
                save_forever(Path(line.strip()))
            finally:
                os._exit(1)
        os.waitpid(pid, 0)
        print("reaped", flush=True)


if __name__ == "__main__":
    serve()
