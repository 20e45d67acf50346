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


def test_an_export_replaces_its_own_files_only(embedded_prepared, tmp_path, capsys):
    """An export lists what it wrote: a second export into the same --out replaces it, and one that finds a file the
    export did not write refuses, keeping it."""
    from helpers import embedded_recipe
    from spanlm.pretrain.run import pretrain

    recipe = embedded_recipe("spanbert", embedded_prepared, tmp_path / "run", "train.max_steps=2")
    run = pretrain(recipe, log=lambda *_: None)
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out)]) == 0
    record = json.loads((out / "spanlm_objective.json").read_text(encoding="utf-8"))
    assert record["objective"] == "spanbert" and {"heads.safetensors", "model.safetensors"} <= set(record["files"])
    assert main(["export", str(run), "--out", str(out)]) == 0
    (out / "NOTES.txt").write_text("keep me", encoding="utf-8")
    assert main(["export", str(run), "--out", str(out)]) == 2
    assert "also holds NOTES.txt" in capsys.readouterr().err
    assert (out / "NOTES.txt").read_text(encoding="utf-8") == "keep me"
