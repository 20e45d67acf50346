"""Saves and rotates checkpoints of a tiny model forever, continuing its run directory: the process
the kill tests SIGKILL at random points. Every file of step N is a pure function of N (``expected``)."""

from __future__ import annotations

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


def main(run: Path) -> None:
    ckpt.remove_leftovers(run)  # as the trainer does at start-up
    latest = ckpt.latest_checkpoint(run)
    step = ckpt.step_of(latest) if latest is not None else 0
    print("ready", flush=True)
    while True:
        step += 1
        ckpt.write_checkpoint(run, step, files(step), keep_last=2)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
