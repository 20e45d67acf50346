"""spanlm.fork_server: its protocol, and what a forked command takes over before it runs (the client that starts
the server: tests/evaluate/test_launch.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import torch

from spanlm.fork_server import take_environment


def test_a_forked_command_takes_the_cells_environment_and_thread_count(monkeypatch):
    threads = torch.get_num_threads()
    monkeypatch.setattr(os, "environ", dict(os.environ))  # taken over whole: a copy, restored after the test
    try:
        take_environment({"OMP_NUM_THREADS": "1", "SPANLM_CELL": "yes"})
        assert os.environ == {"OMP_NUM_THREADS": "1", "SPANLM_CELL": "yes"}
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def start_server(**pipes) -> subprocess.Popen:
    """``python -m spanlm.fork_server`` with its stdin and stdout as pipes (text)."""
    command = [sys.executable, "-m", "spanlm.fork_server"]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **pipes)


def test_the_server_answers_a_request_with_the_pid_then_the_exit_code(tmp_path):
    """The protocol as its docstring gives it, without the client: one JSON line in; the pid, then the code out."""
    server = start_server()
    try:
        request = {"argv": ["recipes", "list"], "environment": dict(os.environ), "output": str(tmp_path / "log.txt")}
        server.stdin.write(json.dumps({**request, "stdout": str(tmp_path / "stdout.txt")}) + "\n")
        server.stdin.flush()
        started, ended = json.loads(server.stdout.readline()), json.loads(server.stdout.readline())
        assert ended == {"pid": started["pid"], "exit": 0}
        assert "pretrain/spanbert" in (tmp_path / "stdout.txt").read_text(encoding="utf-8")
    finally:
        server.stdin.close()  # the server ends when its stdin closes
        assert server.wait(timeout=60) == 0


def test_a_server_whose_suite_is_gone_ends_quietly(tmp_path):
    """Nobody reads the replies any more (the suite's process was killed): the server ends, without a traceback."""
    server = start_server(stderr=subprocess.PIPE)
    server.stdout.close()
    request = {"argv": ["recipes", "list"], "environment": dict(os.environ), "output": str(tmp_path / "log.txt")}
    server.stdin.write(json.dumps({**request, "stdout": None}) + "\n")
    server.stdin.flush()
    assert server.wait(timeout=120) == 0
    assert "Traceback" not in server.stderr.read()


def test_a_sigterm_sent_as_soon_as_the_pid_is_known_ends_the_command(tmp_path):
    """The server ignores SIGTERM; its child gets the default back while the signal is held. Its output is a FIFO
    here, so the child waits in opening it while the signal comes: it must die of it, not run the command once
    the FIFO is read."""
    server = start_server()
    try:
        fifo = tmp_path / "log.fifo"
        os.mkfifo(fifo)
        request = {"argv": ["recipes", "list"], "environment": dict(os.environ), "output": str(fifo), "stdout": None}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        started = json.loads(server.stdout.readline())
        os.kill(started["pid"], signal.SIGTERM)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a child that ignored the signal goes on from here
        try:
            assert json.loads(server.stdout.readline()) == {"pid": started["pid"], "exit": -signal.SIGTERM}
        finally:
            os.close(reader)
    finally:
        server.stdin.close()
        assert server.wait(timeout=60) == 0
