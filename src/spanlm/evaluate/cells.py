"""The cells of an evaluation: one fine-tuning run per (task, encoder, arm, seed), each exactly what
``spanlm KIND train`` runs, in its own process (started without importing torch again: spanlm.evaluate.launch).

A cell's directory holds ``recipe.yaml`` (the task's recipe with the cell's encoder, arm, seed and output
directory: the settings it runs with, whole), ``cell.json`` (their fingerprint, with the encoder's), the run
itself and ``log.txt``. A cell whose fingerprint matches and whose run reached its last step with its final
dev scores (``eval.json``) is finished and is never run again; a matching cell cut short continues from its
last checkpoint (``--resume auto``); a changed setting or encoder starts its cells afresh, and only them.

Cells run in parallel processes, each on its share of the cores (``OMP_NUM_THREADS``, unless set): tiny
encoders on a CPU use one thread best, side by side. On a GPU they run one after another.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spanlm.config import save_config, to_dict
from spanlm.errors import ConfigError, InputError, read_text, require_directory
from spanlm.evaluate import launch
from spanlm.evaluate.suite import WINDOW_KEYS, Suite, Task
from spanlm.files import write_text_atomically

RANDOM_PREFIX = "random:"  # NAME=random:DIR: DIR's architecture and tokenizer, freshly initialised


@dataclasses.dataclass(frozen=True)
class Encoder:
    name: str
    path: Path
    random: bool  # fresh weights of path's architecture (model.init=random)

    @property
    def label(self) -> str:
        return f"{self.name} ({'random init of ' if self.random else ''}{self.path})"


def parse_encoders(specs: list[str]) -> list[Encoder]:
    """``NAME=DIR`` / ``NAME=random:DIR`` → encoders, each a Hugging Face encoder directory."""
    encoders = []
    for spec in specs:
        name, equals, target = spec.partition("=")
        if not (equals and name and target):
            raise ConfigError(f"--encoders {spec}: expected NAME=DIR or NAME=random:DIR")
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"--encoders {spec}: a name is letters, digits, '-', '_' and '.' (it names folders)")
        random = target.startswith(RANDOM_PREFIX)
        path = Path(target.removeprefix(RANDOM_PREFIX))
        require_directory(path, f"--encoders {spec}")
        if not (path / "config.json").is_file():
            raise InputError(f"--encoders {spec}: {path}: not a Hugging Face model directory (no config.json)")
        read_model_config(path, f"--encoders {spec}")
        encoders.append(Encoder(name, path, random))
    names = [encoder.name for encoder in encoders]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"--encoders: each encoder needs its own name, {repeated} repeat")
    if not encoders:
        raise ConfigError("--encoders: name one or more encoders, NAME=DIR or NAME=random:DIR")
    return encoders


def read_model_config(directory: Path, given: str) -> dict:
    """``directory``'s config.json, a JSON object naming its ``model_type`` (what every cell's encoder is built
    from: refused here rather than in each cell); ``given``: the option that named the directory."""
    path = directory / "config.json"
    try:
        config = json.loads(read_text(path))
    except InputError as error:  # not UTF-8 text
        raise InputError(f"{given}: {error}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{given}: {path}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise InputError(f"{given}: {path}: not a Hugging Face model config (a JSON object with a 'model_type')")
    return config


def check_windows(suite: Suite, encoders: list[Encoder]) -> None:
    """Refuse, before any cell runs, a task whose windows are longer than an encoder can number: each of its
    cells would fail once started (a CharBERT export has 64 positions, the shipped NER recipes 128-token
    windows)."""
    from spanlm.models.backbone import config_max_sequence_length

    for encoder in encoders:
        config = read_model_config(encoder.path, f"--encoders {encoder.name}")
        positions = config_max_sequence_length(config)
        if positions is None:
            continue
        for task in suite.tasks:
            key = WINDOW_KEYS[task.kind]
            length = getattr(task.recipe.data, key)
            if length > positions:
                raise ConfigError(
                    f"{suite.path}: task {task.name}: data.{key} {length} exceeds the {positions} positions of "
                    f"encoder {encoder.name} ({encoder.path}); set data.{key}: {positions} in the task's settings"
                )


@dataclasses.dataclass(frozen=True)
class Cell:
    task: Task
    encoder: Encoder
    arm: str
    seed: int
    directory: Path

    @property
    def key(self) -> str:
        return f"{self.task.name}/{self.encoder.name}/{self.arm}/seed-{self.seed}"

    def recipe(self):
        """The task's recipe for this cell: its encoder start, arm, seed and output directory."""
        recipe = dataclasses.replace(
            self.task.recipe,
            seed=self.seed,
            model=dataclasses.replace(
                self.task.recipe.model,
                path=str(self.encoder.path),
                init="random" if self.encoder.random else "pretrained",
                frozen=self.arm == "frozen",
            ),
            train=dataclasses.replace(self.task.recipe.train, output_dir=str(self.directory / "run")),
            # the suite reports; the cell's run writes metrics.jsonl and its log alone
            logging=dataclasses.replace(self.task.recipe.logging, report_to=[], progress=False),
        )
        return recipe

    def fingerprint(self) -> str:
        """What decides the cell's result: its whole recipe, the encoder directory's files (name, size and
        modification time; random init reads the architecture and tokenizer only, but a changed directory may
        have changed them) and its training and dev files' contents (an edited file is another cell, not a kept one
        scored on the old data). The recipe with the encoder's path resolved and without its output directory: another
        spelling of ``--out`` or of the encoder's path is the same cell."""
        recipe = to_dict(self.recipe())
        del recipe["train"]["output_dir"]
        recipe["model"]["path"] = str(self.encoder.path.resolve())
        digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
        for file in sorted(p for p in self.encoder.path.iterdir() if p.is_file()):
            stat = file.stat()
            digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        for key in ("train", "dev"):  # by content: a script that writes the same data again keeps its cells
            path = recipe["data"].get(key)
            if isinstance(path, str) and Path(path).is_file():
                stat = Path(path).stat()
                digest.update(f"{key}\0{content_digest(path, stat.st_size, stat.st_mtime_ns)}\0".encode())
        return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def content_digest(path: str, size: int, modified_ns: int) -> str:
    """A file's SHA-256, read once per (path, size, modification time) in a process: every cell of a task shares it."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def plan_cells(suite: Suite, encoders: list[Encoder], seeds: tuple[int, ...], out: Path) -> list[Cell]:
    """Every (task, encoder, arm, seed), the slowest-varying first: a suite stopped midway has whole tasks."""
    return [
        Cell(task, encoder, arm, seed, out / "cells" / task.name / encoder.name / arm / f"seed-{seed}")
        for task in suite.tasks
        for seed in seeds
        for arm in task.arms
        for encoder in encoders
    ]


def finished_scores(cell: Cell) -> dict | None:
    """The final dev scores of a finished cell with the current settings, else None."""
    from spanlm.train.checkpoint import latest_checkpoint, step_of

    run = cell.directory / "run"
    try:
        recorded = json.loads((cell.directory / "cell.json").read_text(encoding="utf-8"))["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if recorded != cell.fingerprint() or not (run / "eval.json").is_file():
        return None
    checkpoint = latest_checkpoint(run)
    if checkpoint is None or step_of(checkpoint) < cell.task.recipe.train.max_steps:
        return None  # stopped by a signal: its scores are those of a shorter run
    return json.loads((run / "eval.json").read_text(encoding="utf-8"))


def _ready(cell: Cell, force: bool) -> None:
    """The cell's directory for a run: kept when its settings match (a cut-short run continues), else new."""
    try:
        recorded = json.loads((cell.directory / "cell.json").read_text(encoding="utf-8"))["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = None
    fingerprint = cell.fingerprint()
    if force or recorded != fingerprint:
        shutil.rmtree(cell.directory, ignore_errors=True)
    cell.directory.mkdir(parents=True, exist_ok=True)
    save_config(cell.recipe(), cell.directory / "recipe.yaml")
    (run := cell.directory / "run").mkdir(exist_ok=True)
    (cell.directory / "cell.json").write_text(
        json.dumps({"cell": cell.key, "fingerprint": fingerprint, "encoder": str(cell.encoder.path)}) + "\n",
        encoding="utf-8",
    )
    (run / "eval.json").unlink(missing_ok=True)  # written again at the run's end; its absence marks "not done"
    for earlier in (PREDICTIONS_FILE, TEST_FILE):  # an earlier model's: written again after the run
        (cell.directory / earlier).unlink(missing_ok=True)


@dataclasses.dataclass
class Outcome:
    cell: Cell
    scores: dict | None
    seconds: float
    skipped: bool = False
    error: str | None = None
    test_scores: dict | None = None  # the final model's scores on the task's test split, where it names one


class CellRunner:
    """Runs cells in ``jobs`` processes; a signal stops new cells and passes itself to the running ones, which
    finish their step and save (they continue on the next run)."""

    def __init__(self, jobs: int, threads: int | None, log=print, keep_predictions: bool = False):
        self.jobs, self.threads, self.log, self.keep_predictions = jobs, threads, log, keep_predictions
        self.running: dict[int, launch.Process] = {}
        self.lock = threading.Lock()
        self.stopped: str | None = None

    def run(self, cells: list[Cell], force: bool) -> list[Outcome]:
        outcomes, todo = [], []
        for cell in cells:
            scores = None if force else finished_scores(cell)
            if scores is None:
                todo.append(cell)
            else:
                outcomes.append(Outcome(cell, scores, 0.0, skipped=True))
        if outcomes:
            self.log(f"{len(outcomes)} of {len(cells)} cells already finished with these settings: kept")
            # finished earlier: their test scores (and, asked for now, dev predictions) if they have none yet
            outcomes = [self._after_training(outcome) for outcome in outcomes]
        if not todo:
            return outcomes
        self.log(f"running {len(todo)} cells, {self.jobs} at a time")
        started, done = time.monotonic(), []
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            with ThreadPoolExecutor(self.jobs) as pool:
                for outcome in pool.map(lambda cell: self._run_one(cell, force), todo):
                    outcomes.append(outcome)
                    if outcome.error is None and outcome.scores is None:
                        continue  # not started: the suite was stopped
                    done.append(outcome)
                    self._progress(outcome, len(done), len(todo), time.monotonic() - started)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return outcomes

    def _progress(self, outcome: Outcome, done: int, total: int, elapsed: float) -> None:
        left = total - done
        eta = "" if not left else f" · about {elapsed / done * left / 60:.1f} min left"
        if outcome.error is not None:
            what = f"FAILED ({outcome.error})"
        else:
            what = f"{outcome.cell.task.metric} {outcome.cell.task.score(outcome.scores):.2f}"
        self.log(f"[{done}/{total}] {outcome.cell.key}: {what} in {outcome.seconds:.0f} s{eta}")

    def _stop(self, signum, frame) -> None:
        self.stopped = signal.Signals(signum).name
        with self.lock:
            for process in self.running.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)

    def _run_one(self, cell: Cell, force: bool) -> Outcome:
        if self.stopped:
            return Outcome(cell, None, 0.0)
        _ready(cell, force)
        command = [cell.task.kind, "train", str(cell.directory / "recipe.yaml"), "--resume", "auto"]
        clock = time.monotonic()
        with self.lock:
            if self.stopped:
                return Outcome(cell, None, 0.0)
            process = self._start(cell, command)
            self.running[process.pid] = process
        returncode = process.wait()
        with self.lock:
            del self.running[process.pid]
        seconds = time.monotonic() - clock
        if returncode in STOPPED_EXITS and self.stopped:
            return Outcome(cell, None, seconds)  # the suite's stop reached it before its run could save: not run
        if returncode != 0:
            return Outcome(cell, None, seconds, error=f"exit {returncode}: {_last_line(cell.directory / LOG_FILE)}")
        scores = finished_scores(cell)
        if scores is None:
            if self.stopped:
                return Outcome(cell, None, seconds)
            return Outcome(cell, None, seconds, error="the run ended before its last step")
        return self._after_training(Outcome(cell, scores, seconds))

    def _after_training(self, outcome: Outcome) -> Outcome:
        """A scored cell's final model run once more by `spanlm KIND eval` where asked: on the task's test split
        (``CELL/test.json``, read into the outcome) and, under ``--keep-predictions``, on dev for its predictions
        (``CELL/predictions.jsonl``: one line per document, question or example); each only once per cell."""
        cell = outcome.cell
        if outcome.scores is None or self.stopped:
            return outcome
        test = cell.directory / TEST_FILE
        if cell.task.test and _scored_data(test) != cell.task.test:  # none yet, or of a split the task no longer names
            qa = cell.task.kind == "qa"  # qa eval prints its scores; the others write them to --output
            error = self._evaluate(cell, cell.task.test, [] if qa else ["--output", str(test)], test if qa else None)
            if error:
                return dataclasses.replace(outcome, error=f"its test split: {error}")
        if cell.task.test:
            outcome = dataclasses.replace(outcome, test_scores=json.loads(test.read_text(encoding="utf-8")))
        predictions = cell.directory / PREDICTIONS_FILE
        if self.keep_predictions and not predictions.is_file():
            qa = cell.task.kind == "qa"  # qa eval writes {question id: answer}, one JSON object: made lines below
            written = cell.directory / "predictions-answers.json" if qa else predictions
            scores = [] if qa else ["--output", str(cell.directory / "predictions-scores.json")]
            error = self._evaluate(cell, cell.task.recipe.data.dev, ["--predictions", str(written), *scores], None)
            if error:
                return dataclasses.replace(outcome, error=f"its predictions: {error}")
            if qa:
                answers = json.loads(written.read_text(encoding="utf-8"))
                lines = [
                    json.dumps({"id": question, "answer": answer}, ensure_ascii=False)
                    for question, answer in answers.items()
                ]
                write_text_atomically(predictions, "".join(line + "\n" for line in lines))
                written.unlink()
        return outcome

    def _evaluate(self, cell: Cell, data: str, options: list[str], stdout_to: Path | None) -> str | None:
        """`spanlm KIND eval` of the cell's model on ``data`` (its log in the cell's log.txt; ``stdout_to``: where
        its printed scores go, qa's way of giving them); the error, or None."""
        command = [cell.task.kind, "eval", str(cell.directory / "run" / "model"), "--data", data, *options]
        printed = cell.directory / "eval-stdout.txt"  # stdout_to is written only whole, from the last line
        returncode = self._start(cell, command, printed if stdout_to else None).wait()
        if returncode != 0:
            return f"exit {returncode}: {_last_line(cell.directory / LOG_FILE)}"
        if stdout_to is not None:
            lines = printed.read_text(encoding="utf-8").strip().splitlines()
            printed.unlink()
            stdout_to.write_text(lines[-1] + "\n", encoding="utf-8")
        return None

    def _start(self, cell: Cell, command: list[str], stdout: Path | None = None) -> launch.Process:
        """``spanlm COMMAND`` for ``cell``: the command line, then its output (its stdout to ``stdout`` where
        given), appended to the cell's log."""
        log = cell.directory / LOG_FILE
        with open(log, "a", encoding="utf-8") as log_file:
            log_file.write(f"$ spanlm {' '.join(command)}\n")
        return launch.start(command, cell_environment(self.threads), log, stdout)


LOG_FILE = "log.txt"  # each of a cell's commands, then its output
# How a cell ends when a stop reaches it before its run handles signals (while it starts): killed by the SIGTERM
# the suite passes on, or spanlm's exit code for a ^C (sent to the whole process group)
STOPPED_EXITS = (-signal.SIGTERM, -signal.SIGINT, 130)
# Written by a scored cell where asked: its final model's scores on the task's test split; its dev predictions
TEST_FILE = "test.json"
PREDICTIONS_FILE = "predictions.jsonl"


def cell_environment(threads: int | None) -> dict[str, str]:
    """A cell's environment: this process's, with ``threads`` OpenMP threads unless OMP_NUM_THREADS is set. An
    empty OMP_NUM_THREADS counts as unset: OpenMP rejects it and takes every core, so cells side by side would
    each run as many threads as there are cores and slow one another down many times over."""
    environment = dict(os.environ)
    if threads is not None and not environment.get("OMP_NUM_THREADS", "").strip():
        environment["OMP_NUM_THREADS"] = str(threads)
    return environment


def _scored_data(scores: Path) -> str | None:
    """The data a scores file of `spanlm KIND eval` was scored on (its "data"), None where there is none."""
    try:
        return json.loads(scores.read_text(encoding="utf-8"))["data"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "no output"


def default_jobs() -> tuple[int, int | None]:
    """(cells at a time, threads per cell): one cell on a GPU (it takes the whole device), else one per core."""
    import torch

    if torch.cuda.is_available():
        return 1, None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores, 1
