"""SIGTERM / SIGINT to a run's whole process group (Slurm's scancel, `timeout`, `docker stop`, Ctrl-C): the
DataLoader workers leave the stop to the main process, which finishes the step, saves a complete checkpoint
and exits 0; the run then resumes, and no worker outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import REPO, write_wnut_recipe
from spanlm.config import save_config
from spanlm.train import checkpoint as ckpt
from spanlm.train.metrics import read_metrics
from toy_objective import toy_recipe

pytestmark = pytest.mark.slow  # training runs in subprocesses, signalled

LAUNCH = REPO / "tests" / "launch_toy.py"


def start_in_new_group(args: list[str], **env) -> subprocess.Popen:
    """`spanlm ARGS…` (the toy objective registered) as the leader of a new process group, as a job scheduler
    starts it."""
    path = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, str(LAUNCH), *args],
        env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, process: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.time() + seconds
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before the signal: {process.communicate()[1]}")
        assert time.time() < deadline, "the run did not get far enough to be signalled"
        time.sleep(0.05)


def train_records(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    return metrics.exists() and sum(1 for r in read_metrics(run) if r["kind"] == "train")


def group_members(group: int) -> list[int]:
    """The live processes of a process group (zombies excluded)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:  # state, ppid, pgrp
            members.append(int(stat.parent.name))
    return members


def signal_group_and_finish(process: subprocess.Popen, sig: signal.Signals, stdout: list | None = None) -> str:
    """Signals the whole group, as `kill -- -PGID` does; returns the run's stderr (its stdout appended to
    ``stdout``) after checking it saved and exited 0, leaving no process of the group behind."""
    os.killpg(process.pid, sig)
    out, err = process.communicate(timeout=180)
    if stdout is not None:
        stdout.append(out)
    assert process.returncode == 0, err
    assert "Traceback" not in err and f"received {sig.name}" in err, err
    deadline = time.time() + 30
    while group_members(process.pid) and time.time() < deadline:  # the workers end once the main process has
        time.sleep(0.1)
    assert not group_members(process.pid), "DataLoader workers outlived the run"
    return err


def stopped_before_its_end(run: Path, out: str, err: str) -> int:
    """A fine-tuning run stopped by a signal saved its step and exited at once: no model/ exported, no dev scores
    (a cut-short run's would pass for the recipe's); it says how to finish. Returns the step saved."""
    step = saved_step(run, err)
    assert not (run / "model").exists() and not (run / "eval.json").exists()
    assert "--resume auto finishes the run" in err
    assert json.loads(out.strip().splitlines()[-1]) == {"run_dir": str(run), "stopped": "SIGTERM", "step": step}
    return step


def saved_step(run: Path, err: str) -> int:
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None and ckpt.missing_parts(latest) is None
    step = torch.load(latest / "trainer_state.pt", weights_only=True)["step"]
    assert f"saved step {step}" in err
    return step


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_group_saves_and_the_run_resumes(prepared, tmp_path, sig):
    run = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    save_config(toy_recipe(prepared, run, max_steps=100000, num_workers=2), recipe)
    process = start_in_new_group(["pretrain", str(recipe)])
    wait_for(lambda: train_records(run) >= 3, process)
    step = saved_step(run, signal_group_and_finish(process, sig))
    assert step >= 3
    saved = ckpt.latest_checkpoint(run)

    resumed = subprocess.run(
        [sys.executable, str(LAUNCH), "pretrain", str(recipe), f"train.max_steps={step + 2}", "--resume", "auto"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {saved} at step {step}" in resumed.stderr
    assert torch.load(ckpt.latest_checkpoint(run) / "trainer_state.pt", weights_only=True)["step"] == step + 2


def test_a_signal_during_evaluation_still_saves(prepared, tmp_path):
    """The toy objective marks its first evaluation forward and then evaluates slowly: the signal lands there."""
    run, marker = tmp_path / "run", tmp_path / "evaluating"
    recipe = tmp_path / "recipe.yaml"
    save_config(toy_recipe(prepared, run, max_steps=100000, num_workers=2, eval_every=2, eval_blocks=64), recipe)
    process = start_in_new_group(["pretrain", str(recipe)], TOY_EVAL_MARK=str(marker))
    wait_for(marker.exists, process)
    step = saved_step(run, signal_group_and_finish(process, signal.SIGTERM))
    assert step >= 2


def test_a_signal_to_the_group_saves_a_ner_run(tiny_encoder_dir, tmp_path):
    run = tmp_path / "ner"
    recipe = write_wnut_recipe(tiny_encoder_dir, run, steps=100000)
    text = (
        recipe.read_text(encoding="utf-8")
        .replace("num_workers: 0", "num_workers: 2")
        .replace("log_every: 3", "log_every: 1")
    )
    recipe.write_text(text, encoding="utf-8")
    process = start_in_new_group(["ner", "train", str(recipe)])
    wait_for(lambda: train_records(run) >= 2, process, seconds=300)
    out: list[str] = []
    err = signal_group_and_finish(process, signal.SIGTERM, out)
    assert stopped_before_its_end(run, out[0], err) >= 2


@pytest.fixture
def a_signal_outside_the_loop_raises():
    """While the test runs, SIGTERM outside the loop's own handling raises, as it would end a real process."""

    def outside(signum, frame):
        raise RuntimeError("SIGTERM reached the process outside the loop's stop handling")

    previous = signal.signal(signal.SIGTERM, outside)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_signal_during_the_first_evaluation_saves_after_one_step(
    prepared, tmp_path, monkeypatch, a_signal_outside_the_loop_raises
):
    from spanlm.pretrain.run import pretrain
    from spanlm.train.loop import Trainer

    evaluate = Trainer.evaluate

    def signalled_evaluation(self):
        os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(self)

    monkeypatch.setattr(Trainer, "evaluate", signalled_evaluation)
    lines = []
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=1000, eval_at_start=True), log=lines.append)
    assert ckpt.step_of(ckpt.latest_checkpoint(run)) == 1 and "received SIGTERM: saved step 1, exiting" in lines


def test_a_stop_between_records_logs_the_steps_since_the_last_one(
    prepared, tmp_path, monkeypatch, a_signal_outside_the_loop_raises
):
    """A stop mid-window writes that window's record at the step it saves: the resumed run's records then cover
    every step once (no loss or gradient norm of the steps before the stop goes unlogged)."""
    from spanlm.pretrain.run import pretrain
    from spanlm.train.loop import Trainer

    reference = pretrain(toy_recipe(prepared, tmp_path / "reference", max_steps=3, log_every=1), log=lambda *_: None)
    losses = [r["loss"] for r in read_metrics(reference) if r["kind"] == "train"]
    step = Trainer._step

    def signalled_step(self, *args):
        if self.step == 2:  # during step 3
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self, *args)

    monkeypatch.setattr(Trainer, "_step", signalled_step)
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=1000, log_every=5), log=lambda *_: None)
    assert ckpt.step_of(ckpt.latest_checkpoint(run)) == 3
    (record,) = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert record["step"] == 3 and record["loss"] == pytest.approx(sum(losses) / 3, rel=1e-5)


def test_a_signal_during_the_last_save_lets_it_complete(
    prepared, tmp_path, monkeypatch, a_signal_outside_the_loop_raises
):
    from spanlm.pretrain.run import pretrain
    from spanlm.train import loop

    save_config = loop.save_config

    def signalled_save(config, path):
        if path.name == "config.yaml" and path.parent.name.startswith(".step"):  # inside a checkpoint being written
            os.kill(os.getpid(), signal.SIGTERM)
        return save_config(config, path)

    monkeypatch.setattr(loop, "save_config", signalled_save)
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), log=lambda *_: None)
    latest = ckpt.latest_checkpoint(run)
    assert ckpt.step_of(latest) == 2 and ckpt.missing_parts(latest) is None


@pytest.mark.slow
def test_a_signal_to_a_torchrun_group_saves_every_rank(prepared, tmp_path):
    """torchrun, its two ranks and their workers get SIGTERM together: the ranks stop at the same step and save
    (torchrun itself then exits 1 with its own traceback, by its rule for a signalled agent)."""
    run = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    save_config(toy_recipe(prepared, run, max_steps=100000, num_workers=2), recipe)
    path = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + [str(LAUNCH), "pretrain", str(recipe)],
        env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for(lambda: train_records(run) >= 3, process)
    os.killpg(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=180)
    assert "DataLoader worker" not in err and "received SIGTERM: saved step" in err, err[-3000:]
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None and ckpt.missing_parts(latest) is None
    state = torch.load(latest / "trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and state["step"] >= 3 and len(state["loaders"]) == 2
    deadline = time.time() + 30
    while group_members(process.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not group_members(process.pid)


def test_a_signal_to_the_group_saves_a_qa_run(tiny_encoder_dir, tmp_path):
    import yaml

    run = tmp_path / "qa"
    recipe = tmp_path / "qa.yaml"
    squad = REPO / "tests" / "fixtures" / "qa" / "squad_v2_sample.json"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(tiny_encoder_dir)},
                "data": {
                    "train": str(squad),
                    "dev": str(squad),
                    "max_length": 48,
                    "doc_stride": 16,
                    "max_query_length": 16,
                },
                "qa": {"metric": "squad", "no_answer": True},
                "train": {
                    "output_dir": str(run),
                    "max_steps": 100000,
                    "batch_size": 4,
                    "eval_every": 0,
                    "save_every": 100000,
                    "log_every": 1,
                    "num_workers": 2,
                    "device": "cpu",
                },
                "logging": {"report_to": [], "progress": False},
            }
        ),
        encoding="utf-8",
    )
    process = start_in_new_group(["qa", "train", str(recipe)])
    wait_for(lambda: train_records(run) >= 2, process, seconds=300)
    out: list[str] = []
    err = signal_group_and_finish(process, signal.SIGTERM, out)
    assert stopped_before_its_end(run, out[0], err) >= 2  # its dev set is not scored after the signal
