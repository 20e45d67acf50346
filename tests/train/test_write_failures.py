"""A write the device refuses — no space (ENOSPC), a failing device (EIO), or torch.save's zip writer losing the
errno of a short write ("unexpected pos N vs M") — anywhere in a save is one line naming the file and what was
kept, exit 2, no traceback and no temporary file; here each failure is raised where the library would raise it
(tests/train/test_disk_full.py fills a real size-limited disk)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
import yaml

import toy_objective  # noqa: F401  (registers the toy objective)
from spanlm.cli import main
from spanlm.files import out_of_space
from spanlm.train import checkpoint as ckpt
from toy_objective import toy_recipe

SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 14912 vs 14804"
FAILURES = {
    "no space": lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    "device failing": lambda: OSError(errno.EIO, os.strerror(errno.EIO)),
    "torch short write": lambda: RuntimeError(SHORT_WRITE),
}


def test_every_form_of_a_refused_write_is_recognised_and_nothing_else():
    assert out_of_space(FAILURES["no space"]()) == "No space left on device"
    assert out_of_space(FAILURES["device failing"]()) == "Input/output error"
    assert "full disk or a failing device" in out_of_space(FAILURES["torch short write"]())
    wrapped = RuntimeError("File model.safetensors cannot be written")
    wrapped.__context__ = FAILURES["no space"]()
    assert out_of_space(wrapped) == "No space left on device"
    assert out_of_space(OSError(errno.EACCES, "Permission denied")) is None
    assert out_of_space(RuntimeError("CUDA out of memory")) is None


def recipe_file(prepared: Path, tmp_path: Path) -> Path:
    from spanlm.config import to_dict

    recipe = to_dict(toy_recipe(prepared, tmp_path / "run", max_steps=2, save_every=1, log_every=1))
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def fail_second(original, failure, wanted: str):
    """``original`` (a writer taking (obj, path)), raising ``failure`` on the second call for a file named
    ``wanted``: the first checkpoint is written, the second is not."""
    calls = []

    def write(obj, path, *args, **kwargs):
        if Path(path).name == wanted:
            calls.append(path)
            if len(calls) == 2:
                raise failure()
        return original(obj, path, *args, **kwargs)

    return write


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("file", ["model.safetensors", "optimizer.pt", "trainer_state.pt"])
def test_a_checkpoint_file_refused_mid_save(prepared, tmp_path, monkeypatch, capsys, file, failure):
    import safetensors.torch

    if file == "model.safetensors":
        monkeypatch.setattr(
            safetensors.torch, "save_file", fail_second(safetensors.torch.save_file, FAILURES[failure], file)
        )
    else:
        monkeypatch.setattr(torch, "save", fail_second(torch.save, FAILURES[failure], file))
    code = main(["pretrain", str(recipe_file(prepared, tmp_path))])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("spanlm pretrain: error: ")]
    run = tmp_path / "run"
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"{ckpt.step_dir(run, 2)}: could not write the checkpoint" in lines[0]
    assert f"the latest checkpoint {ckpt.step_dir(run, 1)} is intact" in lines[0]
    assert ckpt.complete_checkpoints(run) == [ckpt.step_dir(run, 1)]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no temporary folder


@pytest.mark.parametrize("failure", ["no space", "device failing"])
def test_metrics_refused_mid_run(prepared, tmp_path, monkeypatch, capsys, failure):
    from spanlm.train import metrics

    log = metrics.MetricsLogger.log

    def failing(self, record):
        if record["step"] == 2:
            self.handle = FailingFile(FAILURES[failure])
        return log(self, record)

    monkeypatch.setattr(metrics.MetricsLogger, "log", failing)
    code = main(["pretrain", str(recipe_file(prepared, tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert f"{tmp_path / 'run' / 'metrics.jsonl'}: could not be written" in err.splitlines()[-1]
    assert "records before step 2" in err.splitlines()[-1]


class FailingFile:
    def __init__(self, failure):
        self.failure = failure

    def write(self, text):
        raise self.failure()

    def flush(self):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_report_refused_mid_plot(prepared, tmp_path, monkeypatch, capsys, failure):
    from matplotlib.figure import Figure

    assert main(["pretrain", str(recipe_file(prepared, tmp_path))]) == 0
    run = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()

    def savefig(self, path, *args, **kwargs):
        Path(path).write_bytes(b"\x89PNG half")  # what a short write leaves
        raise FAILURES[failure]()

    monkeypatch.setattr(Figure, "savefig", savefig)
    code = main(["report", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "loss.png: could not be written" in err and "untouched" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # no half plot, no temp file


def test_any_command_turns_a_refused_write_it_did_not_expect_into_one_line(monkeypatch, capsys):
    """The CLI's net under every command: a write refused somewhere spanlm did not wrap it is still one line."""
    from spanlm import cli

    def recipes_list(args):
        raise RuntimeError(SHORT_WRITE)

    monkeypatch.setattr(cli, "_recipes_list", recipes_list)
    code = main(["recipes", "list"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("spanlm recipes: error: a write failed (the device took fewer bytes"), err
    assert "Traceback" not in err and json.dumps(err)  # one line
