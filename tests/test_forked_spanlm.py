"""The forked ``spanlm`` the study tests run their scripts with (forked_spanlm): a command forked from the server
reads the caller's working directory, environment and descriptors, exits with the command's code, passes a
signal on, and a command whose import-time environment differs runs as a fresh interpreter."""

from __future__ import annotations

import signal
import subprocess
import time

import yaml

from helpers import EMBEDDED_INPUTS, REPO
from spanlm.evaluate import launch


def spanlm(environment: dict, *argv: str, cwd=None, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        [environment["SPANLM"], *argv],
        capture_output=True,
        text=True,
        env={**environment, **extra},
        cwd=cwd,
        timeout=300,
    )


def test_a_forked_command_writes_where_its_caller_stands_and_prints_to_its_caller(study_environment, tmp_path):
    listed = spanlm(study_environment, "recipes", "list")
    assert listed.returncode == 0, listed.stderr
    assert "pretrain/spanbert" in listed.stdout
    copied = spanlm(study_environment, "recipes", "copy", "pretrain/mlm", "mine.yaml", cwd=tmp_path)
    assert copied.returncode == 0, copied.stderr
    assert yaml.safe_load((tmp_path / "mine.yaml").read_text(encoding="utf-8"))["objective"]["name"] == "mlm"


def test_a_forked_command_exits_with_its_code_and_its_one_line_error(study_environment, tmp_path):
    failed = spanlm(study_environment, "pretrain", str(tmp_path / "missing.yaml"))
    assert failed.returncode == 2
    assert "missing.yaml" in failed.stderr and "Traceback" not in failed.stderr


def test_a_changed_import_time_variable_runs_a_fresh_interpreter(study_environment):
    assert launch.forkable(study_environment, study_environment)
    assert not launch.forkable({**study_environment, "HF_HUB_OFFLINE": "1"}, study_environment)
    assert launch.forkable({**study_environment, "STEPS": "4"}, study_environment)
    listed = spanlm(study_environment, "recipes", "list", HF_HUB_OFFLINE="1")
    assert listed.returncode == 0 and "pretrain/spanbert" in listed.stdout, listed.stderr


def test_sigterm_to_the_client_reaches_the_forked_run_which_saves(study_environment, embedded_prepared, tmp_path):
    run = tmp_path / "run"
    command = [study_environment["SPANLM"], "pretrain", str(REPO / "configs" / "pretrain" / "mlm.yaml")]
    command += [f"data.inputs={EMBEDDED_INPUTS}", f"data.prepared_dir={embedded_prepared}", "data.max_len=24"]
    command += ["tokenizer.vocab_size=2000", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2"]
    command += ["model.intermediate_size=64", "model.max_position_embeddings=32", "train.max_steps=100000"]
    command += ["train.batch_size=4", "train.eval_every=0", "train.save_every=100000", "train.num_workers=0"]
    command += [f"train.output_dir={run}", "logging.report_to=[]", "logging.progress=false", "train.log_every=1"]
    process = subprocess.Popen(
        command, env=study_environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").stat().st_size):
        assert process.poll() is None, process.communicate()[1]
        assert time.time() < deadline, "the run did not start"
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "received SIGTERM" in err and "saved step" in err, err
