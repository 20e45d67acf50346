"""Starting a cell's ``spanlm`` commands without importing torch and transformers for each one.

A cell runs ``spanlm KIND train`` (and ``spanlm KIND eval`` after it) in a process of its own: its own exit code
and signals, nothing shared with the suite's process or with the cells beside it. Importing what those commands
need (torch, transformers, the tasks' modules) takes seconds on a CPU, often longer than a small cell's training.
So the processes come from a fork server (:mod:`spanlm.fork_server`, started here): it imports the commands'
modules once, then forks a process for each command it is asked for on its stdin, and tells the pid and, when it
ends, the exit code. The server has only imported (the threads its libraries start on import, the OpenBLAS pools,
stop themselves around a fork, as every DataLoader worker's fork relies on), so a child starts as a fresh
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

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Protocol

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


def forkable(environment: dict[str, str], server_environment: dict[str, str]) -> bool:
    """Whether a command with ``environment`` may be forked from a server started with ``server_environment``: the
    same values of every variable read at import."""
    return _import_time(environment) == _import_time(server_environment)


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
    if not _running.alive or not forkable(environment, _running.environment):
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
            [sys.executable, "-m", "spanlm.fork_server"],
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
