"""Run logging: time fields in metrics.jsonl, `logging.report_to` trackers (TensorBoard, W&B offline,
MLflow on a local SQLite store) against the real libraries, resume, failures, and docs/pretrain.md's Loggers
commands."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch

from helpers import REPO, TINY_RUN, doc_section
from spanlm.cli import main
from spanlm.config import load_config, save_config
from spanlm.errors import ConfigError, SpanlmError
from spanlm.pretrain.recipe import load_recipe
from spanlm.pretrain.run import pretrain
from spanlm.report import PLOTS, compare_runs, write_report
from spanlm.train import checkpoint as ckpt
from spanlm.train.metrics import MetricsLogger, read_metrics
from toy_objective import toy_recipe

QUIET = {"log": lambda *_: None}


def tracked_recipe(prepared: Path, output_dir: Path, report_to: list[str] | None, project: str | None = None, **train):
    recipe = toy_recipe(prepared, output_dir, eval_every=2, save_every=2, **train)
    recipe.logging.report_to = report_to
    recipe.logging.project = project
    return recipe


def by_kind(run_dir: Path, kind: str, key: str = "loss") -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run_dir) if r["kind"] == kind}


# -- metrics.jsonl --------------------------------------------------------------------------------------
def test_every_record_has_its_time_and_elapsed_seconds_which_a_resume_continues(prepared, tmp_path):
    before = datetime.now(timezone.utc)
    run = pretrain(tracked_recipe(prepared, tmp_path / "run", [], max_steps=4), **QUIET)
    records = read_metrics(run)
    assert [(r["kind"], r["step"]) for r in records] == [
        ("train", 1),
        ("train", 2),
        ("eval", 2),
        ("train", 3),
        ("train", 4),
        ("eval", 4),
    ]
    times = [datetime.fromisoformat(r["time"]) for r in records]
    assert all(t.utcoffset().total_seconds() == 0 and before <= t <= datetime.now(timezone.utc) for t in times)
    elapsed = [r["elapsed"] for r in records]
    assert (
        elapsed == sorted(elapsed)
        and 0 < elapsed[0]
        and elapsed[-1] < (datetime.now(timezone.utc) - before).total_seconds()
    )
    state_path = ckpt.step_dir(run, 2) / "trainer_state.pt"
    state = torch.load(state_path, weights_only=True)
    assert state["elapsed"] >= by_kind(run, "eval", "elapsed")[2] - 5e-4  # records round to the millisecond

    # A resume counts on from its checkpoint's seconds (here made large, so a restart from 0 would show).
    torch.save({**state, "elapsed": 1000.0}, state_path)
    resumed = pretrain(
        tracked_recipe(prepared, tmp_path / "resumed", [], max_steps=4), resume=str(ckpt.step_dir(run, 2)), **QUIET
    )
    assert all(1000.0 < r["elapsed"] < 1000.0 + 300 for r in read_metrics(resumed))

    # report and compare read the new fields: shown in the final table, never plotted as a metric
    summary = json.loads((write_report(run).parent / "summary.json").read_text())
    assert summary["train"]["time"] == records[-2]["time"] and summary["eval"]["elapsed"] == records[-1]["elapsed"]
    assert not any(wanted(key) for _, wanted, _ in PLOTS.values() for key in ("time", "elapsed", "step", "kind"))
    assert compare_runs([run, resumed], ["loss"], tmp_path / "compare.png").stat().st_size > 1000


# -- report_to: configuration and missing packages -----------------------------------------------------
def test_report_to_is_a_list_of_known_trackers_each_named_once():
    from spanlm.pretrain.recipe import Recipe

    assert load_recipe(None, ["logging.report_to=[tensorboard,wandb,mlflow]"]).logging.report_to == [
        "tensorboard",
        "wandb",
        "mlflow",
    ]
    assert load_recipe(None, ["logging.report_to=[]"]).logging.report_to == []
    assert Recipe().logging.report_to is None
    with pytest.raises(
        ConfigError, match=r"logging.report_to\[0\]' must be one of 'tensorboard' \| 'wandb' \| 'mlflow', got 'neptune'"
    ):
        load_recipe(None, ["logging.report_to=[neptune]"])
    with pytest.raises(ConfigError, match="report_to names wandb twice"):
        load_recipe(None, ["logging.report_to=[wandb,wandb]"])
    with pytest.raises(ConfigError, match="logging.report_to' must be a list"):
        load_recipe(None, ["logging.report_to=wandb"])


def test_recipes_saved_with_the_older_tensorboard_switch_still_load(tmp_path):
    from spanlm.ner.config import NerRecipe

    saved = tmp_path / "recipe.yaml"  # as runs, exports and NER / QA model directories saved it before report_to
    saved.write_text("logging: {tensorboard: false, progress: false}\n", encoding="utf-8")
    assert load_config(saved, cls=NerRecipe).logging.report_to == []
    saved.write_text("logging: {tensorboard: true}\n", encoding="utf-8")
    assert load_recipe(saved).logging.report_to is None  # TensorBoard when installed, as it was
    assert load_recipe(saved, ["logging.report_to=[wandb]"]).logging.report_to == ["wandb"]


def test_tensorboard_by_default_is_skipped_when_not_installed_but_named_it_is_required(prepared, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an install without the extra sees
    run = pretrain(tracked_recipe(prepared, tmp_path / "default", None, max_steps=2), **QUIET)
    assert len(by_kind(run, "train")) == 2 and not (run / "tensorboard").exists()
    with pytest.raises(
        ConfigError,
        match=r"^logging.report_to names tensorboard, which is not installed: pip install 'spanlm\[tensorboard\]'$",
    ):
        pretrain(tracked_recipe(prepared, tmp_path / "named", ["tensorboard"], max_steps=2), **QUIET)
    assert not (tmp_path / "named").exists()


def test_a_named_tracker_not_installed_is_one_line_exit_2_and_the_run_is_kept(prepared, tmp_path, monkeypatch, capsys):
    recipe_path = tmp_path / "recipe.yaml"
    save_config(tracked_recipe(prepared, tmp_path / "run", [], max_steps=2), recipe_path)
    assert main(["pretrain", str(recipe_path)]) == 0
    kept = {name: (tmp_path / "run" / name).read_bytes() for name in ("metrics.jsonl", "config.yaml")}
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert (
        main(["pretrain", str(recipe_path), "train.max_steps=4", "logging.report_to=[wandb]", "--resume", "auto"]) == 2
    )
    err = capsys.readouterr().err
    assert (
        err == "spanlm pretrain: error: logging.report_to names wandb, which is not installed: "
        "pip install 'spanlm[wandb]'\n"
    )
    assert {name: (tmp_path / "run" / name).read_bytes() for name in kept} == kept
    assert ckpt.latest_checkpoint(tmp_path / "run") == ckpt.step_dir(tmp_path / "run", 2)


# -- TensorBoard ---------------------------------------------------------------------------------------
def test_tensorboard_gets_the_scalars_and_the_recipe_as_hparams_and_text(prepared, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    run = pretrain(tracked_recipe(prepared, tmp_path / "run", ["tensorboard"], max_steps=4), **QUIET)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/grad_norm", "eval/loss", "eval/mlm_accuracy"} <= set(scalars)
    assert not any(tag.endswith(("/elapsed", "/time", "/step")) for tag in scalars)
    logged = {e.step: e.value for e in events.Scalars("train/loss")}
    assert logged == pytest.approx(by_kind(run, "train"))
    assert {e.step for e in events.Scalars("eval/loss")} == {2, 4}

    start = HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["train.lr"].number_value == pytest.approx(0.01)
    assert start.hparams["train.max_steps"].number_value == 4
    assert start.hparams["objective.name"].string_value == "toy"
    assert start.hparams["train.betas"].string_value == "[0.9, 0.999]"
    text = events.Tensors("recipe/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "    objective:\n      name: toy" in text and "max_steps: 4" in text


# -- Weights & Biases (offline) -----------------------------------------------------------------------
def wandb_records(run_dir: Path) -> list[dict]:
    """The records of an offline W&B run directory, read by wandb's own reader of its .wandb log."""
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_wandb_offline_run_holds_the_metrics_and_config_and_a_resume_continues_it(prepared, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-files"))
    monkeypatch.setenv("WANDB_PROJECT", "overridden-by-the-recipe")
    run = pretrain(tracked_recipe(prepared, tmp_path / "run", ["wandb"], project="spanlm-tests", max_steps=4), **QUIET)
    pretrain(
        tracked_recipe(prepared, tmp_path / "run", ["wandb"], project="spanlm-tests", max_steps=6),
        resume="auto",
        **QUIET,
    )

    run_id = json.loads((run / "trackers.json").read_text())["wandb"]
    parts = sorted((tmp_path / "wandb-files" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(parts) == 2 and not (run / "wandb").exists()  # one directory per start, both of the same run
    history, starts = [], []
    for part in parts:
        records = wandb_records(part)
        starts += [r["run"] for r in records if r["type"] == "run"]
        history += [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [s["run_id"] for s in starts] == [run_id, run_id] and starts[1].get("resume") is True
    assert {s["project"] for s in starts} == {"spanlm-tests"} and {s["display_name"] for s in starts} == {"run"}
    configs = [s["config"]["update"] for s in starts]
    assert configs[0]["train"]["lr"] == 0.01 and configs[0]["objective"]["name"] == "toy"
    assert [c["train"]["max_steps"] for c in configs] == [4, 6]
    for kind in ("train", "eval"):
        logged = {item["step"]: item[f"{kind}/loss"] for item in history if f"{kind}/loss" in item}
        assert logged == pytest.approx(by_kind(run, kind)) and sorted(logged) == (
            [1, 2, 3, 4, 5, 6] if kind == "train" else [2, 4, 6]
        )
    assert not any("train/elapsed" in item for item in history)


# -- MLflow (local SQLite store) -----------------------------------------------------------------------
@pytest.fixture()
def mlflow_store(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def test_mlflow_run_holds_metrics_with_steps_and_params_and_a_resume_continues_it(
    prepared, tmp_path, monkeypatch, mlflow_store
):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "spanlm-tests")
    lines = []
    run = pretrain(tracked_recipe(prepared, tmp_path / "run", ["mlflow"], max_steps=4), log=lines.append)
    pretrain(tracked_recipe(prepared, tmp_path / "run", ["mlflow"], max_steps=6), resume="auto", log=lines.append)

    client = MlflowClient(mlflow_store)
    experiment = client.get_experiment_by_name("spanlm-tests")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_id == json.loads((run / "trackers.json").read_text())["mlflow"]
    assert found.info.run_name == "run" and found.info.status == "FINISHED"
    for kind, steps in (("train", [1, 2, 3, 4, 5, 6]), ("eval", [2, 4, 6])):
        logged = {m.step: m.value for m in client.get_metric_history(found.info.run_id, f"{kind}/loss")}
        assert sorted(logged) == steps and logged == pytest.approx(by_kind(run, kind))
    assert "train/elapsed" not in found.data.metrics
    params = found.data.params
    assert params["train.lr"] == "0.01" and params["objective.name"] == "toy" and params["data.max_len"] == "32"
    assert params["train.betas"] == "[0.9, 0.999]" and params["model.path"] == "null"
    assert params["train.max_steps"] == "4"  # MLflow keeps a param's first value; the change is named
    assert any("train.max_steps" in line and "earlier" in line for line in lines)


def test_a_tracker_that_cannot_start_stops_the_resume_with_one_line_and_loses_nothing(prepared, tmp_path, monkeypatch):
    run = pretrain(tracked_recipe(prepared, tmp_path / "run", [], max_steps=2), **QUIET)
    kept = {path.name: path.read_bytes() for path in (run / "metrics.jsonl", run / "config.yaml")}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nowhere://tracking")
    with pytest.raises(SpanlmError, match=r"^logging.report_to: mlflow could not start \(\w+: .*nowhere") as error:
        pretrain(tracked_recipe(prepared, run, ["mlflow"], max_steps=4), resume="auto", **QUIET)
    assert "\n" not in str(error.value)
    assert {name: (run / name).read_bytes() for name in kept} == kept and not (run / "trackers.json").exists()


@pytest.mark.slow
def test_a_tracker_failing_mid_run_is_switched_off_and_metrics_jsonl_goes_on(prepared, tmp_path, mlflow_store):
    from mlflow import MlflowClient

    recipe = tracked_recipe(prepared, tmp_path / "run", ["mlflow"])
    (tmp_path / "run").mkdir()
    lines = []
    with MetricsLogger(tmp_path / "run", None, recipe, ["mlflow"], lines.append) as logger:
        logger.log({"kind": "train", "step": 1, "loss": 2.0})
        run_id = logger.trackers["mlflow"].run_id
        MlflowClient(mlflow_store).delete_run(run_id)  # the store now refuses this run's metrics
        logger.log({"kind": "train", "step": 2, "loss": 1.5})
        logger.log({"kind": "train", "step": 3, "loss": 1.0})
    assert by_kind(tmp_path / "run", "train") == {1: 2.0, 2: 1.5, 3: 1.0}
    assert len(lines) == 1 and lines[0].startswith("logging: mlflow failed at step 2 (")
    assert [m.step for m in MlflowClient(mlflow_store).get_metric_history(run_id, "train/loss")] == [1]

    # A resume whose MLflow run is gone starts a new one, says so, and remembers it.
    with MetricsLogger(tmp_path / "run", 3, recipe, ["mlflow"], lines.append) as logger:
        logger.log({"kind": "train", "step": 4, "loss": 0.5})
    new_id = json.loads((tmp_path / "run" / "trackers.json").read_text())["mlflow"]
    assert new_id != run_id and f"mlflow: run {run_id} of " in lines[1] and lines[1].endswith("starting a new run")
    assert [m.step for m in MlflowClient(mlflow_store).get_metric_history(new_id, "train/loss")] == [4]
    assert by_kind(tmp_path / "run", "train") == {1: 2.0, 2: 1.5, 3: 1.0, 4: 0.5}


# -- docs -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_documented_loggers_commands_run(tmp_path, monkeypatch):
    """Each line of the Loggers section's bash block runs as written (tiny), in a directory like a checkout."""
    from mlflow import MlflowClient

    (block,) = doc_section("docs/pretrain.md", "Loggers", language="bash")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(REPO / "data")
    (tmp_path / "configs").symlink_to(REPO / "configs")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    commands = [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()]
    commands = [words for words in commands if words]
    assert commands
    for words in commands:
        with monkeypatch.context() as env:
            while "=" in words[0]:
                name, value = words.pop(0).split("=", 1)
                env.setenv(name, value)
            assert words[0] == "spanlm" and main([*words[1:], *TINY_RUN, "train.eval_every=2"]) == 0, words
    run = tmp_path / "runs/pretrain/spanbert"
    assert (run / "tensorboard").is_dir() and list((run / "wandb").glob("offline-run-*"))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("spanbert-tiny").experiment_id])
    assert [m.step for m in client.get_metric_history(found.info.run_id, "eval/loss")] == [
        2
    ]  # train.log_every is 10: step 2 is the last


@pytest.mark.parametrize("line", ["[1, 2]", "5", '{"kind": "train", "loss": 1.0}', '{"kind": "train", "step": true}'])
def test_a_line_that_is_json_but_no_record_is_named(tmp_path, line):
    """A line that parses but is not a record (a list, a number, no step) is one line naming it, as a broken line is
    — not an AttributeError in `spanlm report` or a resume."""
    from spanlm.errors import InputError
    from spanlm.train.metrics import read_metrics

    (tmp_path / "metrics.jsonl").write_text(f'{line}\n{{"kind": "train", "step": 1, "loss": 1.0}}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"metrics.jsonl:1: not a metrics record"):
        read_metrics(tmp_path)


def test_compare_draws_one_curve_per_run_when_runs_share_a_name(tmp_path):
    from spanlm.report import run_labels

    for seed, losses in ((0, [5.0, 4.0]), (1, [1.0, 0.5])):
        run = tmp_path / f"seed{seed}" / "run"
        run.mkdir(parents=True)
        records = [{"kind": "eval", "step": step, "loss": loss} for step, loss in enumerate(losses, 1)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    runs = [tmp_path / "seed0" / "run", tmp_path / "seed1" / "run", tmp_path / "seed1"]
    assert run_labels(runs) == ["seed0/run", "seed1/run", "seed1"]
    figure = compare_runs(runs[:2], ["loss"], tmp_path / "compare.png")
    assert figure.stat().st_size > 1000
