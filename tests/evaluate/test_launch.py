"""spanlm.evaluate.launch: a cell's commands forked from a server that imported them once, with the cell's
environment and output files, and a fresh interpreter where the server's imports would not match."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from spanlm.evaluate import launch


def cells_environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def own_server(monkeypatch):
    """Each test starts this process's fork server itself: a test file run earlier in the same worker (a `spanlm
    eval` or demo run in-process) may have started it with another environment, which these commands cannot be
    forked from; that one is put back afterwards, this one let go (its stdin closed: it ends)."""
    monkeypatch.setattr(launch, "_running", None)
    yield
    if launch._running is not None:
        launch._running.process.stdin.close()
        launch._running.process.wait(timeout=60)


def test_a_command_runs_forked_from_the_preloaded_server_with_its_exit_code_and_output(tmp_path):
    log, printed = tmp_path / "log.txt", tmp_path / "stdout.txt"
    listing = launch.start(["recipes", "list"], cells_environment(), log, printed)
    assert isinstance(listing, launch._Forked)
    assert listing.wait() == 0 and listing.poll() == 0
    assert "pretrain/spanbert" in printed.read_text(encoding="utf-8")  # stdout apart, where asked
    log.write_text("$ spanlm cls train missing.yaml\n", encoding="utf-8")
    failing = launch.start(["cls", "train", str(tmp_path / "missing.yaml")], cells_environment(), log)
    assert isinstance(failing, launch._Forked) and failing.wait() == 2
    # stdout and stderr appended to the log: spanlm's one-line error, naming the file
    first, line = log.read_text(encoding="utf-8").strip().splitlines()
    assert first == "$ spanlm cls train missing.yaml"
    assert line.startswith("spanlm cls: error:") and "missing.yaml" in line


def test_the_server_imported_the_commands_modules_before_forking(tmp_path):
    """The point of the server: torch is loaded in it (its library mapped in its memory) before any command, so
    every command forked from it starts with torch imported."""
    launch.start(["recipes", "list"], cells_environment(), tmp_path / "first.txt").wait()
    server = launch._running.process.pid
    modules = subprocess.run(  # the server's own view, read through /proc: the modules its memory maps
        ["cat", f"/proc/{server}/maps"], capture_output=True, text=True, check=True
    ).stdout
    assert "torch/lib/libtorch" in modules  # torch is loaded in the server, so in every fork of it


def test_an_environment_the_server_was_not_imported_with_runs_a_fresh_interpreter(tmp_path):
    launch.start(["recipes", "list"], cells_environment(), tmp_path / "first.txt").wait()  # the server is up
    changed = {**cells_environment(), "HF_HUB_OFFLINE": "1" if os.environ.get("HF_HUB_OFFLINE") != "1" else "0"}
    process = launch.start(["recipes", "list"], changed, tmp_path / "log.txt")
    assert isinstance(process, subprocess.Popen)
    assert process.wait() == 0 and "pretrain/spanbert" in (tmp_path / "log.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_server_outlives_a_signal_to_its_process_group(tmp_path, signum):
    """A scheduler's SIGTERM (or a ^C) to the job's processes reaches the server too: it stays, to pass on the exit
    codes of the cells it forked (which save and stop)."""
    launch.start(["recipes", "list"], cells_environment(), tmp_path / "first.txt").wait()
    server = launch._running.process
    os.kill(server.pid, signum)
    time.sleep(0.2)
    assert server.poll() is None
    process = launch.start(["recipes", "list"], cells_environment(), tmp_path / "log.txt")
    assert isinstance(process, launch._Forked) and process.wait() == 0


def test_without_linux_every_command_runs_a_fresh_interpreter(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    process = launch.start(["recipes", "list"], cells_environment(), tmp_path / "log.txt")
    assert isinstance(process, subprocess.Popen) and process.wait() == 0
