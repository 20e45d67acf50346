"""The training engine: bit-exact resume, data position, atomic checkpoints, signals, NaN guard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import toy_objective
from helpers import REPO, embedded_recipe
from spanlm.config import from_dict
from spanlm.data.blocks import BlockDataset
from spanlm.data.shards import PreparedCorpus
from spanlm.masking.base import MaskingConfig
from spanlm.pretrain.batches import build_train_loader, split_blocks
from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from spanlm.train.loop import TrainingHalted
from spanlm.train.metrics import read_metrics
from toy_objective import losses, toy_recipe

QUIET = {"log": lambda *_: None}


def batches_per_epoch(prepared: Path, batch_size: int) -> int:
    blocks = BlockDataset(PreparedCorpus(prepared), 32)
    train, _ = split_blocks(len(blocks), 8, 0)
    return len(train) // batch_size


def toy_loader(prepared: Path, config):
    """The training loader of the toy objective over the prepared corpus (rank 0 of 1, seed 0)."""
    corpus = PreparedCorpus(prepared)
    blocks = BlockDataset(corpus, 32)
    train, _ = split_blocks(len(blocks), 8, 0)
    return build_train_loader(
        blocks, train, toy_objective.ToyMasker(corpus.special_ids["mask"]), config, seed=0, rank=0, world_size=1
    )


def test_eval_blocks_are_held_out_and_fixed():
    train, held_out = split_blocks(1000, 64, seed=0)
    assert len(held_out) == 64 and not set(train[np.arange(len(train))].tolist()) & set(held_out.tolist())
    assert len(train) + len(held_out) == 1000
    assert (split_blocks(1000, 64, seed=0)[1] == held_out).all()


@pytest.mark.parametrize("where", ["mid_epoch", "epoch_edge"])
@pytest.mark.slow
def test_resume_is_bit_exact(prepared, tmp_path, where):
    """2N steps == N steps + resume + N steps: the same losses and `torch.equal` parameters."""
    batch_size = 64  # a few batches per epoch, so the epoch edge is reachable quickly
    per_epoch = batches_per_epoch(prepared, batch_size)
    n = 2 if where == "mid_epoch" else per_epoch
    assert where == "epoch_edge" or n < per_epoch
    full = pretrain(
        toy_recipe(prepared, tmp_path / "full", max_steps=2 * n, batch_size=batch_size, save_every=n), **QUIET
    )
    half = ckpt.step_dir(full, n)
    assert (half / ckpt.MARKER).is_file()
    # Resumed with DataLoader workers (the first run had none): the data position does not depend on them.
    resumed = pretrain(
        toy_recipe(prepared, tmp_path / "resumed", max_steps=2 * n, batch_size=batch_size, save_every=n, num_workers=1),
        resume=str(half),
        **QUIET,
    )
    assert {s: v for s, v in losses(full).items() if s > n} == losses(resumed)
    final_full = load_file(str(ckpt.step_dir(full, 2 * n) / "model.safetensors"))
    final_resumed = load_file(str(ckpt.step_dir(resumed, 2 * n) / "model.safetensors"))
    assert final_full.keys() == final_resumed.keys()
    assert all(torch.equal(final_full[k], final_resumed[k]) for k in final_full)


def test_resume_auto_continues_the_same_run(prepared, tmp_path):
    pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=4, save_every=2), **QUIET)
    reference = losses(tmp_path / "run")
    # the same run, longer: auto-resume from step 4, metrics.jsonl keeps steps 1..4 and appends
    pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=6, save_every=2), resume="auto", **QUIET)
    after = losses(tmp_path / "run")
    assert sorted(after) == [1, 2, 3, 4, 5, 6] and {s: after[s] for s in reference} == reference


def test_a_corpus_too_small_to_hold_out_says_it_evaluates_nothing(tmp_path):
    """Fewer than ten blocks hold none out: a run asked to evaluate says once that it will not (it was silent)."""
    text = tmp_path / "short.txt"
    text.write_text("Alice was beginning to get very tired of sitting by her sister on the bank.\n" * 12)
    data = {"inputs": [str(text)], "max_len": 64}
    recipe = toy_recipe(tmp_path / "prepared", tmp_path / "run", data=data, max_steps=2, eval_every=1, batch_size=2)
    recipe.tokenizer.vocab_size = 120
    lines = []
    pretrain(recipe, log=lines.append)
    said = [line for line in lines if "train.eval_every evaluates nothing" in line]
    assert len(said) == 1 and "hold out none" in said[0]
    assert not [r for r in read_metrics(tmp_path / "run") if r["kind"] == "eval"]


def test_a_refused_resume_measures_nothing_first(embedded_prepared, tmp_path, monkeypatch):
    """The device's peak is measured once the run is known to train: a resume refused for changed settings says so
    at once, not after a second of matmuls."""
    from spanlm.errors import InputError
    from spanlm.train import speed

    pretrain(embedded_recipe("mlm", embedded_prepared, tmp_path / "run", "train.max_steps=2"), **QUIET)
    measured = []
    monkeypatch.setattr(speed, "measure_peak_flops", lambda *args: measured.append(args) or 1e12)
    changed = embedded_recipe("mlm", embedded_prepared, tmp_path / "run", "train.max_steps=4", "seed=5")
    with pytest.raises(InputError, match="seed: 0 → 5"):
        pretrain(changed, resume="auto", **QUIET)
    assert measured == []
    pretrain(embedded_recipe("mlm", embedded_prepared, tmp_path / "run", "train.max_steps=4"), resume="auto", **QUIET)
    assert len(measured) == 1


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_a_longer_resume_says_how_it_moves_the_learning_rate(prepared, tmp_path, schedule):
    """Resuming with a larger train.max_steps stretches a decaying schedule from the resumed step on: the run says
    so in one line with the rate it now trains at; a schedule that the length does not change says nothing."""
    from spanlm.train.optim import lr_factor

    pretrain(
        toy_recipe(prepared, tmp_path / "run", max_steps=4, save_every=2, schedule=schedule, warmup_steps=0), **QUIET
    )
    lines = []
    longer = toy_recipe(prepared, tmp_path / "run", max_steps=8, save_every=2, schedule=schedule, warmup_steps=0)
    pretrain(longer, resume=str(ckpt.step_dir(tmp_path / "run", 2)), log=lines.append)
    said = [line for line in lines if line.startswith("train.max_steps 4 → 8")]
    if schedule == "constant":
        assert said == []
        return
    short = toy_recipe(prepared, tmp_path / "run", max_steps=4, schedule=schedule, warmup_steps=0).train
    now, before = (longer.train.lr * lr_factor(2, config) for config in (longer.train, short))
    assert now > before and said == [
        f"train.max_steps 4 → 8: the linear schedule now spans 8 steps, so the learning rate from step 3 is {now:.3g} "
        f"(it would have been {before:.3g}); for a schedule that a longer run does not change, use train.schedule: "
        "wsd and resume before its decay, or constant"
    ]


@pytest.mark.parametrize("workers, fresh_workers", [(0, 0), (2, 2), (2, 0), (0, 1)])
def test_a_restored_loader_yields_the_same_next_batches(prepared, workers, fresh_workers):
    # Any number of workers on either side: the state is the position of the next batch, and a batch
    # is a pure function of its key. Five batches are taken so that the position crosses an epoch edge.
    config = toy_recipe(prepared, Path("unused")).train
    config.num_workers = workers
    loader = toy_loader(prepared, config)
    per_epoch = loader.sampler.batches_per_epoch()
    iterator = iter(loader)
    for _ in range(per_epoch + 1):
        next(iterator)
    state = loader.state_dict()
    assert state == {"epoch": 1, "batch": 1}
    expected = [next(iterator) for _ in range(4)]
    config.num_workers = fresh_workers
    fresh = toy_loader(prepared, config)
    fresh.load_state_dict(state)
    got = [batch for batch, _ in zip(fresh, range(4))]
    for a, b in zip(expected, got):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_files_load_with_weights_only(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    latest = ckpt.latest_checkpoint(run)
    for name in ("optimizer.pt", "trainer_state.pt", "rng-rank0.pt"):
        torch.load(latest / name, weights_only=True)
    assert (latest / "config.yaml").is_file() and (run / "config.yaml").is_file()


def test_a_partial_checkpoint_is_ignored(prepared, tmp_path, monkeypatch):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    good = ckpt.latest_checkpoint(run)

    def killed(path):  # the process dies while writing the optimiser state
        raise KeyboardInterrupt

    original = ckpt.write_checkpoint

    def write_then_die(output_dir, step, files, keep_last):
        return original(output_dir, step, {**files, "optimizer.pt": killed}, keep_last)

    monkeypatch.setattr(ckpt, "write_checkpoint", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=4), resume="auto", **QUIET)
    assert ckpt.latest_checkpoint(run) == good
    # a renamed directory whose COMPLETE marker never got written does not count either
    (ckpt.step_dir(run, 9)).mkdir()
    assert ckpt.latest_checkpoint(run) == good
    assert ckpt.resolve_resume("auto", run) == good


def test_nonfinite_loss_halts_naming_the_step(prepared, tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_NAN_AFTER", "3")
    with pytest.raises(TrainingHalted, match="non-finite loss or gradient norm at step 4"):
        pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=8), **QUIET)


def test_nonfinite_skip_policy_skips_and_counts(prepared, tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_NAN_AFTER", "6")
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=8, nonfinite="skip"), **QUIET)
    records = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert records[-1]["skipped_steps"] == 2 and all(r["loss"] is not None for r in records[:6])


@pytest.mark.slow
def test_sigterm_saves_and_exits_zero(prepared, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    config = toy_recipe(prepared, tmp_path / "run", max_steps=100000)
    from spanlm.config import save_config

    save_config(config, recipe)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "launch_toy.py"), "pretrain", str(recipe)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    latest = ckpt.latest_checkpoint(tmp_path / "run")
    step = torch.load(latest / "trainer_state.pt", weights_only=True)["step"]
    assert step >= 3 and f"saved step {step}" in err
    assert json.loads(out.strip().splitlines()[-1])["run_dir"] == str(tmp_path / "run")


def test_a_new_run_never_overwrites_an_existing_one(prepared, tmp_path):
    from spanlm.errors import SpanlmError

    pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    with pytest.raises(SpanlmError, match="already holds a run.*--resume auto"):
        pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)


def test_options_bf16_lamb_cosine_accumulation(prepared, tmp_path):
    run = pretrain(
        toy_recipe(
            prepared,
            tmp_path / "run",
            max_steps=4,
            precision="bf16",
            optimizer="lamb",
            schedule="cosine",
            grad_accum=2,
            max_grad_norm=0.0,
            eval_every=2,
        ),
        **QUIET,
    )
    records = read_metrics(run)
    train = [r for r in records if r["kind"] == "train"]
    assert all(r["loss"] is not None and r["loss"] > 0 for r in train)
    assert train[-1]["lr"] == pytest.approx(0.0, abs=1e-12)  # cosine decays to 0 at max_steps
    assert [r["step"] for r in records if r["kind"] == "eval"] == [2, 4]


def test_precision_auto_is_fp32_on_the_cpu_said_first_and_recorded(prepared, tmp_path):
    from spanlm.config import read_yaml

    said = []
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=1), log=said.append)
    assert toy_recipe(prepared, tmp_path / "x").train.precision == "auto"  # the default
    assert read_yaml(run / "config.yaml")["train"]["precision"] == "fp32"  # what ran, for the resume check
    assert "precision: fp32 on cpu" in said
    # a run saved before auto (fp32 written out) resumes under the default
    pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), resume="auto", **QUIET)
    assert len(losses(run)) == 2


@pytest.mark.parametrize(
    "device, native_bf16, expected",
    [("cpu", True, "fp32"), ("cuda", True, "bf16"), ("cuda", False, "fp32")],
)
def test_precision_auto_takes_bf16_where_the_gpu_computes_it(monkeypatch, device, native_bf16, expected):
    from spanlm.train.speed import resolve_precision

    asked = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda **kw: asked.append(kw) or native_bf16)
    assert resolve_precision("auto", torch.device(device)) == expected
    assert all(kw == {"including_emulation": False} for kw in asked)  # an emulated bf16 is not taken
    assert resolve_precision("fp32", torch.device(device)) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"


def test_records_say_the_runs_speed_mfu_and_time_waiting_for_data(embedded_prepared, tmp_path, monkeypatch):
    """Each record's ``mfu`` is the model's FLOPs (6·N per token and the attention per block: between 6·N and
    6·N + 12·width·max_len per token) per second over the peak; ``data_wait`` the share of the window the loop
    waited for its batches: most of it behind a loader that takes 200 ms a batch (long beside a step even on a
    busy machine, where the quick run's own loader may keep it waiting a while)."""
    from helpers import EMBEDDED_MAX_LEN
    from spanlm.data.shards import PreparedCorpus
    from spanlm.models.flops import training_flops
    from spanlm.objectives import build_objective
    from spanlm.train import loop

    lines = []

    def run(name: str) -> list[dict]:
        recipe = embedded_recipe(
            "spanbert", embedded_prepared, tmp_path / name, "train.log_every=2", "train.peak_tflops=0.001"
        )
        return [r for r in read_metrics(pretrain(recipe, log=lines.append)) if r["kind"] == "train"]

    recipe = embedded_recipe("spanbert", embedded_prepared, tmp_path / "x")
    flops = training_flops(build_objective(recipe, PreparedCorpus(embedded_prepared)))
    width = sum(flops.attention.values())
    quick = run("quick")
    assert len(quick) == 2
    # the peak as set, not rounded away (a CPU's measured peak is a small fraction of a TFLOP/s)
    assert "mfu: the model's FLOPs per second over a peak of 0.001 TFLOP/s (train.peak_tflops)" in lines
    for record in quick:
        per_token = record["mfu"] * 1e9 / record["tokens_per_s"]
        assert 6 * flops.dense_weights <= per_token <= 6 * flops.dense_weights + 12 * width * EMBEDDED_MAX_LEN
        assert 0 <= record["data_wait"] < 1

    to_device = loop._to
    monkeypatch.setattr(loop, "_to", lambda batch, device: time.sleep(0.2) or to_device(batch, device))
    slow = run("slow")
    assert all(r["data_wait"] > 0.5 and r["data_wait"] > q["data_wait"] for r, q in zip(slow, quick))


def test_a_peak_measured_on_a_busy_device_is_measured_again_when_the_model_outruns_it(
    embedded_prepared, tmp_path, monkeypatch
):
    """Another process held the device when the run measured its peak (here: 1 FLOP/s): the first window's model
    rate exceeds it, so the run measures it again, says so once, and no record reports an mfu over 1."""
    from spanlm.train import speed

    peaks = iter([1.0, 1e18])
    calls = []
    monkeypatch.setattr(speed, "measure_peak_flops", lambda device, dtype: calls.append(dtype) or next(peaks))
    lines = []
    recipe = embedded_recipe("spanbert", embedded_prepared, tmp_path / "run", "train.log_every=2")
    records = [r for r in read_metrics(pretrain(recipe, log=lines.append)) if r["kind"] == "train"]
    assert len(calls) == 2 and len(records) == 2
    assert all(0 < r["mfu"] < 1 for r in records)
    (said,) = [line for line in lines if "measured again" in line]
    assert "over the 1e-12 measured at the start" in said and "a peak of 1e+06 TFLOP/s" in said


@pytest.mark.slow
def test_torch_compile_option(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2, compile=True), **QUIET)
    assert len(losses(run)) == 2


def test_report_writes_plots_and_html(prepared, tmp_path):
    from spanlm.cli import main

    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=4, eval_every=2), **QUIET)
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    for name in ("loss.png", "lr.png", "throughput.png", "eval.png"):
        assert (run / name).stat().st_size > 1000 and name in page
    assert "Final metrics" in page and "Configuration" in page and "mlm_accuracy" in page
    assert main(["report", str(tmp_path)]) == 2  # not a run directory: a clear error, no traceback

    other = pretrain(toy_recipe(prepared, tmp_path / "other", max_steps=4, eval_every=2, lr=3e-3), **QUIET)
    plot = tmp_path / "compare.png"
    assert (
        main(["compare", str(run), str(other), "--metric", "loss", "--metric", "mlm_accuracy", "--out", str(plot)]) == 0
    )
    assert plot.stat().st_size > 1000
    assert main(["compare", str(run), "--metric", "no_such_metric", "--out", str(plot)]) == 2


def test_eval_at_start_logs_the_initial_weights_once(prepared, tmp_path):
    """A step-0 evaluation of the initial weights when a run starts afresh, not again when it resumes."""
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2, eval_every=2, eval_at_start=True), **QUIET)
    evals = [r for r in read_metrics(run) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2] and evals[0]["loss"] != evals[1]["loss"]
    pretrain(
        toy_recipe(prepared, tmp_path / "run", max_steps=4, eval_every=2, eval_at_start=True), resume="auto", **QUIET
    )
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "eval"] == [0, 2, 4]


def test_lr_schedule_shapes():
    from spanlm.train.config import TrainConfig
    from spanlm.train.optim import lr_factor, parameter_groups

    linear = TrainConfig(max_steps=110, warmup_steps=10)
    assert [lr_factor(s, linear) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert lr_factor(60, linear) == pytest.approx(0.5) and lr_factor(110, linear) == 0.0
    cosine = TrainConfig(max_steps=110, warmup_steps=10, schedule="cosine")
    assert lr_factor(60, cosine) == pytest.approx(0.5) and lr_factor(10, cosine) == 1.0
    model = toy_objective.Toy(50, 4)
    decay, no_decay = parameter_groups(model, 0.01)
    assert {id(p) for p in decay["params"]} == {id(model.embedding.weight), *(id(l[0].weight) for l in model.layers)}
    assert id(model.norm.weight) in {id(p) for p in no_decay["params"]} and no_decay["weight_decay"] == 0.0


def test_batches_are_pinned_only_for_a_gpu_run(prepared):
    config = toy_recipe(prepared, Path("unused")).train
    for device, pinned in (("cpu", False), ("cuda", True), ("auto", torch.cuda.is_available())):
        config.device = device
        loader = toy_loader(prepared, config)
        assert loader.loader.pin_memory is pinned  # built only: iterating a pinned loader needs a GPU


@pytest.mark.slow
def test_resume_is_bit_exact_under_a_masking_rate_schedule(prepared, tmp_path):
    """The step a batch is masked at comes from its key: 2N = N + resume + N with the rate decaying, across an
    epoch edge, with micro-batches, and the masks differ from the unscheduled run's."""
    model = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 32}
    per_epoch = batches_per_epoch(prepared, 32)
    n = per_epoch // 2 + 1  # two micro-batches a step: the second half crosses the epoch edge

    def recipe(name: str, schedule: dict | None, **extra):
        extra.setdefault("max_steps", 2 * n)
        made = toy_recipe(
            prepared,
            tmp_path / name,
            None,
            model,
            objective="mlm",
            batch_size=32,
            grad_accum=2,
            save_every=n,
            schedule="wsd",
            decay_share=0.5,
            lr=1e-3,
            **extra,
        )
        made.masking = from_dict(MaskingConfig, {"rate_schedule": schedule}) if schedule else made.masking
        return made

    decaying = {"kind": "linear", "steps": [0, 2 * n], "rates": [0.4, 0.1]}
    full = pretrain(recipe("full", decaying), **QUIET)
    resumed = pretrain(recipe("resumed", decaying, num_workers=1), resume=str(ckpt.step_dir(full, n)), **QUIET)
    assert {s: v for s, v in losses(full).items() if s > n} == losses(resumed)
    final_full = load_file(str(ckpt.step_dir(full, 2 * n) / "model.safetensors"))
    final_resumed = load_file(str(ckpt.step_dir(resumed, 2 * n) / "model.safetensors"))
    assert all(torch.equal(final_full[k], final_resumed[k]) for k in final_full)
    constant = pretrain(recipe("constant", None, max_steps=1), **QUIET)
    assert losses(constant)[1] != losses(full)[1]


def test_a_log_that_is_not_a_terminal_gets_a_line_per_window_not_a_bar(prepared, tmp_path, capsys):
    """stderr redirected to a file (here: captured): no progress bar redraws, one line per log window instead."""
    recipe = toy_recipe(prepared, tmp_path / "run", max_steps=4, log_every=2)
    recipe.logging.progress = True
    said = []
    pretrain(recipe, log=said.append)
    lines = [line for line in said if line.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step 2/4", "step 4/4"]
    assert all("loss" in line and "tok_s" in line for line in lines)
    assert "train:" not in capsys.readouterr().err  # no tqdm bar
