"""A ``spanlm`` for the studies' scripts that does not import torch and transformers for every command.

The example studies (examples/*.sh) run a dozen ``$SPANLM`` commands each; their tests ran each as a fresh
interpreter, most of a small command's time spent importing. :func:`start_server` starts, once per test process,
a server that imports them (spanlm.fork_server's PRELOAD and the pretraining commands' modules) and listens on a
Unix socket; :func:`shim` writes an executable that a script calls as ``spanlm``: a stdlib-only client that sends
its arguments, working directory, environment and its stdin, stdout and stderr (the descriptors themselves) to the
server. For each, the server forks a handler, which forks the command (spanlm.fork_server's child, with the
client's descriptors), tells the client its pid and then its exit code; the client passes SIGTERM, SIGINT and
SIGHUP on to it and exits as it did (a signal's death as the same signal). A client that dies takes its command
down (SIGTERM, when the handler sees the client's end of the socket close).

A command whose environment differs from the server's in a variable read at import
(spanlm.evaluate.launch.IMPORT_TIME) runs as a fresh interpreter instead (the client execs ``python -m
spanlm``), as ``spanlm eval``'s cells do. This module's top level imports the standard library only: the client
imports it on every command.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

SOCKET_VARIABLE = "FORKED_SPANLM_SOCKET"  # not one of IMPORT_TIME's prefixes: the server's own address
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What the studies' other commands import (spanlm prepare, pretrain, export, eval)
COMMANDS = ["spanlm.data.prepare", "spanlm.pretrain.run", "spanlm.pretrain.export", "spanlm.evaluate.cells"]


# ---------------------------------------------------------------- the client (the `spanlm` a script calls)


def client(argv: list[str]) -> int:
    """``spanlm ARGV`` run by the server named in the environment; its exit code (what a shell sees)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(os.environ[SOCKET_VARIABLE])
    except OSError:
        _run_fresh(argv)  # no server: a fresh interpreter (never returns)
    request = {"argv": argv, "cwd": os.getcwd(), "environment": dict(os.environ)}
    socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
    replies = connection.makefile("r", encoding="utf-8")
    first = json.loads(replies.readline() or '{"fresh": true}')
    if first.get("fresh"):
        connection.close()
        _run_fresh(argv)
    pid = first["pid"]
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, frame: _pass_on(pid, signum))
    line = replies.readline()
    code = json.loads(line)["exit"] if line else 255
    if code < 0:  # it died of a signal: so does this process, for the shell to see the same
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _pass_on(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _run_fresh(argv: list[str]):
    os.execv(sys.executable, [sys.executable, "-m", "spanlm", *argv])


def shim(directory: Path, server_socket: Path) -> Path:
    """An executable ``directory/spanlm`` running :func:`client` with this Python (``-I -S``: nothing but the
    standard library and this file), for a script's ``SPANLM``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "spanlm"
    path.write_text(
        f"#!{sys.executable} -IS\n"
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"os.environ.setdefault({SOCKET_VARIABLE!r}, {str(server_socket)!r})\n"
        "import forked_spanlm\n"
        "sys.exit(forked_spanlm.client(sys.argv[1:]))\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------- the server


def start_server(server_socket: Path, environment: dict[str, str]):
    """The server's process (``subprocess.Popen``), listening at ``server_socket`` once this returns; it ends
    when its stdin closes (the test process's end) or when it is killed."""
    import subprocess

    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import forked_spanlm; "
    code += f"forked_spanlm.serve({str(server_socket)!r})"
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment
    )
    if process.stdout.readline().strip() != b"listening":
        raise RuntimeError(f"the forked spanlm server did not start (exit {process.wait()})")
    return process


def serve(server_socket: str) -> None:
    """Import what the commands need, listen, then fork a handler per connection until stdin closes."""
    from spanlm import fork_server

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    started_with = dict(os.environ)
    set_on_import = fork_server.preload([*fork_server.PRELOAD, *COMMANDS])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(server_socket)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the handlers are nobody's to wait for
    print("listening", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready:
            return  # the tests' process closed its end
        connection, _ = listener.accept()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _handle(connection, started_with, set_on_import)
        connection.close()


def _handle(connection: socket.socket, started_with: dict, set_on_import: dict) -> None:
    """One client: fork its command, tell its pid, then its exit code; end it if the client goes first."""
    from spanlm import fork_server
    from spanlm.evaluate.launch import forkable

    code = 0
    try:
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        request = json.loads(message)
        if not forkable(request["environment"], started_with):
            connection.sendall(b'{"fresh": true}\n')
            return
        sys.stdout.flush()
        pid = fork_server.fork_command()  # the client passes a signal on as soon as it has the pid
        if pid == 0:
            connection.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            os.chdir(request["cwd"])
            fork_server.run_command(request["argv"], {**set_on_import, **request["environment"]})
        for fd in fds:
            os.close(fd)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        ended = os.pidfd_open(pid)
        ready, _, _ = select.select([ended, connection], [], [])
        if ended not in ready:  # the client is gone (killed): so is its command
            os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        connection.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    except BaseException:
        code = 1
    finally:
        os._exit(code)
