"""`spanlm export` as a batch job runs it: stderr redirected to a file."""

from __future__ import annotations

import json

from helpers import copy_of, transformers_bars_on
from spanlm.cli import main


def test_an_export_whose_stderr_is_not_a_terminal_writes_no_progress_bar(readme_runs, tmp_path, monkeypatch, capsys):
    """transformers' "Writing model shards" bar, every redraw a line of a redirected log, stays off."""
    monkeypatch.chdir(copy_of(readme_runs, tmp_path / "work"))
    with transformers_bars_on():
        assert main(["export", "runs/pretrain/spanbert", "--out", str(tmp_path / "export")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"exported": str(tmp_path / "export")}
    assert "Writing model shards" not in err and "\r" not in err
