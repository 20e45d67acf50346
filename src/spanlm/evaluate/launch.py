"""Starting a cell's ``spanlm`` commands without importing torch and transformers for each one.

A cell runs ``spanlm KIND train`` (and ``spanlm KIND eval`` after it) in a process of its own: its own exit code
and signals, nothing shared with the suite's process or with the cells beside it. Importing what those commands
need (torch, transformers, the tasks' modules) takes seconds on a CPU, often longer than a small cell's training.
So the processes come from a fork server: ``python -m spanlm.evaluate.launch`` imports the commands' modules once
(:data:`PRELOAD`), then forks a process for each command it is asked for on its stdin, and tells the pid and, when
it ends, the exit code. The server has computed nothing and started no thread, so a child starts as a fresh
interpreter would, its modules already loaded; it takes the cell's environment and thread count and writes to
the cell's log, as a command started by ``subprocess`` does.

Values a library reads from the environment when it is imported (thread pools, Hugging Face's offline mode and
cache, torch's and spanlm's switches) are the server's: the server starts with the first command's environment,
and a command whose environment differs in any such variable runs as a fresh interpreter instead
(``subprocess``), as does every command where no server can run (not Linux, or the server ended).

The server ignores SIGTERM and SIGINT: one sent to the whole process group (a cluster's scheduler stopping a
job, a ^C) reaches every cell, which saves at its next step and stops, and the server, which must stay to pass on
their exit codes. It ends when the suite's process closes its stdin (or ends).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Protocol

# What the cells' commands import: the parsers, then each task's training, model, data and prediction code.
PRELOAD = [
    "spanlm.cli",
    *(f"spanlm.{kind}.{part}" for kind in ("cls", "ner", "qa") for part in ("cli", "task", "predict")),
]
# Variables read when a module is imported (the rest are read when used, in the child, from its own environment).
IMPORT_TIME = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "TORCH", "PYTORCH", "CUDA", "SPANLM")
IMPORT_TIME += ("OMP_", "MKL_", "OPENBLAS", "NUMBA", "KMP_", "PYTHON", "LD_", "PATH")


class Process(Protocol):
    """A started command: the part of ``subprocess.Popen`` that the cells use."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...

    def send_signal(self, signum: int) -> None: ...


def start(argv: list[str], environment: dict[str, str], output: Path, stdout: Path | None = None) -> Process:
    """``spanlm ARGV`` in a process of its own, its stdout and stderr appended to ``output`` (its stdout written to
    ``stdout`` instead, where given). Returns a :class:`Process`: ``wait()`` gives the exit code, negative for a
    signal, as ``subprocess.Popen``'s does."""
    server = _server(environment)
    if server is not None:
        forked = server.fork(argv, environment, output, stdout)
        if forked is not None:
            return forked
    command = [sys.executable, "-m", "spanlm", *argv]
    with open(output, "a", encoding="utf-8") as log:
        if stdout is None:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
        with open(stdout, "w", encoding="utf-8") as out:
            return subprocess.Popen(command, stdout=out, stderr=log, env=environment)


# ---------------------------------------------------------------- the suite's side


def _import_time(environment: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in environment.items() if key.startswith(IMPORT_TIME)}


_lock = threading.Lock()
_running: _Server | None = None


def _server(environment: dict[str, str]) -> _Server | None:
    """This process's fork server (started on the first call, with ``environment``) where a command with
    ``environment`` may be forked from it, else None."""
    global _running
    if not sys.platform.startswith("linux"):
        return None
    with _lock:
        if _running is None:
            _running = _Server(environment)
    if not _running.alive or _import_time(environment) != _import_time(_running.environment):
        return None
    return _running


class _Forked:
    def __init__(self, pid: int):
        self.pid, self.returncode, self.ended = pid, None, threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int:
        self.ended.wait()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def end(self, code: int) -> None:
        self.returncode = code
        self.ended.set()


class _Server:
    """The fork server's process, and a thread reading what it tells: each request's pid, then its exit code."""

    def __init__(self, environment: dict[str, str]):
        self.environment = dict(environment)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "spanlm.evaluate.launch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.environment,
        )
        self.alive, self.requests, self.children = True, threading.Lock(), {}
        self.started: list[_Forked] = []
        self.replied = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def fork(self, argv: list[str], environment: dict[str, str], output: Path, stdout: Path | None) -> _Forked | None:
        request = {"argv": argv, "environment": environment, "output": str(output), "stdout": stdout and str(stdout)}
        with self.requests:  # one request at a time: its reply is the next pid the server tells
            try:
                self.process.stdin.write(json.dumps(request).encode() + b"\n")
                self.process.stdin.flush()
            except OSError:
                return None
            with self.replied:
                self.replied.wait_for(lambda: self.started or not self.alive)
                return self.started.pop(0) if self.started else None

    def _read(self) -> None:
        for line in self.process.stdout:
            message = json.loads(line)
            with self.replied:
                if "exit" in message:
                    self.children.pop(message["pid"]).end(message["exit"])
                else:
                    self.children[message["pid"]] = forked = _Forked(message["pid"])
                    self.started.append(forked)
                    self.replied.notify_all()
        with self.replied:  # the server ended: its children's codes are lost
            self.alive = False
            for child in self.children.values():
                child.end(255)
            self.replied.notify_all()


# ---------------------------------------------------------------- the server's side


def serve() -> None:
    """The fork server (``python -m spanlm.evaluate.launch``): import :data:`PRELOAD`, then for each request line
    on stdin fork a process that runs it, and write ``{"pid"}`` at once and ``{"pid", "exit"}`` when it ends."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C reaches the whole process group too
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what an import prints must not reach the replies
    for module in PRELOAD:
        importlib.import_module(module)
    requests, pending = sys.stdin.buffer.raw, b""
    while True:
        ready, _, _ = select.select([requests], [], [], 0.1)
        if ready:
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                return  # the suite closed its end: its children keep running and are nobody's to wait for
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                sys.stdout.flush()  # nothing buffered here may reach a child's output
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(json.loads(line), [requests.fileno(), replies.fileno()])
                replies.write(json.dumps({"pid": pid}) + "\n")
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            replies.write(json.dumps({"pid": pid, "exit": os.waitstatus_to_exitcode(status)}) + "\n")


def _child(request: dict, server_fds: list[int]) -> None:
    """A forked command: the cell's environment, threads and output files, then ``spanlm ARGV``; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in server_fds:
            os.close(fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        take_environment(request["environment"])
        log = os.open(request["output"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        stdout = request["stdout"]
        os.dup2(log, 2)
        os.dup2(os.open(stdout, os.O_WRONLY | os.O_TRUNC | os.O_CREAT, 0o644) if stdout else log, 1)
        sys.argv = ["spanlm", *request["argv"]]
        from spanlm.cli import main

        code = int(main(request["argv"]) or 0)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def take_environment(environment: dict[str, str]) -> None:
    """This process's environment becomes ``environment``, and torch's thread pool its ``OMP_NUM_THREADS`` (the
    pool's size was read when torch was imported, in the server)."""
    os.environ.clear()
    os.environ.update(environment)
    threads = environment.get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


if __name__ == "__main__":
    serve()
