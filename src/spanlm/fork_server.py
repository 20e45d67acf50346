"""The fork server behind ``spanlm eval``'s cells (``python -m spanlm.fork_server``, started by
spanlm.evaluate.launch): it imports what a cell's ``spanlm`` commands need once (:data:`PRELOAD`: torch,
transformers, the tasks' code), then forks a process for each command it reads on stdin, one JSON line each
(``argv``, ``environment``, ``output``, ``stdout``), and writes ``{"pid"}`` on stdout at once and
``{"pid", "exit"}`` when the command ends (the exit code, negative for a signal).

The server has only imported when it forks (the threads its libraries start on import, numpy's and scipy's OpenBLAS
pools, stop themselves around a fork, as every DataLoader worker's fork relies on), so a child starts as a fresh
interpreter would, its modules already loaded. A child takes the request's environment and thread count, sends its
stdout and stderr to the request's files and runs ``spanlm ARGV``. The server ignores SIGTERM and SIGINT, which a
scheduler or a ^C sends to the whole process group: the cells save and stop, and the server stays to pass on their
exit codes. It ends when its stdin closes (the suite's process ended or let it go)."""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import sys
import traceback
from typing import NoReturn

# What the cells' commands import: the parsers, then each task's training, model, data and prediction code.
PRELOAD = [
    "spanlm.cli",
    *(f"spanlm.{kind}.{part}" for kind in ("cls", "ner", "qa") for part in ("cli", "task", "predict")),
]


def serve() -> None:
    """Import :data:`PRELOAD`, then serve requests until stdin closes (module docstring)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C reaches the whole process group too
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what an import prints must not reach the replies
    set_on_import = preload(PRELOAD)
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
                pid = fork_command()
                if pid == 0:
                    _child(json.loads(line), set_on_import, [requests.fileno(), replies.fileno()])
                if not _tell(replies, {"pid": pid}):
                    return
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if not _tell(replies, {"pid": pid, "exit": os.waitstatus_to_exitcode(status)}):
                return


def preload(modules: list[str]) -> dict[str, str]:
    """Import ``modules``; the environment variables the imports set (torch's inductor cache directory), which a
    fresh interpreter's imports would set too and a forked command must therefore keep."""
    started_with = dict(os.environ)
    for module in modules:
        importlib.import_module(module)
    return {key: value for key, value in os.environ.items() if started_with.get(key) != value}


def _tell(replies, message: dict) -> bool:
    """One reply line; False when the suite's process is gone (nobody reads them any more)."""
    try:
        replies.write(json.dumps(message) + "\n")
    except BrokenPipeError:
        return False
    return True


def _child(request: dict, set_on_import: dict[str, str], server_fds: list[int]) -> NoReturn:
    """A forked command: the cell's output files, then :func:`run_command`; never returns to the server's loop."""
    try:
        for fd in server_fds:
            os.close(fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        log = os.open(request["output"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        stdout = request["stdout"]
        os.dup2(log, 2)
        os.dup2(os.open(stdout, os.O_WRONLY | os.O_TRUNC | os.O_CREAT, 0o644) if stdout else log, 1)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    run_command(request["argv"], {**set_on_import, **request["environment"]})


def run_command(argv: list[str], environment: dict[str, str]) -> NoReturn:
    """``spanlm ARGV`` in this forked process, with ``environment`` and its thread count. It ends as ``python -m
    spanlm`` would, but for the teardown of every module (freeing torch's and transformers' objects that nothing
    reads, a large share of a small command): the command's code (1 and the traceback for an exception), the exit
    handlers run (``atexit``: logging's flush, multiprocessing's clean-up), the output flushed."""
    code = 1
    try:
        take_environment(environment)
        sys.argv = ["spanlm", *argv]
        from spanlm.cli import main

        code = main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def fork_command() -> int:
    """``os.fork()`` for a command: the child has SIGTERM and SIGINT as a fresh interpreter has them (the server
    ignores them) before it can receive one. Both are held across the fork and until then, so one sent as soon as the
    child's pid is known waits for the defaults (a held signal stays pending on Linux, ignored or not) instead of
    meeting the server's SIG_IGN and being lost."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return pid


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
