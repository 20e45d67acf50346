"""spanlm.fork_server: what a forked command takes over before it runs (the serving itself: tests/evaluate/
test_launch.py, through the client that starts the server)."""

from __future__ import annotations

import os

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
