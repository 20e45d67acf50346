"""kill -9 during checkpoint saves and rotations: the latest complete checkpoint is whole and holds
exactly what was saved, a resume from it is bit-exact, and a restart leaves no temporary directory."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import kill_saver
import pytest
import torch
from safetensors.torch import load_file

from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from toy_objective import losses, toy_recipe

pytestmark = pytest.mark.slow  # processes killed mid-write

SAVER = Path(kill_saver.__file__)


def kill_during_saves(run: Path, trials: int, seed: int) -> None:
    rng, latest_step = random.Random(seed), 0
    server = subprocess.Popen([sys.executable, str(SAVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for trial in range(trials):
            (run / "checkpoints").mkdir(parents=True, exist_ok=True)
            server.stdin.write(f"{run}\n")
            server.stdin.flush()
            word, pid = server.stdout.readline().split()
            assert word == "ready"
            time.sleep(rng.uniform(0.0, 0.3))  # a few saves and rotations in, then killed at a random point of one
            os.kill(int(pid), signal.SIGKILL)
            assert server.stdout.readline().strip() == "reaped"
            latest_step = check_restart(run, trial, latest_step)
    finally:
        server.kill()
        server.wait()
    assert latest_step > 0  # the kills did land among saves


def check_restart(run: Path, trial: int, latest_before: int) -> int:
    """Checks the run as a restart finds it; returns the step of its latest checkpoint (0: none yet)."""
    ckpt.remove_leftovers(run)  # what the restart does first
    left = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert all(ckpt.STEP_DIR.match(name) and (run / "checkpoints" / name / ckpt.MARKER).is_file() for name in left), (
        trial,
        left,
    )
    complete = ckpt.complete_checkpoints(run)
    if not complete:  # killed before its first save completed: allowed only while none ever did
        assert latest_before == 0, trial
        return 0
    latest = complete[-1]
    assert ckpt.step_of(latest) >= latest_before, trial  # no complete checkpoint is ever lost to a later kill
    # Every checkpoint marked complete is whole, the older ones a rotation was deleting included.
    assert all(ckpt.missing_parts(p) is None for p in complete), (
        trial,
        [(p.name, ckpt.missing_parts(p)) for p in complete],
    )
    assert ckpt.latest_checkpoint(run) == latest
    saved = load_file(str(latest / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in kill_saver.expected(ckpt.step_of(latest)).items()), trial
    assert torch.load(latest / "trainer_state.pt", weights_only=True) == {"step": ckpt.step_of(latest)}
    return ckpt.step_of(latest)


def test_ten_kills_during_saves_and_rotations(tmp_path):
    kill_during_saves(tmp_path / "run", trials=10, seed=0)


@pytest.mark.slow
def test_fifty_kills_during_saves_and_rotations(tmp_path):
    kill_during_saves(tmp_path / "run", trials=50, seed=1)


def test_a_rotation_killed_midway_leaves_no_checkpoint_marked_complete_but_half_deleted(tmp_path):
    run = tmp_path / "run"
    for step in (1, 2):
        ckpt.write_checkpoint(run, step, kill_saver.files(step), keep_last=2)
    # What remove_checkpoint leaves when killed after unmarking: an unmarked directory, passed over and removed.
    oldest = ckpt.step_dir(run, 1)
    (oldest / ckpt.MARKER).unlink()
    (oldest / "model.safetensors").unlink()
    (run / "checkpoints" / f".step-0000003.tmp-{2**22 + 1}").mkdir()  # a save killed midway (no such process)
    assert ckpt.complete_checkpoints(run) == [ckpt.step_dir(run, 2)]
    messages = []
    ckpt.remove_leftovers(run, messages.append)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000002"]
    assert len(messages) == 2 and all("left by a save or rotation that was killed" in m for m in messages)


def test_a_live_process_s_temporary_directory_is_kept(tmp_path):
    run = tmp_path / "run"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tmp = run / "checkpoints" / f".step-0000001.tmp-{live.pid}"
        tmp.mkdir(parents=True)
        ckpt.remove_leftovers(run)
        assert tmp.is_dir()
    finally:
        live.kill()
        live.wait()
    ckpt.remove_leftovers(run)
    assert not tmp.exists()


def test_a_training_run_killed_mid_run_resumes_bit_exact(prepared, tmp_path):
    # A constant schedule (after warm-up): the killed run's open-ended max_steps gives the reference's learning rates.
    reference = pretrain(
        toy_recipe(prepared, tmp_path / "reference", max_steps=20, save_every=1, keep_last=2, schedule="constant"),
        log=lambda *_: None,
    )
    run = tmp_path / "run"
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; from toy_objective import toy_recipe; "
        "from spanlm.pretrain.run import pretrain; "
        "pretrain(toy_recipe(Path(sys.argv[2]), Path(sys.argv[3]), max_steps=10**6, save_every=1, keep_last=2, "
        "schedule='constant'), log=print)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(SAVER.parent), str(prepared), str(run)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # the kernels the reference built: the same arithmetic
    try:
        deadline = time.monotonic() + 120
        while ckpt.step_of(ckpt.latest_checkpoint(run) or Path("none")) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None and ckpt.step_of(latest) < 20
    resumed = pretrain(
        toy_recipe(prepared, run, max_steps=20, save_every=1, keep_last=2, schedule="constant"),
        resume="auto",
        log=lambda *_: None,
    )
    assert not [p for p in (run / "checkpoints").iterdir() if not ckpt.STEP_DIR.match(p.name)]
    ours = load_file(str(ckpt.step_dir(resumed, 20) / "model.safetensors"))
    theirs = load_file(str(ckpt.step_dir(reference, 20) / "model.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    after = losses(run)
    assert {s: after[s] for s in range(ckpt.step_of(latest) + 1, 21)} == {
        s: losses(reference)[s] for s in range(ckpt.step_of(latest) + 1, 21)
    }
