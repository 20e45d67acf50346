"""A curriculum in one recipe: phases checked at load, resolved on top of one another, run in one directory with one
schedule, each exported, and resumed bit for bit from a stop inside a phase or at a boundary."""

from __future__ import annotations

import json
import os
import re
import signal

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import embedded_recipe
from spanlm.config import read_yaml
from spanlm.errors import ConfigError, SpanlmError
from spanlm.pretrain.phases import plan
from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from spanlm.train.metrics import read_metrics
from spanlm.train.optim import lr_factor

QUIET = {"log": lambda *_: None}
# 4 steps at 32 tokens, 3 extended to 48, 3 decaying with a lower masking rate; the schedule one wsd over all 10
PHASES = (
    "[{name: pretrain, steps: 4}, {name: extend, steps: 3, set: {data.max_len: 48}}, "
    "{name: decay, steps: 3, decay: true, set: {masking.mlm.rate: 0.1}}]"
)


def phased(prepared, out, *overrides):
    return embedded_recipe(
        "mlm",
        prepared,
        out,
        "model.max_position_embeddings=64",
        "train.max_steps=10",  # embedded_recipe states 4: here the phases' steps
        "train.schedule=wsd",
        "train.decay_shape=linear",
        "train.warmup_steps=2",
        "train.save_every=2",
        "train.log_every=1",
        "train.eval_every=0",
        f"phases={PHASES}",
        *overrides,
    )


@pytest.mark.parametrize(
    "phases, message",
    [
        ("[{name: a, steps: 2, set: {model.hidden_size: 64}}]", "phases[0] (a): model.hidden_size cannot change"),
        ("[{name: a, steps: 2, set: {masking.scheme: span}}]", "phases[0] (a): masking.scheme cannot change"),
        ("[{name: a, steps: 2, set: {tokenizer.vocab_size: 900}}]", "tokenizer.vocab_size cannot change"),
        ("[{name: a, steps: 2, set: {model.max_position_embeddings: 64}}]", "only RoPE families"),
        ("[{name: a, steps: 2, decay: true}, {name: b, steps: 2}]", "phases[0] (a): decay: true"),
        ("[{name: a, steps: 2}, {name: a, steps: 2}]", "each phase needs its own name"),
        ("[{name: a/b, steps: 2}]", "letters, digits"),
        # what only a later phase's start would have found, after the phases before it trained
        ("[{name: a, steps: 2}, {name: b, steps: 2, set: {masking.mlm.ratee: 0.2}}]", "phases[1] (b): unknown config"),
        ("[{name: a, steps: 2}, {name: b, steps: 2, set: {masking.mlm.rate: 1.5}}]", "phases[1] (b): config section"),
        ("[{name: a, steps: 2}, {name: b, steps: 2, set: {masking.span.max_targets: 20}}]", "max_targets cannot"),
        ("[{name: a, steps: 2}, {name: b, steps: 2, set: {model.rope_theta: 1.6e5}}]", "(b): config section 'model'"),
        ("[{name: a, steps: 2}, {name: b, steps: 2, set: {data.max_len: 1024}}]", "phases[1] (b): data.max_len 1024"),
        (
            "[{name: a, steps: 2}, {name: b, steps: 2, set: {data.prepared_shards: [nowhere]}}]",
            "(b): data.prepared_shards: nowhere is not",
        ),
    ],
)
def test_a_phase_that_cannot_run_is_refused_at_load_naming_it(embedded_prepared, tmp_path, phases, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        embedded_recipe("mlm", embedded_prepared, tmp_path / "run", "train.schedule=wsd", f"phases={phases}")


def test_a_phase_may_keep_more_checkpoints(embedded_prepared, tmp_path):
    phases = PHASES.replace("set: {data.max_len: 48}", "set: {data.max_len: 48, train.keep_last: 7}")
    recipe = phased(embedded_prepared, tmp_path / "run", f"phases={phases}")
    assert [p.recipe.train.keep_last for p in plan(recipe)][1:] == [7, 7]


def test_a_model_path_whose_config_is_not_json_is_left_to_the_runs_own_load(embedded_prepared, tmp_path):
    """The load-time check of a later phase's block length reads model.path's config.json; one that is not JSON is
    not that check's to report (it used to refuse the recipe with the JSON parser's words as if the recipe's)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("not json", encoding="utf-8")
    recipe = phased(embedded_prepared, tmp_path / "run", f"model.path={tmp_path / 'model'}")
    assert [p.recipe.data.max_len for p in plan(recipe)] == [32, 48, 48]


def test_a_stated_max_steps_must_be_the_phases(embedded_prepared, tmp_path):
    with pytest.raises(ConfigError, match="a phased run's length is its phases' steps \\(10\\)"):
        phased(embedded_prepared, tmp_path / "run", "train.max_steps=7")
    assert phased(embedded_prepared, tmp_path / "run", "train.max_steps=10").train.max_steps == 10
    # the value TrainConfig defaults to, stated, is stated too
    with pytest.raises(ConfigError, match="train.max_steps 200: a phased run's length is its phases' steps \\(10\\)"):
        phased(embedded_prepared, tmp_path / "run", "train.max_steps=200")


def test_each_phase_is_resolved_on_top_of_the_one_before(embedded_prepared, tmp_path):
    recipe = phased(embedded_prepared, tmp_path / "run")
    phases = plan(recipe)
    assert [(p.config.name, p.start, p.end) for p in phases] == [("pretrain", 0, 4), ("extend", 4, 7), ("decay", 7, 10)]
    assert [p.recipe.data.max_len for p in phases] == [32, 48, 48]  # the extension carries on into the decay
    assert [p.recipe.masking.mlm.rate for p in phases] == [0.15, 0.15, 0.1]
    assert [p.recipe.train.max_steps for p in phases] == [4, 7, 10]
    assert {p.recipe.train.schedule_steps for p in phases} == {10} and {p.recipe.train.decay_share for p in phases} == {
        0.3
    }
    assert [p.recipe.phase for p in phases] == ["pretrain", "extend", "decay"]
    assert all(not p.recipe.phases for p in phases)


def test_each_phase_draws_its_own_block_order_and_no_two_seeds_share_one(embedded_prepared, tmp_path):
    """The first phase keeps the recipe's order (data.order_seed, else seed); each next one an order of its own that
    no phase of another seed or order seed repeats (seed + index did: seed 0's third phase was seed 1's second)."""
    orders = {
        seed: [p.recipe.data.order_seed for p in plan(phased(embedded_prepared, tmp_path / "run", f"seed={seed}"))]
        for seed in (0, 1, 2)
    }
    assert all(order[0] is None for order in orders.values())  # the recipe's seed itself, as a run without phases
    later = [seed for order in orders.values() for seed in order[1:]]
    assert len(set(later)) == len(later) and not set(later) & {0, 1, 2}
    kept = plan(phased(embedded_prepared, tmp_path / "run", "data.order_seed=7"))
    assert kept[0].recipe.data.order_seed == 7 and kept[1].recipe.data.order_seed not in later


def test_every_phase_holds_out_the_same_text_whatever_its_block_length(embedded_prepared, tmp_path):
    """The held-out blocks of the 32-token phase and of the 48-token ones cover text that no phase trains on (a
    split by block index held out other text at each length, which the other phases trained on), and each phase
    holds out a share of it in its own blocks."""
    from spanlm.data.block_index import share_block_index
    from spanlm.data.blocks import BlockDataset
    from spanlm.data.shards import PreparedCorpus
    from spanlm.pretrain.run import held_out_split

    phases = plan(phased(embedded_prepared, tmp_path / "run", "train.eval_blocks=64"))
    corpus = PreparedCorpus(phases[0].recipe.data.prepared_dir)
    held, trained = [], []
    for phase in phases:
        for length in (32, 48):
            share_block_index(corpus, length, log=lambda *_: None)
        blocks = BlockDataset(corpus, phase.recipe.data.max_len)
        training, held_out = held_out_split(phase.recipe, corpus, blocks)
        assert len(held_out) >= 32  # the held-out text, in this phase's blocks
        covered = lambda ids: {t for i in ids for t in range(*map(int, blocks.index[int(i)]))}  # noqa: E731
        held.append(covered(held_out))
        trained.append(covered(training[np.arange(len(training))]))
    every_held, every_trained = set().union(*held), set().union(*trained)
    assert not every_held & every_trained
    # the 48-token phases hold out the same blocks; the 32-token phase the shorter blocks inside them
    assert held[1] == held[2] and held[0] <= held[1] and len(held[0]) > 0.5 * len(held[1])


SCHEDULE = "masking.rate_schedule={kind: piecewise, steps: [0, 5], rates: [0.3, 0.1]}"


def test_a_masking_schedule_counts_the_runs_steps_in_every_phase(embedded_prepared, tmp_path):
    """A schedule of the run's steps (0.3 until step 5, then 0.1) masks the extension's batches by their step in the
    run, not from 0 again; a phase's own masking rate, which such a schedule overrides, is refused at load."""
    from spanlm.pretrain.batches import ScheduledRate
    from spanlm.train.loader import BatchKeySampler

    two = "phases=[{name: a, steps: 4}, {name: b, steps: 3, set: {data.max_len: 48}}]"
    phases = plan(phased(embedded_prepared, tmp_path / "run", SCHEDULE, two, "train.max_steps=7"))
    assert [p.recipe.train.first_step for p in phases] == [0, 4]
    sampler = BatchKeySampler(np.arange(100), 4, 0, 0, 1)
    rates = [
        [ScheduledRate(p.recipe.masking.rate_schedule, sampler, 1, p.recipe.train.first_step)(0, b) for b in range(3)]
        for p in phases
    ]
    assert rates == [[0.3, 0.3, 0.3], [0.3, 0.1, 0.1]]  # batch b of phase b trains step 4 + b (from 0) of the run
    with pytest.raises(ConfigError, match=re.escape("phases[2] (decay): masking.mlm.rate has no effect under")):
        phased(embedded_prepared, tmp_path / "run", SCHEDULE)


def stop_at(monkeypatch, step: int):
    """SIGTERM to this process right after training step ``step``: the run saves there and returns."""
    from spanlm.train.loop import Trainer

    original = Trainer._step

    def step_then_stop(self, *args):
        original(self, *args)
        if self.step == step:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Trainer, "_step", step_then_stop)


def losses(run) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run) if r["kind"] == "train"}


@pytest.fixture(scope="module")
def uninterrupted(embedded_prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("phases") / "run"
    return pretrain(phased(embedded_prepared, out), **QUIET)


def test_the_phases_run_in_one_directory_on_one_schedule_each_exported(uninterrupted, embedded_prepared, tmp_path):
    records = [r for r in read_metrics(uninterrupted) if r["kind"] == "train"]
    assert [r["step"] for r in records] == list(range(1, 11))
    assert [r["phase"] for r in records] == ["pretrain"] * 4 + ["extend"] * 3 + ["decay"] * 3
    # one wsd schedule over the ten steps (each record: the rate after its step), whatever phase trains them: the
    # peak until step 7, then down to 0 at step 10 over the decay phase's three steps
    train = plan(phased(embedded_prepared, tmp_path / "x"))[0].recipe.train
    assert [r["lr"] for r in records] == pytest.approx([1e-3 * lr_factor(r["step"], train) for r in records])
    assert [round(lr_factor(step, train), 4) for step in range(7, 11)] == [1.0, 0.6667, 0.3333, 0.0]
    exported_words = []
    for name, max_len in (("pretrain", 32), ("extend", 48), ("decay", 48)):
        export = uninterrupted / f"phase-{name}"
        assert json.loads((export / "config.json").read_text(encoding="utf-8"))["model_type"] == "bert"
        saved = read_yaml(export / "config.yaml")  # the phase's own recipe
        assert saved["phase"] == name and saved["data"]["max_len"] == max_len
        exported = load_file(str(export / "model.safetensors"))
        exported_words.append(next(v for k, v in exported.items() if k.endswith("word_embeddings.weight")))
    final = load_file(str(ckpt.step_dir(uninterrupted, 10) / "model.safetensors"))
    assert torch.equal(exported_words[-1], next(v for k, v in final.items() if k.endswith("word_embeddings.weight")))
    assert not torch.equal(exported_words[0], exported_words[1])  # each phase's own weights


def test_the_run_keeps_its_curriculum_and_its_report_lists_the_phases(uninterrupted, tmp_path):
    """Each phase's config.yaml is its own resolved recipe (the last one's stays); curriculum.yaml keeps the recipe
    with its phases, and `spanlm report` lists them — steps as the records number them, what each sets, its
    export in the run directory, even one moved since."""
    import shutil

    from spanlm.report import write_report

    assert read_yaml(uninterrupted / "config.yaml")["phases"] == []
    curriculum = read_yaml(uninterrupted / "curriculum.yaml")
    assert [(p["name"], p["steps"]) for p in curriculum["phases"]] == [("pretrain", 4), ("extend", 3), ("decay", 3)]
    assert curriculum["phase"] is None and curriculum["phases"][1]["set"] == {"data.max_len": 48}
    run = tmp_path / "moved"
    shutil.copytree(uninterrupted, run, ignore=shutil.ignore_patterns("checkpoints"))
    write_report(run)
    phases = json.loads((run / "summary.json").read_text(encoding="utf-8"))["phases"]
    assert [(p["name"], p["steps"], p["set"], p["decay"]) for p in phases] == [
        ("pretrain", [1, 4], {}, False),
        ("extend", [5, 7], {"data.max_len": 48}, False),
        ("decay", [8, 10], {"masking.mlm.rate": 0.1}, True),
    ]
    assert [p["export"] for p in phases] == [str(run / f"phase-{name}") for name in ("pretrain", "extend", "decay")]
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "<h2>Phases</h2>" in page and "<td>extend</td><td>5–7</td><td>data.max_len=48</td>" in page
    assert "curriculum.yaml" in page


@pytest.mark.parametrize("where", ["inside a phase", "at a phase's last step", "during an export", "at a boundary"])
@pytest.mark.slow
def test_a_stopped_curriculum_resumes_bit_for_bit(embedded_prepared, uninterrupted, tmp_path, monkeypatch, where):
    """Stopped by SIGTERM at step 5 (inside the extension), at step 4 (the first phase's last: the curriculum ends
    there, not in the next phase), during the first phase's export, or killed right after that export (the next
    phase not started), `--resume auto` continues to the losses and weights of the run that never stopped."""
    out = tmp_path / "run"
    recipe = phased(embedded_prepared, out)
    with monkeypatch.context() as patch:
        if where in ("inside a phase", "at a phase's last step"):
            step = 5 if where == "inside a phase" else 4
            stop_at(patch, step)
            pretrain(recipe, **QUIET)
            assert ckpt.step_of(ckpt.latest_checkpoint(out)) == step and max(losses(out)) == step
            assert not (out / "phase-extend").exists()
            # the curriculum is kept from its phases' starts on; a refused resume (another block length for the
            # phase it is in) leaves it as it was
            kept = (out / "curriculum.yaml").read_bytes()
            assert [p["name"] for p in read_yaml(out / "curriculum.yaml")["phases"]] == ["pretrain", "extend", "decay"]
            if where == "inside a phase":
                changed = phased(
                    embedded_prepared, out, f"phases={PHASES.replace('data.max_len: 48', 'data.max_len: 40')}"
                )
                with pytest.raises(SpanlmError, match="data.max_len"):
                    pretrain(changed, resume="auto", **QUIET)
                assert (out / "curriculum.yaml").read_bytes() == kept
        elif where == "during an export":
            from spanlm.pretrain import export as export_module

            export = export_module.export_checkpoint

            def export_under_a_signal(checkpoint, directory):
                os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's stop while the phase is exported
                export(checkpoint, directory)

            patch.setattr(export_module, "export_checkpoint", export_under_a_signal)
            pretrain(recipe, **QUIET)
            assert ckpt.step_of(ckpt.latest_checkpoint(out)) == 4 and max(losses(out)) == 4
            assert (out / "phase-pretrain" / "config.json").is_file() and not (out / "phase-extend").exists()
        else:
            from spanlm.pretrain import export as export_module

            export = export_module.export_checkpoint

            def export_then_stop(checkpoint, directory):
                export(checkpoint, directory)
                raise KeyboardInterrupt  # killed before the next phase starts

            patch.setattr(export_module, "export_checkpoint", export_then_stop)
            with pytest.raises(KeyboardInterrupt):
                pretrain(recipe, **QUIET)
            assert ckpt.step_of(ckpt.latest_checkpoint(out)) == 4 and (out / "phase-pretrain").is_dir()
    pretrain(recipe, resume="auto", **QUIET)
    assert losses(out) == losses(uninterrupted)
    a = load_file(str(ckpt.step_dir(out, 10) / "model.safetensors"))
    b = load_file(str(ckpt.step_dir(uninterrupted, 10) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all((out / f"phase-{name}" / "config.json").is_file() for name in ("pretrain", "extend", "decay"))


@pytest.mark.parametrize("step", [6, 4])
@pytest.mark.slow
def test_resuming_from_an_earlier_checkpoint_branches_the_curriculum_there(
    embedded_prepared, uninterrupted, tmp_path, step
):
    """`--resume PATH` to a checkpoint of a finished curriculum (inside the extension, or at the first phase's end)
    trains from there again, its later checkpoints and phase exports set aside, to the same losses and weights."""
    out = tmp_path / "run"
    recipe = phased(embedded_prepared, out, "train.keep_last=10")
    pretrain(recipe, **QUIET)
    old_export = (out / "phase-decay" / "model.safetensors").stat().st_mtime_ns
    pretrain(recipe, resume=str(ckpt.step_dir(out, step)), **QUIET)
    assert losses(out) == losses(uninterrupted)
    assert (out / "phase-decay" / "model.safetensors").stat().st_mtime_ns != old_export  # exported again
    aside = next((out / "checkpoints").glob("superseded-*"))
    assert (aside / "phase-decay").is_dir() and (aside / ckpt.step_dir(out, 10).name).is_dir()
    a = load_file(str(ckpt.step_dir(out, 10) / "model.safetensors"))
    b = load_file(str(ckpt.step_dir(uninterrupted, 10) / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name, masking", [("ettin_modernbert", "mlm"), ("ettin_spanbert", "span")])
def test_the_shipped_curricula_extend_then_decay(name, masking):
    """configs/pretrain/ettin_*.yaml: 400 steps at 128 tokens with the global RoPE base at 10k and 30% masked, 100
    at 256 with 160k, 100 decaying with 15% masked; one wsd schedule whose decay is the last phase."""
    from helpers import REPO
    from spanlm.pretrain.recipe import load_recipe

    phases = plan(load_recipe(REPO / "configs" / "pretrain" / f"{name}.yaml"))
    assert [(p.config.name, p.start, p.end) for p in phases] == [
        ("pretrain", 0, 400),
        ("extend", 400, 500),
        ("decay", 500, 600),
    ]
    assert [p.recipe.data.max_len for p in phases] == [128, 256, 256]
    assert [p.recipe.model.rope_theta for p in phases] == [10000, 160000, 160000]
    assert [getattr(p.recipe.masking, masking).rate for p in phases] == [0.3, 0.3, 0.15]
    assert {(p.recipe.train.schedule, p.recipe.train.decay_share, p.recipe.train.schedule_steps) for p in phases} == {
        ("wsd", 100 / 600, 600)
    }


def test_preview_at_a_step_shows_its_phase_and_masks_with_its_settings(embedded_prepared, tmp_path, capsys):
    import yaml

    from spanlm.cli import main
    from spanlm.config import to_dict

    recipe = to_dict(phased(embedded_prepared, tmp_path / "run"))
    path = tmp_path / "phased.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    ratios = {}
    for step in (1, 8):
        assert main(["preview", str(path), "--n", "0", "--stats-blocks", "64", "--step", str(step)]) == 0
        captured = capsys.readouterr()
        ratios[step] = json.loads(captured.out.strip().splitlines()[-1])["mask_ratio"]
        if step == 8:
            assert "step 8: phase decay (steps 8–10): masking.mlm.rate=0.1" in captured.err
    assert ratios[1] == pytest.approx(0.15, abs=0.02) and ratios[8] == pytest.approx(0.1, abs=0.02)


def test_preview_numbers_steps_as_metrics_jsonl_and_refuses_one_outside_the_run(embedded_prepared, tmp_path, capsys):
    """--step N is the N-th optimiser step, as the records and the log number it: a phase's last step is its own, the
    next one the next phase's first; a step the phases do not train is one line, exit 2."""
    import yaml

    from spanlm.cli import main
    from spanlm.config import to_dict

    path = tmp_path / "phased.yaml"
    path.write_text(yaml.safe_dump(to_dict(phased(embedded_prepared, tmp_path / "run"))), encoding="utf-8")
    preview = ["preview", str(path), "--n", "0", "--stats-blocks", "8", "--step"]
    for step, shown in [(4, "phase pretrain (steps 1–4)"), (5, "phase extend (steps 5–7)"), (10, "phase decay")]:
        assert main([*preview, str(step)]) == 0
        assert f"step {step}: {shown}" in capsys.readouterr().err
    assert main([*preview, "11"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "spanlm preview: error: --step 11: the phases train steps 1–10", err
