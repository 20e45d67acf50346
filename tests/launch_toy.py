"""`python launch_toy.py ARGS…` = `spanlm ARGS…` with the toy objective registered (for subprocess tests).

At exit it reports, on stderr, any gloo thread still running: a process group that outlives the run is torn
down while the interpreter finalises, which can abort the process after its work is done."""

import atexit
import os
import sys
from pathlib import Path

import toy_objective  # noqa: F401  (registers "toy")
from spanlm.cli import main


def thread_name(task: Path) -> str:
    try:
        return (task / "comm").read_text().strip()
    except FileNotFoundError:  # the thread ended after it was listed (a DataLoader worker's, at exit)
        return ""


def report_gloo_threads() -> None:
    tasks = Path("/proc/self/task")
    if tasks.is_dir():
        gloo = sorted(name for name in map(thread_name, tasks.iterdir()) if "gloo" in name)
        if gloo:
            sys.stderr.write(f"rank {os.environ.get('RANK')}: gloo threads still running at exit: {gloo}\n")


atexit.register(report_gloo_threads)
sys.exit(main(sys.argv[1:]))
