"""Stopping on a signal: SIGTERM (a job scheduler's stop) and SIGINT (^C) become a flag the loop reads after each
step, so a run saves where it is and exits cleanly instead of dying mid-step."""

from __future__ import annotations

import signal


class StopSignal:
    """SIGTERM / SIGINT set a flag; the loop finishes the step, saves and exits cleanly.

    Nested, an inner one (a run's) tells the outer ones (a curriculum's, between its runs) what it received and
    starts with what they received before it: a stop is a stop of everything that runs, wherever it lands."""

    def __init__(self):
        self.received = None
        self.previous = {}
        self.outer: StopSignal | None = None  # the one whose handlers this one's replaced

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._handle)
        outer = getattr(self.previous[signal.SIGTERM], "__self__", None)
        if isinstance(outer, StopSignal):
            self.outer, self.received = outer, outer.received
        return self

    def note(self, name: str) -> None:
        """Record a stop (a signal, or another rank's) here and in every outer StopSignal."""
        self.received = name
        if self.outer is not None:
            self.outer.note(name)

    def _handle(self, signum, frame):
        self.note(signal.Signals(signum).name)

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
