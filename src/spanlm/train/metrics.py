"""Run logging: metrics.jsonl always (one JSON object per line), TensorBoard when installed."""

from __future__ import annotations

import json
import math
from pathlib import Path

from spanlm.errors import InputError


class MetricsLogger:
    """Appends records to ``metrics.jsonl``; on resume, drops records past the resumed step first."""

    def __init__(self, output_dir: Path, resumed_step: int | None, tensorboard: bool):
        self.path = output_dir / "metrics.jsonl"
        if resumed_step is not None and self.path.exists():
            # Records written after the checkpoint we resume from belong to a run that is being redone.
            kept = [line for line, record in _lines_and_records(self.path) if record.get("step", 0) <= resumed_step]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        elif resumed_step is None and self.path.exists():
            self.path.unlink()
        self.handle = open(self.path, "a", encoding="utf-8")
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"), purge_step=resumed_step)
            except ImportError:  # tensorboard is an optional extra
                self.writer = None

    def log(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self.handle.write(json.dumps(clean) + "\n")
        self.handle.flush()
        if self.writer is not None:
            kind = record.get("kind", "train")
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "kind"):
                    self.writer.add_scalar(f"{kind}/{key}", value, record["step"])

    def close(self) -> None:
        self.handle.close()
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [record for _, record in _lines_and_records(path)]


def _lines_and_records(path: Path) -> list[tuple[str, dict]]:
    """(line, record) per line of ``path``. A last line that does not parse is dropped: a process
    killed mid-write (or a full disk) leaves a torn final record, which must not block resume or
    report. A broken line before the last is an :class:`InputError` naming it."""
    numbered = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1) if line.strip()]
    out = []
    for index, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if index == len(numbered) - 1:
                break
            raise InputError(f"{path}:{number}: not valid JSON ({error.msg}); remove or repair that line") from None
        out.append((line, record))
    return out
