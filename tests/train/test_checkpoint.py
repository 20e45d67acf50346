"""Checkpoints under misuse: damaged files, weights of another shape, another tokenizer, branching
resumes, torn logs, refused starts — each a clear error or a kept promise, never lost work."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from spanlm.cli import main
from spanlm.errors import ConfigError, InputError
from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from spanlm.train.metrics import read_metrics
from toy_objective import losses, toy_recipe

QUIET = {"log": lambda *_: None}


def test_a_cut_checkpoint_is_passed_over_by_auto_and_named_when_given(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=4, save_every=2), **QUIET)
    weights = ckpt.step_dir(run, 4) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # cut off: its manifest says how long it was
    with pytest.raises(
        InputError,
        match=r"step-0000004: damaged checkpoint \(model.safetensors has 1000 of its \d+ bytes\); "
        r"an earlier checkpoint is whole: --resume .*step-0000002",
    ):
        pretrain(toy_recipe(prepared, run, max_steps=6, save_every=2), resume=str(ckpt.step_dir(run, 4)), **QUIET)
    messages = []
    pretrain(toy_recipe(prepared, run, max_steps=6, save_every=2), resume="auto", log=messages.append)
    assert any("step-0000004 is damaged (model.safetensors has 1000 of" in m and "passed over" in m for m in messages)
    assert any("resumed from" in m and "step-0000002" in m for m in messages)
    assert sorted(losses(run)) == [1, 2, 3, 4, 5, 6]


def test_a_file_damaged_within_its_size_is_named_with_an_earlier_checkpoint(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=4, save_every=2), **QUIET)
    weights = ckpt.step_dir(run, 4) / "model.safetensors"
    weights.write_bytes(b"\0" * weights.stat().st_size)  # the right size, unreadable content
    with pytest.raises(
        InputError, match=r"step-0000004/model.safetensors: unreadable checkpoint file.*--resume .*step-0000002"
    ):
        pretrain(toy_recipe(prepared, run, max_steps=6, save_every=2), resume="auto", **QUIET)


def test_weights_of_another_shape_are_a_clear_error(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    path = ckpt.step_dir(run, 2) / "model.safetensors"
    tensors = load_file(str(path))
    tensors["norm.weight"] = torch.ones(32)  # as if trained with hidden 32
    save_file(tensors, str(path))
    with pytest.raises(
        InputError,
        match=r"step-0000002: damaged checkpoint \(model.safetensors has \d+ of its \d+ bytes\), "
        "and no earlier one",
    ):
        pretrain(toy_recipe(prepared, run, max_steps=4), resume="auto", **QUIET)
    manifest = json.loads((path.parent / ckpt.MANIFEST).read_text())
    manifest["model.safetensors"] = path.stat().st_size  # as another recipe's checkpoint would say
    (path.parent / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(
        InputError,
        match=r"do not fit the model the recipe builds: 1 of another shape \(norm.weight \(32,\) here vs \(16,\)",
    ):
        pretrain(toy_recipe(prepared, run, max_steps=4), resume="auto", **QUIET)


def test_resuming_against_another_tokenizer_is_refused(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    state_path = ckpt.step_dir(run, 2) / "trainer_state.pt"
    state = torch.load(state_path, weights_only=True)
    assert state["tokenizer_fingerprint"] and len(state["tokenizer_fingerprint"]) == 16
    state["tokenizer_fingerprint"] = "0123456789abcdef"  # as if the corpus had been prepared again
    torch.save(state, state_path)
    with pytest.raises(
        InputError, match=r"trained on the ids of tokenizer 0123456789abcdef, but .* now holds tokenizer"
    ):
        pretrain(toy_recipe(prepared, run, max_steps=4), resume="auto", **QUIET)


def test_resuming_an_older_checkpoint_branches_the_run(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=4, save_every=1), **QUIET)
    old_branch = losses(run)
    pretrain(toy_recipe(prepared, run, max_steps=3, save_every=1), resume=str(ckpt.step_dir(run, 2)), **QUIET)
    # The old branch's step 4 is kept aside, with its metrics, and is no longer the latest.
    (aside,) = [p for p in (run / "checkpoints").iterdir() if p.name.startswith("superseded-")]
    assert (aside / "step-0000004" / ckpt.MARKER).is_file() and (aside / "metrics.jsonl").is_file()
    assert ckpt.latest_checkpoint(run) == ckpt.step_dir(run, 3)
    assert sorted(losses(run)) == [1, 2, 3]
    pretrain(toy_recipe(prepared, run, max_steps=5, save_every=1), resume="auto", **QUIET)
    assert sorted(losses(run)) == [1, 2, 3, 4, 5] and ckpt.latest_checkpoint(run) == ckpt.step_dir(run, 5)
    assert losses(run)[4] == old_branch[4]  # the same data and RNG from step 2: the branch repeats it exactly


def test_a_torn_last_metrics_line_does_not_block_resume_or_report(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"kind": "train", "step": 3, "lo')  # a kill mid-write
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert main(["report", str(run)]) == 0
    pretrain(toy_recipe(prepared, run, max_steps=3), resume="auto", **QUIET)
    assert sorted(losses(run)) == [1, 2, 3]
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('not json\n{"kind": "train", "step": 9, "loss": 1.0}\n')
    with pytest.raises(InputError, match=r"metrics.jsonl:4: not valid JSON"):
        read_metrics(run)


def test_a_refused_start_leaves_the_run_as_it_was(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    recipe = (run / "config.yaml").read_text()
    with pytest.raises(Exception, match="already holds a run"):
        pretrain(toy_recipe(prepared, run, max_steps=2, lr=0.5), **QUIET)
    assert (run / "config.yaml").read_text() == recipe


def test_resuming_at_or_past_max_steps_trains_and_writes_nothing(prepared, tmp_path):
    messages = []
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=4), **QUIET)
    latest = ckpt.latest_checkpoint(run)
    written = (latest / ckpt.MARKER).stat().st_mtime_ns
    pretrain(toy_recipe(prepared, run, max_steps=3), resume="auto", log=messages.append)
    assert any("nothing to train" in m for m in messages)
    assert ckpt.latest_checkpoint(run) == latest and (latest / ckpt.MARKER).stat().st_mtime_ns == written


@pytest.mark.parametrize(
    "override, message",
    [
        ({"save_every": 0}, "save_every must be at least 1"),
        ({"num_workers": -1}, "num_workers must not be negative"),
        ({"eval_every": -1}, "eval_every must not be negative"),
    ],
)
def test_train_settings_are_checked_before_training(prepared, tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        toy_recipe(prepared, tmp_path / "run", **override)


def test_a_corpus_smaller_than_one_batch_is_a_config_error(prepared, tmp_path):
    with pytest.raises(ConfigError, match="less than one batch of 100000: lower train.batch_size"):
        pretrain(toy_recipe(prepared, tmp_path / "run", batch_size=100000), **QUIET)


def test_an_unwritable_output_path_is_one_line(prepared, tmp_path, capsys):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main(["export", str(run), "--out", str(blocker / "export")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a_file" in err


def test_max_len_must_fit_the_position_table():
    from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel

    from spanlm.pretrain.run import check_max_len

    tiny = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8, vocab_size=10)
    holder = torch.nn.ModuleDict({"encoder": BertModel(BertConfig(max_position_embeddings=64, **tiny))})
    check_max_len(holder, 64)
    with pytest.raises(ConfigError, match="data.max_len 65 exceeds the 64 positions"):
        check_max_len(holder, 65)
    # RoBERTa numbers positions after the padding id: 66 table rows number 64 tokens.
    roberta = RobertaModel(RobertaConfig(max_position_embeddings=66, pad_token_id=1, **tiny))
    with pytest.raises(ConfigError, match="exceeds the 64 positions"):
        check_max_len(roberta, 65)
    # The noise scheme's rows grow past their blocks: they must fit the table too, and not be cut below the blocks.
    check_max_len(holder, 56, noise_max_len=64)
    with pytest.raises(ConfigError, match="masking.noise.max_len 72 exceeds the 64 positions"):
        check_max_len(holder, 56, noise_max_len=72)
    with pytest.raises(ConfigError, match="masking.noise.max_len 48 is less than data.max_len 56"):
        check_max_len(holder, 56, noise_max_len=48)


def test_a_data_position_in_an_earlier_format_is_a_clear_error(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    state_path = ckpt.step_dir(run, 2) / "trainer_state.pt"
    state = torch.load(state_path, weights_only=True)
    state["loaders"] = [{"_num_yielded": 2, "_sampler_iter_yielded": 2}]  # as torchdata's StatefulDataLoader wrote it
    torch.save(state, state_path)
    with pytest.raises(InputError, match="StatefulDataLoader state, written by an earlier spanlm"):
        pretrain(toy_recipe(prepared, run, max_steps=4), resume="auto", **QUIET)


def test_the_hint_for_a_damaged_checkpoint_names_only_an_earlier_one(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=4, save_every=2), **QUIET)
    weights = ckpt.step_dir(run, 2) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(InputError) as error:
        pretrain(toy_recipe(prepared, run, max_steps=6, save_every=2), resume=str(ckpt.step_dir(run, 2)), **QUIET)
    assert "damaged checkpoint" in str(error.value) and "step-0000004" not in str(error.value)


def test_fewer_training_examples_than_processes_is_a_config_error():
    import numpy as np

    from spanlm.train.loader import BatchKeySampler

    with pytest.raises(ConfigError, match="1 blocks cannot be split over 2 processes"):
        BatchKeySampler(np.arange(1), batch_size=1, seed=0, rank=0, world_size=2)


def test_a_changed_corpus_is_not_prepared_again_under_a_resume(prepared, tmp_path):
    import shutil

    from spanlm.data.shards import read_meta

    corpus = tmp_path / "corpus.txt"
    shutil.copy(toy_recipe(prepared, tmp_path).data.inputs[0], corpus)
    own = tmp_path / "prepared"

    def recipe(**train):
        r = toy_recipe(prepared, tmp_path / "run", **train)
        r.data.inputs, r.data.prepared_dir = [str(corpus)], str(own)
        return r

    pretrain(recipe(max_steps=2), **QUIET)
    before = read_meta(own)
    with open(corpus, "a", encoding="utf-8") as handle:
        handle.write("A line added after the run started.\n")
    with pytest.raises(
        InputError, match=r"preparing it again would train a new tokenizer.*set tokenizer.path=.*prepared/tokenizer"
    ):
        pretrain(recipe(max_steps=4), resume="auto", **QUIET)
    assert read_meta(own) == before  # untouched: the checkpoint can still resume once the inputs are restored
    # With the checkpoint's tokenizer kept, the changed inputs are prepared with it and the run resumes.
    kept = recipe(max_steps=4)
    shutil.copytree(own / "tokenizer", tmp_path / "kept_tokenizer")
    kept.tokenizer.path = str(tmp_path / "kept_tokenizer")
    pretrain(kept, resume="auto", **QUIET)
    assert sorted(losses(tmp_path / "run")) == [1, 2, 3, 4]
    assert read_meta(own)["tokenizer_fingerprint"] == before["tokenizer_fingerprint"]


def test_resuming_with_changed_settings_is_refused_listing_each(prepared, tmp_path, capsys):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    changed = toy_recipe(prepared, run, max_steps=4, batch_size=8, grad_accum=2, lr=0.5)
    changed.seed, changed.data.max_len = 7, 64
    with pytest.raises(InputError) as error:
        pretrain(changed, resume="auto", **QUIET)
    message = str(error.value)
    for change in (
        "seed: 0 → 7",
        "data.max_len: 32 → 64",
        "train.batch_size: 4 → 8",
        "train.grad_accum: 1 → 2",
        "train.lr: 0.01 → 0.5",
    ):
        assert change in message, change
    assert "--resume-weights-only" in message and "\n" not in message and "max_steps" not in message
    assert sorted(losses(run)) == [1, 2]  # nothing trained, nothing lost


def test_harmless_settings_may_change_on_resume(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    pretrain(
        toy_recipe(prepared, run, max_steps=3, log_every=2, save_every=5, eval_every=1, num_workers=1, keep_last=3),
        resume="auto",
        **QUIET,
    )
    assert ckpt.latest_checkpoint(run) == ckpt.step_dir(run, 3)


def test_a_changed_process_count_is_refused(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    state_path = ckpt.step_dir(run, 2) / "trainer_state.pt"
    state = torch.load(state_path, weights_only=True)
    state["world_size"], state["loaders"] = 2, state["loaders"] * 2  # as written by two processes
    torch.save(state, state_path)
    manifest = json.loads((state_path.parent / ckpt.MANIFEST).read_text())
    manifest["trainer_state.pt"] = state_path.stat().st_size
    (state_path.parent / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(
        InputError,
        match=r"changed settings would not continue the same run \(processes: 2 → 1\).*--resume-weights-only",
    ):
        pretrain(toy_recipe(prepared, run, max_steps=4), resume="auto", **QUIET)


def test_resume_weights_only_starts_a_new_run_from_the_weights(prepared, tmp_path, capsys):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    weights = load_file(str(ckpt.step_dir(run, 2) / "model.safetensors"))
    # Changed settings are fine; the new run starts at step 0 with the checkpoint's weights.
    new = pretrain(
        toy_recipe(prepared, tmp_path / "new", max_steps=1, batch_size=8, lr=1e-30, warmup_steps=0),
        weights_from=str(run),
        **QUIET,
    )
    assert sorted(losses(new)) == [1]
    after = load_file(str(ckpt.step_dir(new, 1) / "model.safetensors"))
    assert all(torch.equal(weights[k], after[k]) for k in weights)  # lr 1e-30: exactly the weights it started from
    with pytest.raises(Exception, match="already holds a run.*a run from another's weights starts at step 0"):
        pretrain(toy_recipe(prepared, run, max_steps=4, batch_size=8), weights_from=str(run), **QUIET)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((run / "config.yaml").read_text())
    code = main(
        ["pretrain", str(recipe), f"train.output_dir={tmp_path / 'cli'}", "seed=3", "--resume-weights-only", str(run)]
    )
    assert code == 0 and ckpt.latest_checkpoint(tmp_path / "cli") is not None
    assert main(["pretrain", str(recipe), "seed=3", "--resume", "auto"]) == 2
    assert "resuming with changed settings would not continue the same run (seed: 0 → 3)" in capsys.readouterr().err


class _RunsCode:
    """What a tampered checkpoint could hold: unpickling it would call ``marker.touch()``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("damage", ["tampered", "corrupt"])
def test_a_tampered_or_corrupt_state_file_is_refused_without_torchs_unsafe_hint(prepared, tmp_path, capsys, damage):
    """torch says re-loading with weights_only=False "will likely succeed": wrong for a corrupt file and, for a
    tampered one, the way to run its code. spanlm names the file as damaged or not its own."""
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), **QUIET)
    state, marker = ckpt.step_dir(run, 2) / "trainer_state.pt", tmp_path / "code-ran"
    if damage == "tampered":
        torch.save({"step": 2, "payload": _RunsCode(marker)}, state)
    else:
        state.write_bytes(b"PK\x03\x04" + b"\x00" * 200)
    with pytest.raises(ckpt.DamagedCheckpoint) as error:
        ckpt.load_file(state)
    message = str(error.value)
    assert message.startswith(f"{state}: damaged or not a spanlm checkpoint file")
    assert "weights_only" not in message and "succeed" not in message and not marker.exists()
    if damage == "tampered":
        assert "builtins.open" in message or "io.open" in message, message
