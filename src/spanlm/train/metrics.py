"""Run logging on rank 0: metrics.jsonl always (one JSON object per line), plus the experiment trackers
that ``logging.report_to`` names — TensorBoard, Weights & Biases, MLflow — each an optional extra.

metrics.jsonl is the run's own record: each record is written there first, and a tracker that fails
mid-run is switched off with one line, so the file never misses a record because of a tracker. Every
tracker also gets the resolved recipe once per start (TensorBoard: hparams of its leaves and the YAML
as text; W&B: the run config; MLflow: params named ``section.key``). The ids of the W&B and MLflow runs
are kept in ``trackers.json`` beside metrics.jsonl, so that ``--resume`` continues the same runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from spanlm.config import to_dict
from spanlm.errors import ConfigError, InputError, SpanlmError
from spanlm.files import out_of_space, read_metadata
from spanlm.train.config import LoggingConfig

IDS_FILE = "trackers.json"
# Record fields that are not metrics: trackers keep their own clocks and steps.
NOT_METRICS = ("kind", "step", "time", "elapsed")


def trackers_to_start(config: LoggingConfig) -> list[str]:
    """The trackers ``config`` asks for, each checked to be installed; by default TensorBoard when it is."""
    if config.report_to is None:
        return ["tensorboard"] if _installed("tensorboard") else []
    for name in config.report_to:
        if not _installed(name):  # each tracker's module and spanlm's extra share its name
            raise ConfigError(f"logging.report_to names {name}, which is not installed: pip install 'spanlm[{name}]'")
    return list(config.report_to)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@dataclasses.dataclass
class RunInfo:
    """What a tracker starts from."""

    output_dir: Path
    resumed_step: int | None  # None: a new run
    name: str
    project: str | None  # logging.project; None: the tracker's environment variable, else "spanlm"
    recipe: dict  # the resolved recipe, nested by section
    run_id: str | None  # the tracker's id of this run, when a resume continues it


class MetricsLogger:
    """Appends records to ``metrics.jsonl`` and hands their metrics to the trackers.

    On resume, records past the resumed step are dropped first; a new run starts the file afresh. A
    tracker that cannot start raises a :class:`SpanlmError` before metrics.jsonl is touched. Use as a
    context manager: leaving it closes every tracker (marking the run failed when an exception leaves).
    """

    def __init__(
        self,
        output_dir: Path,
        resumed_step: int | None,
        recipe,
        trackers: list[str],
        log: Callable[[str], None] = print,
    ):
        self.log_line = log
        self.path = output_dir / "metrics.jsonl"
        kept = None  # read (and checked) before any tracker starts
        if resumed_step is not None and self.path.exists():
            # Records written after the checkpoint we resume from belong to a run that is being redone.
            kept = [line for line, record in _lines_and_records(self.path) if record.get("step", 0) <= resumed_step]
        ids = _read_ids(output_dir) if resumed_step is not None else {}
        config: LoggingConfig = recipe.logging
        self.trackers = {}
        for name in trackers:
            run = RunInfo(
                output_dir,
                resumed_step,
                config.run_name or output_dir.resolve().name,
                config.project,
                to_dict(recipe),  # registered sections beside the others, as config.yaml writes them
                ids.get(name),
            )
            try:
                self.trackers[name] = TRACKERS[name](run, log)
            except Exception as error:  # a tracker's client raises many types (network, store, settings)
                self._close_trackers(failed=True)
                raise SpanlmError(f"logging.report_to: {name} could not start ({_one_line(error)})") from error
        try:
            ids.update({name: tracker.run_id for name, tracker in self.trackers.items() if tracker.run_id is not None})
            _write_ids(output_dir, ids)
            if kept is not None:
                self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            elif resumed_step is None and self.path.exists():
                self.path.unlink()
            self.handle = open(self.path, "a", encoding="utf-8")
        except BaseException:  # a full disk, say: the trackers' runs are ended, not left open
            self._close_trackers(failed=True)
            raise

    def log(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        try:
            self.handle.write(json.dumps(clean) + "\n")
            self.handle.flush()
        except OSError as error:
            if (reason := out_of_space(error)) is None:
                raise
            raise InputError(
                f"{self.path}: could not be written ({reason}); the records before step {record['step']} and the "
                "run's checkpoints are kept (a torn last line is dropped when the run resumes)"
            ) from None
        kind, step = record.get("kind", "train"), record["step"]
        metrics = {k: v for k, v in record.items() if k not in NOT_METRICS and isinstance(v, (int, float))}
        for name, tracker in list(self.trackers.items()):
            try:
                tracker.log(kind, step, metrics)
            except Exception as error:
                del self.trackers[name]
                self.log_line(
                    f"logging: {name} failed at step {step} ({_one_line(error)}); it is switched off for the "
                    "rest of this run, metrics.jsonl goes on"
                )
                _close_quietly(tracker)

    def close(self, failed: bool = False) -> None:
        self.handle.close()
        self._close_trackers(failed)

    def _close_trackers(self, failed: bool) -> None:
        for name, tracker in self.trackers.items():
            try:
                tracker.close(failed)  # flushes what the tracker still holds
            except Exception as error:
                self.log_line(f"logging: {name} did not close cleanly ({_one_line(error)})")
        self.trackers = {}

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.close(failed=exc_type is not None)


class TensorBoardTracker:
    """Scalars as ``kind/metric`` under ``output_dir/tensorboard``; the recipe as hparams and as text."""

    run_id = None

    def __init__(self, run: RunInfo, log):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # purge_step: events of a redone stretch (past the resumed checkpoint) are hidden.
        self.writer = SummaryWriter(log_dir=str(run.output_dir / "tensorboard"), purge_step=run.resumed_step)
        step = run.resumed_step or 0
        leaves = {
            key: value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
            for key, value in flat_recipe(run.recipe).items()
            if value is not None
        }
        # Into this writer's own event file: SummaryWriter.add_hparams would write a separate sub-run.
        # The metric names are the columns of TensorBoard's HParams table.
        for summary in hparams(leaves, {"train/loss": 0.0, "eval/loss": 0.0}):
            self.writer.file_writer.add_summary(summary, step)
        recipe_yaml = yaml.safe_dump(run.recipe, sort_keys=False, allow_unicode=True)
        self.writer.add_text(
            "recipe", "    " + recipe_yaml.rstrip("\n").replace("\n", "\n    "), step
        )  # indented: a code block

    def log(self, kind: str, step: int, metrics: dict) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(f"{kind}/{key}", value, step)

    def close(self, failed: bool) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run (online, or offline with ``WANDB_MODE=offline``); files under ``$WANDB_DIR``, else the output
    directory."""

    def __init__(self, run: RunInfo, log):
        import wandb

        self.run = wandb.init(
            project=run.project or os.environ.get("WANDB_PROJECT") or "spanlm",
            name=run.name,
            id=run.run_id,
            resume="allow" if run.run_id else None,
            dir=None if os.environ.get("WANDB_DIR") else str(run.output_dir),
            config=run.recipe,
            allow_val_change=True,
        )  # a resume may change the recipe (max_steps)
        # spanlm's step is the x-axis: W&B's own _step counts log calls, and restarts with an offline resume.
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        self.run_id = self.run.id

    def log(self, kind: str, step: int, metrics: dict) -> None:
        self.run.log({"step": step, **{f"{kind}/{key}": value for key, value in metrics.items()}})

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    """An MLflow run at ``$MLFLOW_TRACKING_URI`` (else MLflow's default, ``./mlflow.db``): metrics with their
    steps, the recipe as params. A resume continues the run; params keep their first values (MLflow
    refuses to change them), so a changed one is named in one line."""

    def __init__(self, run: RunInfo, log):
        from mlflow import MlflowClient
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        self.client = MlflowClient()
        name = run.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "spanlm"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id, earlier = None, {}
        if run.run_id is not None:
            try:
                found = self.client.get_run(run.run_id)
                self.client.update_run(run.run_id, status="RUNNING")  # refused for a deleted run
                self.run_id, earlier = run.run_id, found.data.params
            except MlflowException:  # not in this tracking store (another MLFLOW_TRACKING_URI), or deleted
                log(
                    f"mlflow: run {run.run_id} of {run.output_dir} is not in {self.client.tracking_uri}; starting a "
                    "new run"
                )
        if self.run_id is None:
            self.run_id = self.client.create_run(experiment_id, run_name=run.name).info.run_id
        params = {
            key: (value if isinstance(value, str) else json.dumps(value))[:MAX_PARAM_VAL_LENGTH]
            for key, value in flat_recipe(run.recipe).items()
        }
        changed = [key for key, value in params.items() if key in earlier and earlier[key] != value]
        if changed:
            log(
                f"mlflow: params keep their first values (MLflow cannot change them); run {self.run_id} still shows "
                "the "
                f"earlier {', '.join(changed)} (config.yaml has the new ones)"
            )
        self.client.log_batch(
            self.run_id, params=[Param(key, value) for key, value in params.items() if key not in earlier]
        )

    def log(self, kind: str, step: int, metrics: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(f"{kind}/{key}", float(value), now, step) for key, value in metrics.items()]
        )

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


def flat_recipe(recipe: dict, prefix: str = "") -> dict:
    """``{"train": {"lr": 0.1}}`` → ``{"train.lr": 0.1}`` (lists stay values)."""
    flat = {}
    for key, value in recipe.items():
        if isinstance(value, dict) and value:
            flat.update(flat_recipe(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _one_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _close_quietly(tracker) -> None:
    try:
        tracker.close(failed=True)
    except Exception:  # it has already failed once; its first error was reported
        pass


def _read_ids(output_dir: Path) -> dict[str, str]:
    path = output_dir / IDS_FILE
    ids = read_metadata(path, "delete it to start new tracker runs")
    if ids is None:
        return {}
    if not all(isinstance(v, str) for v in ids.values()):
        raise InputError(f"{path}: must map tracker names to run ids; delete it to start new tracker runs")
    return ids


def _write_ids(output_dir: Path, ids: dict[str, str]) -> None:
    path = output_dir / IDS_FILE
    if not ids:
        path.unlink(missing_ok=True)
        return
    partial = path.with_name(f".{IDS_FILE}.tmp-{os.getpid()}")
    partial.write_text(json.dumps(ids, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [record for _, record in _lines_and_records(path)]


def _lines_and_records(path: Path) -> list[tuple[str, dict]]:
    """(line, record) per line of ``path``. A last line that does not parse is dropped: a process
    killed mid-write (or a full disk) leaves a torn final record, which must not block resume or
    report. A broken line before the last is an :class:`InputError` naming it."""
    numbered = [
        (n, line)
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if line.strip()
    ]
    out = []
    for index, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if index == len(numbered) - 1:
                break
            raise InputError(f"{path}:{number}: not valid JSON ({error.msg}); remove or repair that line") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int) or isinstance(record["step"], bool):
            raise InputError(
                f"{path}:{number}: not a metrics record (an object with an integer step); remove that line"
            )
        out.append((line, record))
    return out


class MetricsWindow:
    """The training metrics of the steps since the last record, kept on the device.

    Why: reading a tensor's value on the host waits for the device to finish everything queued before
    it; read every step, that keeps a GPU idle while Python prepares the next step. Here each step adds
    to device tensors, and the record reads them all at once, every ``train.log_every`` steps.
    """

    def __init__(self, device: torch.device):
        self.keys: list[str] = []  # the logged parts (the same every step), sorted
        self.sums = torch.zeros(0, dtype=torch.float64, device=device)  # (K,) over the finite steps
        self.counted = torch.zeros((), dtype=torch.int64, device=device)  # finite steps
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)  # non-finite steps
        self.tokens = torch.zeros((), dtype=torch.int64, device=device)
        self.flops = torch.zeros((), dtype=torch.float64, device=device)  # the model's, counted by the task
        self.data_wait = 0.0  # seconds the host waited for the loader's next batch (host time: no device read)
        self.bad_step = torch.full((), -1, dtype=torch.int64, device=device)  # the first non-finite step, or −1
        self.bad_values = self.sums  # (K,) its parts

    @property
    def halted(self) -> torch.Tensor:
        """A bool scalar on the device: some step of the window was not finite."""
        return self.bad_step >= 0

    def add(
        self,
        parts: dict[str, torch.Tensor],
        bad: torch.Tensor,
        tokens: torch.Tensor,
        step: int,
        flops: torch.Tensor | None = None,
        data_wait: float = 0.0,
    ) -> None:
        if not self.keys:
            self.keys = sorted(parts)
            self.sums = self.bad_values = self.sums.new_zeros(len(self.keys))
        values = torch.stack([parts[key] for key in self.keys])  # (K,)
        self.sums = self.sums + torch.where(bad, 0.0, values)  # NaN · 0 would be NaN: select instead
        self.counted = self.counted + (~bad).long()
        self.skipped = self.skipped + bad.long()
        self.tokens = self.tokens + tokens
        if flops is not None:
            self.flops = self.flops + flops
        self.data_wait += data_wait
        first = bad & (self.bad_step < 0)
        self.bad_step = torch.where(first, step, self.bad_step)
        self.bad_values = torch.where(first, values, self.bad_values)

    def first_bad_step(self) -> tuple[int, dict[str, float]]:
        """The first non-finite step and its parts (host reads: only when the window is known to hold one)."""
        return int(self.bad_step), dict(zip(self.keys, self.bad_values.tolist()))


def progress_fields(record: dict) -> dict[str, str]:
    """The progress bar's view of a record: loss, tokens/s, MFU and the share of time waiting for data."""
    fields = {"loss": f"{record.get('loss', float('nan')):.3f}", "tok_s": f"{record['tokens_per_s']:.0f}"}
    if "mfu" in record:
        fields["mfu"] = f"{100 * record['mfu']:.1f}%"
    fields["wait"] = f"{100 * record['data_wait']:.0f}%"
    return fields


def progress_bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc="train", unit="step", dynamic_ncols=True)
