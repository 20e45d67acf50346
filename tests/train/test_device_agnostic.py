"""The device-agnostic step (every device's path: spanlm.accel off), run on the CPU: the same losses and
gradients as the CPU backend, no graph break under torch.compile, at most one host sync per training step."""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import EMBEDDED_MAX_LEN, embedded_recipe, forbid_deriving_segment_bounds
from spanlm import accel
from spanlm.accel import cross_entropy, native
from spanlm.data.blocks import BlockDataset, collate_blocks
from spanlm.data.shards import PreparedCorpus
from spanlm.objectives import build_objective
from spanlm.pretrain.run import pretraining_setup
from spanlm.train.dist import init_distributed
from spanlm.train.loop import Trainer
from spanlm.train.metrics import MetricsWindow, read_metrics
from spanlm.train.parallel import compile_recurrent_layers

# (recipe in configs/pretrain, overrides): every objective, ELECTRA with each sharing mode and the SBO generator
OBJECTIVES = {
    "mlm": ("mlm", []),
    "wwm": ("wwm", []),
    # the embedded corpus has no similar-word table: [MASK] in its place (the same model and loss)
    "macbert": ("macbert", ['masking.ngram.proportions={"mask": 0.8, "similar": 0.0, "random": 0.1, "keep": 0.1}']),
    "spanbert": ("spanbert", []),
    "charbert": ("charbert", [f"masking.noise.max_len={EMBEDDED_MAX_LEN}"]),
    "electra-es": ("electra", ["objective.electra.sharing=es"]),
    "electra-gdes": ("deberta_v3_gdes", ["objective.electra.sharing=gdes"]),
    "electra-sbo": ("electra", ["objective.electra.generator_head=sbo", "masking.scheme=span"]),
}

# The distinct training graphs: wwm and macbert train the shared masked-LM model of mlm (another masker, the same
# model, batch fields and loss), so compiling or fusing theirs checks nothing mlm's does not.
GRAPHS = [case for case in OBJECTIVES if case not in ("wwm", "macbert")]


@pytest.fixture(scope="module")
def corpus(embedded_prepared) -> PreparedCorpus:
    return PreparedCorpus(embedded_prepared)


def objective_and_batch(corpus, tmp_path, case: str):
    name, overrides = OBJECTIVES[case]
    torch.manual_seed(0)
    objective = build_objective(embedded_recipe(name, corpus.directory, tmp_path / "run", *overrides), corpus)
    blocks = BlockDataset(corpus, EMBEDDED_MAX_LEN)
    batch = collate_blocks([blocks[i] for i in range(8)], corpus.special_ids["pad"])
    # Only the arrays the objective declares it reads, as the loader sends them: a missing one fails here.
    return objective, objective.masker(batch, np.random.default_rng(0)).to_torch(objective.batch_fields)


def training_step(objective, batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The output parts and every parameter's gradient of one forward/backward."""
    objective.zero_grad(set_to_none=True)
    output = objective(batch)
    output["loss"].backward()
    gradients = {name: p.grad.clone() for name, p in objective.named_parameters() if p.grad is not None}
    return {key: value.detach().clone() for key, value in output.items()}, gradients


@pytest.mark.skipif(native.kernels() is None, reason="spanlm's native kernels cannot be built here")
@pytest.mark.parametrize("case", GRAPHS)
@pytest.mark.slow
def test_same_losses_and_gradients_as_the_cpu_backend(corpus, tmp_path, monkeypatch, case):
    objective, batch = objective_and_batch(corpus, tmp_path, case)
    parts, gradients = training_step(objective, batch)
    fused = []
    original = cross_entropy._FusedCrossEntropy.apply
    monkeypatch.setattr(cross_entropy._FusedCrossEntropy, "apply", lambda *args: fused.append(1) or original(*args))
    objective, batch = objective_and_batch(corpus, tmp_path, case)  # the same weights (seeded) and batch
    assert accel.apply(objective, torch.device("cpu")) == "cpu"
    cpu_parts, cpu_gradients = training_step(objective, batch)
    assert fused, "the CPU backend's cross-entropy did not run"
    assert parts.keys() == cpu_parts.keys() and gradients.keys() == cpu_gradients.keys()
    for key, value in parts.items():
        assert torch.allclose(value.double(), cpu_parts[key].double(), rtol=1e-5, atol=1e-6), (
            key,
            value,
            cpu_parts[key],
        )
    for name, gradient in gradients.items():
        assert torch.allclose(gradient, cpu_gradients[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("case", [*GRAPHS, "spanbert-accel", "electra-sbo-accel"])
@pytest.mark.slow
def test_one_training_step_compiles_without_graph_breaks(corpus, tmp_path, case):
    objective, batch = objective_and_batch(corpus, tmp_path, case.removesuffix("-accel"))
    if case.endswith("-accel"):  # the CPU backend steps aside under torch.compile, without a graph break
        accel.apply(objective, torch.device("cpu"))
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(compile_recurrent_layers(objective))(batch)  # as the loop compiles off the CPU
    assert explanation.graph_break_count == 0, [reason.reason for reason in explanation.break_reasons]
    assert explanation.graph_count == 1


SYNCING = ("item", "__bool__", "__int__", "__float__", "__index__", "cpu", "tolist", "numpy")


class HostReads:
    """Counts the Tensor methods that read a value on the host (on a GPU, each waits for the device)."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in SYNCING:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _name=name, _original=original, **kwargs):
                caller = traceback.extract_stack(limit=2)[0]
                self.calls.append(f"{_name} in {Path(caller.filename).name}:{caller.lineno}")
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


# transformers' SDPA mask preparation reads ``attention_mask.all()`` once per eager forward, to drop a mask
# without padding so that SDPA may take the flash kernel; under torch.compile it does not (is_tracing).
ENCODER_MASK_CHECK = "masking_utils.py"
PACKED_CPU_LOOP = "packed.py"  # spanlm.models.packed.varlen_attention on the CPU


@pytest.mark.parametrize("packing", ["true", "false"])
@pytest.mark.parametrize(
    "settings", [[], ["train.nonfinite=skip"], ["train.grad_accum=2"]], ids=["stop", "skip", "grad-accum"]
)
def test_a_non_logging_step_reads_the_host_only_in_the_encoders_batch_layout_check(
    corpus, tmp_path, monkeypatch, settings, packing
):
    config = embedded_recipe(
        "spanbert", corpus.directory, tmp_path / "run", "train.accel=off", *settings, f"data.packing={packing}"
    )
    trainer = Trainer(config, init_distributed("cpu"), pretraining_setup, log=lambda *_: None)
    loader = iter(trainer.loader)
    batches = iter([next(loader) for _ in range(4)])  # masked before counting: the data loader is not the step
    window = MetricsWindow(trainer.env.device)
    trainer.objective.train()
    trainer._step(batches, window)  # first step: optimiser state created
    reads = HostReads(monkeypatch)
    trainer._step(batches, window)
    monkeypatch.undo()
    # fused AdamW skips a non-finite step on the device: the loop itself reads nothing. A padded batch's mask
    # is checked once per forward; a packed stream has no mask and carries its bounds and longest segment (a host
    # int), so it reads nothing. The CPU's per-block attention reads the block bounds from host memory.
    waits = [call for call in reads.calls if not call.startswith(f"tolist in {PACKED_CPU_LOOP}")]
    if packing == "true":
        assert not waits, reads.calls
    else:
        assert len(waits) == config.train.grad_accum and all(ENCODER_MASK_CHECK in c for c in waits), reads.calls
    assert trainer.step == 2 and int(window.counted) == 2 and int(window.tokens) > 0


@pytest.mark.parametrize("case, accel", [("spanbert", "off"), ("spanbert", "auto"), ("charbert", "off")])
@pytest.mark.slow
def test_packed_training_and_evaluation_never_derive_the_bounds_on_the_device(
    corpus, tmp_path, monkeypatch, case, accel
):
    """The loader's packed batches carry their segment bounds and longest segment: the model's fallback for
    positions alone (nonzero and a read of the longest, two host syncs on a GPU) is never taken."""
    name, overrides = OBJECTIVES[case]
    config = embedded_recipe(
        name, corpus.directory, tmp_path / "run", f"train.accel={accel}", "data.packing=true", *overrides
    )
    trainer = Trainer(config, init_distributed("cpu"), pretraining_setup, log=lambda *_: None)
    forbid_deriving_segment_bounds(monkeypatch)
    batches, window = iter(trainer.loader), MetricsWindow(trainer.env.device)
    trainer.objective.train()
    trainer._step(batches, window)
    metrics = trainer.evaluate()
    assert trainer.step == 1 and int(window.counted) == 1 and np.isfinite(metrics["loss"])


def test_a_non_fused_optimiser_step_reads_the_non_finite_flag_once(corpus, tmp_path, monkeypatch):
    config = embedded_recipe("spanbert", corpus.directory, tmp_path / "run", "train.accel=off", "train.nonfinite=skip")
    trainer = Trainer(config, init_distributed("cpu"), pretraining_setup, log=lambda *_: None)
    monkeypatch.setattr(Trainer, "_skips_on_device", lambda self: False)  # as for the foreach AdamW under FSDP, or LAMB
    batches = iter(trainer.loader)
    window = MetricsWindow(trainer.env.device)
    trainer.objective.train()
    trainer._step(batches, window)
    reads = HostReads(monkeypatch)
    trainer._step(batches, window)
    loop_reads = [call for call in reads.calls if ENCODER_MASK_CHECK not in call and PACKED_CPU_LOOP not in call]
    monkeypatch.undo()
    assert len(loop_reads) == 1 and "loop.py" in loop_reads[0], reads.calls


def test_a_non_finite_step_is_skipped_on_the_device_and_named_at_the_record(corpus, tmp_path):
    config = embedded_recipe("spanbert", corpus.directory, tmp_path / "run", "train.accel=off")
    trainer = Trainer(config, init_distributed("cpu"), pretraining_setup, log=lambda *_: None)
    batches = iter(trainer.loader)
    window = MetricsWindow(trainer.env.device)
    trainer.objective.train()
    trainer._step(batches, window)
    before = {name: p.detach().clone() for name, p in trainer.objective.named_parameters()}
    poisoned = next(p for p in trainer.objective.parameters() if p.requires_grad)
    hook = poisoned.register_hook(lambda grad: grad * float("nan"))
    trainer._step(batches, window)  # step 2 goes bad
    hook.remove()
    trainer._step(batches, window)  # nonfinite=stop: nothing after the bad step is applied either
    assert all(torch.equal(p, before[name]) for name, p in trainer.objective.named_parameters())
    assert int(window.skipped) == 1 and int(window.bad_step) == 2
    from spanlm.train.loop import TrainingHalted

    with pytest.raises(TrainingHalted, match="non-finite loss or gradient norm at step 2 .*grad_norm=nan"):
        trainer._log_record(window, 0.0, 0)


def test_the_loader_sends_the_arrays_the_objective_reads_and_no_others(corpus, tmp_path):
    from spanlm.train.loop import StartingPoint

    config = embedded_recipe("spanbert", corpus.directory, tmp_path / "run")
    setup = pretraining_setup(config, init_distributed("cpu"), lambda *_: None, StartingPoint())
    declared = set(setup.objective.batch_fields)
    assert {"sbo_left", "sbo_labels"} <= declared and "span_start" not in declared  # statistics stay in the worker
    assert set(next(iter(setup.loader))) == declared
    assert set(next(iter(setup.eval_batches()))) == declared


def compiled_run(corpus, tmp_path, monkeypatch, case: str, *overrides: str):
    """``train.compile=true`` for 6 steps of ``case`` with two evaluations (dynamo's aot_eager backend: the graph
    capture the inductor compiles, without its code generation); returns dynamo's counters at the end and its
    frame counts after the first step."""
    from torch._dynamo.utils import counters

    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: compile(function, backend="aot_eager", **kwargs))
    name, objective_overrides = OBJECTIVES[case]
    config = embedded_recipe(
        name,
        corpus.directory,
        tmp_path / "run",
        *objective_overrides,
        "train.compile=true",
        "train.max_steps=6",
        "train.eval_every=3",
        *overrides,
    )
    torch._dynamo.reset()
    counters.clear()
    trainer = Trainer(config, init_distributed("cpu"), pretraining_setup, log=lambda *_: None)
    first_step, step = {}, Trainer._step

    def counted_step(self, *args):
        step(self, *args)
        if self.step == 1:
            first_step.update(counters["frames"])

    monkeypatch.setattr(Trainer, "_step", counted_step)
    trainer.run()
    assert trainer.step == 6
    return counters, first_step


@pytest.mark.parametrize("accel", ["auto", "off"])
@pytest.mark.slow
def test_a_compiled_packed_run_on_the_cpu_has_no_graph_break(corpus, tmp_path, monkeypatch, accel):
    """`spanlm pretrain … train.compile=true` on the CPU: the packed attention is chosen before the first compiled
    forward (no switch inside the trace) and traced as one graph (the segments padded again, not the per-segment
    loop's host read), compiled once: the stream's changing width symbolic from the first step, the evaluations
    eager."""
    counters, _ = compiled_run(corpus, tmp_path, monkeypatch, "spanbert", f"train.accel={accel}", "data.packing=true")
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["frames"]["total"] == 1 and counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


@pytest.mark.parametrize(
    "case, packing", [("mlm", "false"), ("charbert", "true"), ("electra-gdes", "false"), ("electra-sbo", "true")]
)
@pytest.mark.slow
def test_every_objective_compiles_once_however_its_batches_change(corpus, tmp_path, monkeypatch, case, packing):
    """One compile per run: six steps of batches whose lengths (the longest block, the stream's width, the number
    of targets and segments) change from step to step, and two evaluations, compile nothing after the first step
    (CharBERT's GRU stays out of the graph on the CPU: its frames are compiled at the first step too)."""
    counters, first_step = compiled_run(corpus, tmp_path, monkeypatch, case, f"data.packing={packing}")
    assert dict(counters["frames"]) == first_step
    # the run says so itself, and what its first step cost
    (record,) = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert record["recompiles"] == 0 and record["first_step_s"] > 0
