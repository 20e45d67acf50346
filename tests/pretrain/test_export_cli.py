"""`spanlm export` as a batch job runs it: stderr redirected to a file."""

from __future__ import annotations

import json

from helpers import copy_of
from spanlm.cli import main


def test_an_export_whose_stderr_is_not_a_terminal_writes_no_progress_bar(readme_runs, tmp_path, monkeypatch, capsys):
    """transformers' "Writing model shards" bar, every redraw a line of a redirected log, stays off."""
    from transformers.utils import logging as transformers_logging

    monkeypatch.chdir(copy_of(readme_runs, tmp_path / "work"))
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.enable_progress_bar()  # as in a fresh process (an earlier in-process run turned it off)
    try:
        assert main(["export", "runs/pretrain/spanbert", "--out", str(tmp_path / "export")]) == 0
    finally:
        (transformers_logging.enable_progress_bar if was_enabled else transformers_logging.disable_progress_bar)()
    out, err = capsys.readouterr()
    assert json.loads(out) == {"exported": str(tmp_path / "export")}
    assert "Writing model shards" not in err and "\r" not in err
