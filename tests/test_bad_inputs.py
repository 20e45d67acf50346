"""The bad-input table: every case builds one bad input in a temporary directory, runs the `spanlm` command
in-process and asserts what a user must get — exit code 2, exactly one stderr line ``spanlm <command>:
error: …`` naming the file (and line / field / key) and the problem, no traceback — and that nothing
written before (a prepared corpus, a model directory, an earlier output) changed.

Cases share a few fixtures built once (a tiny prepared corpus, a tiny NER model directory, a tiny QA model
directory); a case copies what it corrupts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from helpers import NER_FIXTURES, REPO, write_wnut_recipe
from spanlm.cli import main

QA_FIXTURES = REPO / "tests" / "fixtures" / "qa"
SQUAD = QA_FIXTURES / "squad_v2_sample.json"
CONLL_TRAIN, CONLL_DEV = NER_FIXTURES / "wnut_train_mini.conll", NER_FIXTURES / "wnut_dev_mini.conll"


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def small_prepared(tmp_path_factory) -> Path:
    """A prepared corpus of a few English lines (WordPiece, vocab 300)."""
    from helpers import ENGLISH, make_recipe
    from spanlm.data.prepare import prepare

    tmp = tmp_path_factory.mktemp("small_prepared")
    return prepare(make_recipe(tmp, {"english.txt": ENGLISH * 4}), log=lambda *_: None)


@pytest.fixture(scope="module")
def ner_model(tiny_encoder_dir, tmp_path_factory) -> Path:
    """The model/ directory of one step of `ner train` on the WNUT-17 fixtures."""
    out = tmp_path_factory.mktemp("ner_model") / "run"
    recipe = write_wnut_recipe(tiny_encoder_dir, out, steps=1)
    assert main(["ner", "train", str(recipe), "data.eval_docs=2"]) == 0
    return out / "model"


@pytest.fixture(scope="module")
def qa_model(tiny_encoder_dir, tmp_path_factory) -> Path:
    """The model/ directory of one step of `qa train` on the SQuAD v2.0 fixture."""
    out = tmp_path_factory.mktemp("qa_model") / "run"
    recipe = out.parent / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(qa_recipe(tiny_encoder_dir, out)), encoding="utf-8")
    assert main(["qa", "train", str(recipe)]) == 0
    return out / "model"


def pretrain_recipe(prepared: Path, out: Path) -> dict:
    inputs = [str(prepared.parent / "in" / "english.txt")]  # what the small corpus was prepared from
    return {
        "data": {"inputs": inputs, "prepared_dir": str(prepared), "max_len": 32},
        "tokenizer": {"vocab_size": 300, "min_frequency": 1},
        "objective": {"name": "mlm"},
        "model": {
            "hidden_size": 32,
            "num_layers": 1,
            "num_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
        },
        "train": {
            "output_dir": str(out),
            "max_steps": 1,
            "batch_size": 2,
            "num_workers": 0,
            "eval_every": 0,
            "save_every": 1,
            "device": "cpu",
        },
        "logging": {"report_to": [], "progress": False},
    }


@pytest.fixture(scope="module")
def pretrain_run(small_prepared, tmp_path_factory) -> Path:
    """The run directory of one step of `pretrain` (an MLM on the small prepared corpus)."""
    out = tmp_path_factory.mktemp("pretrain_run") / "run"
    recipe = out.parent / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(pretrain_recipe(small_prepared, out)), encoding="utf-8")
    assert main(["pretrain", str(recipe)]) == 0
    return out


def qa_recipe(encoder: Path, out: Path, **data) -> dict:
    return {
        "model": {"path": str(encoder)},
        "data": {
            "train": str(SQUAD),
            "dev": str(SQUAD),
            "max_length": 48,
            "doc_stride": 16,
            "max_query_length": 16,
            **data,
        },
        "qa": {"metric": "squad", "no_answer": True},
        "train": {
            "output_dir": str(out),
            "max_steps": 1,
            "batch_size": 4,
            "lr": 1e-3,
            "warmup_steps": 0,
            "eval_every": 0,
            "save_every": 1,
            "log_every": 1,
            "num_workers": 0,
            "device": "cpu",
        },
        "logging": {"report_to": [], "progress": False},
    }


def cls_recipe(encoder: Path, out: Path, **data) -> dict:
    sst2 = REPO / "data" / "cls" / "sst2"
    return {
        "model": {"path": str(encoder)},
        "data": {
            "train": str(sst2 / "dev.tsv"),
            "dev": str(sst2 / "dev.tsv"),
            "task": "sst2",
            "max_length": 32,
            **data,
        },
        "train": {
            "output_dir": str(out),
            "max_steps": 1,
            "batch_size": 4,
            "eval_every": 0,
            "save_every": 1,
            "num_workers": 0,
            "device": "cpu",
        },
        "logging": {"report_to": [], "progress": False},
    }


FIXTURE_NAMES = {
    "prepared": "small_prepared",
    "pretrain_run": "pretrain_run",
    "encoder": "tiny_encoder_dir",
    "ner_model": "ner_model",
    "qa_model": "qa_model",
}


@dataclasses.dataclass
class Ctx:
    """What a case builds in: its own temporary directory and the shared fixtures (copied before corrupting)."""

    tmp: Path
    request: pytest.FixtureRequest

    def fixture(self, name: str) -> Path:
        return self.request.getfixturevalue(FIXTURE_NAMES[name])

    def file(self, name: str, content: str | bytes) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return path

    def copy(self, fixture: str, name: str | None = None) -> Path:
        out = self.tmp / (name or fixture)
        shutil.copytree(self.fixture(fixture), out)
        return out

    def folder_(self, name: str) -> Path:
        path = self.tmp / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def recipe(self, data: dict, name: str = "recipe.yaml") -> Path:
        return self.file(name, yaml.safe_dump(data, allow_unicode=True))

    def pretrain_recipe(self, **train) -> Path:
        recipe = pretrain_recipe(self.copy("prepared"), self.tmp / "run")
        recipe["data"]["inputs"] = [
            str(self.fixture("prepared").parent / "in" / "english.txt")
        ]  # what it was prepared from
        recipe["train"].update(train)
        return self.recipe(recipe)

    def ner_recipe(self, train: Path | str = CONLL_TRAIN, dev: Path | str = CONLL_DEV, **data) -> Path:
        path = write_wnut_recipe(self.fixture("encoder"), self.tmp / "run", steps=1)
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
        recipe["data"].update({"train": str(train), "dev": str(dev), **data})
        return self.recipe(recipe, "ner.yaml")

    def qa_recipe(self, **data) -> Path:
        return self.recipe(qa_recipe(self.fixture("encoder"), self.tmp / "run", **data), "qa.yaml")

    def cls_recipe(self, **data) -> Path:
        return self.recipe(cls_recipe(self.fixture("encoder"), self.tmp / "run", **data), "cls.yaml")


@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[Ctx], tuple[list, list[str]]]  # → (argv, what the error line must contain besides the command)


CASES: list[Case] = []


def case(name: str):
    def register(build):
        CASES.append(Case(name, build))
        return build

    return register


def squad(context: str, qas: list[dict]) -> str:
    return json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]})


def question(qid: str, text: str, start: int, q: str = "Which one?") -> dict:
    return {"id": qid, "question": q, "answers": [{"text": text, "answer_start": start}], "is_impossible": False}


CONTEXT = "The lighthouse on Gull Island was built in 1858 by the harbour board, and painted red in 1858 again."


# ---- recipes and overrides, for each recipe kind ------------------------------------------------------------

for kind, command in (
    ("pretrain", ["pretrain"]),
    ("ner", ["ner", "train"]),
    ("qa", ["qa", "train"]),
    ("cls", ["cls", "train"]),
):

    def build_recipe(ctx: Ctx, kind=kind):
        return {"pretrain": ctx.pretrain_recipe, "ner": ctx.ner_recipe, "qa": ctx.qa_recipe, "cls": ctx.cls_recipe}[
            kind
        ]()

    for label, override, expected in (
        ("negative_lr", "train.lr=-0.001", ["'train': lr", "positive"]),
        ("nan_lr", "train.lr=.nan", ["config key 'train.lr' must be a number, got nan"]),
        ("batch_size_zero", "train.batch_size=0", ["batch_size", "at least 1"]),
        ("unknown_key", "train.max_stpes=3", ["train.max_stpes", "unknown"]),
        ("wrong_type", "train.max_steps=many", ["train.max_steps", "int"]),
        ("bool_for_int", "train.max_steps=true", ["train.max_steps", "int"]),
        ("bad_choice", "train.optimizer=sgd", ["train.optimizer", "one of"]),
        ("negative_weight_decay", "train.weight_decay=-1", ["'train': weight_decay", "negative"]),
        ("betas_out_of_range", "train.betas=[0.9,1.5]", ["'train': betas", "[0, 1)"]),
        ("negative_seed", "seed=-1", ["recipe: config key 'seed'", "non-negative", "-1"]),
    ):

        def build(ctx: Ctx, command=command, build_recipe=build_recipe, override=override, expected=expected):
            recipe = build_recipe(ctx)
            return [*command, recipe, override], [*expected]

        case(f"{kind}_{label}")(build)

    def build_missing(ctx: Ctx, command=command):
        return [*command, ctx.tmp / "nope.yaml"], [str(ctx.tmp / "nope.yaml"), "does not exist"]

    case(f"{kind}_recipe_missing")(build_missing)

    def build_dir(ctx: Ctx, command=command):
        return [*command, ctx.tmp], [str(ctx.tmp), "is a directory"]

    case(f"{kind}_recipe_is_directory")(build_dir)

    def build_binary(ctx: Ctx, command=command):
        path = ctx.file("recipe.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
        return [*command, path], [str(path), "not"]

    case(f"{kind}_recipe_binary")(build_binary)


@case("pretrain_rate_schedule_rate_out_of_range")
def _(ctx: Ctx):
    schedule = "masking.rate_schedule={kind: linear, steps: [0, 10], rates: [0.3, 1.2]}"
    return ["pretrain", ctx.pretrain_recipe(), schedule], ["rate_schedule.rates", "(0, 1)", "1.2"]


@case("pretrain_rate_schedule_steps_backwards")
def _(ctx: Ctx):
    schedule = "masking.rate_schedule={kind: piecewise, steps: [0, 10, 5], rates: [0.3, 0.15, 0.05]}"
    return ["pretrain", ctx.pretrain_recipe(), schedule], ["rate_schedule.steps", "5 after 10"]


@case("pretrain_window_the_family_lacks")
def _(ctx: Ctx):
    return ["pretrain", ctx.pretrain_recipe(), "model.local_attention=64"], [
        "local_attention is a setting of the modernbert family",
        "family bert has none",
    ]


@case("pretrain_unknown_family")
def _(ctx: Ctx):
    return ["pretrain", ctx.pretrain_recipe(), "model.family=modernbert2"], ["model.family", "one of"]


@case("pretrain_wsd_unknown_shape")
def _(ctx: Ctx):
    return ["pretrain", ctx.pretrain_recipe(), "train.schedule=wsd", "train.decay_shape=sqrt"], [
        "train.decay_shape",
        "one of",
    ]


@case("pretrain_dropout_one")
def _(ctx):
    return ["pretrain", ctx.pretrain_recipe(), "model.hidden_dropout=1.0"], ["hidden_dropout", "[0, 1)"]


@case("ner_dropout_one")
def _(ctx):
    return ["ner", "train", ctx.ner_recipe(), "model.dropout=1.0"], ["model", "dropout", "[0, 1)"]


@case("pretrain_max_len_2")
def _(ctx):
    return ["pretrain", ctx.pretrain_recipe(), "data.max_len=2"], ["data", "max_len"]


@case("ner_max_len_2")
def _(ctx):
    return ["ner", "train", ctx.ner_recipe(), "data.max_len=2"], ["data", "max_len"]


@case("qa_max_length_2")
def _(ctx):
    return ["qa", "train", ctx.qa_recipe(), "data.max_length=2"], ["data", "max_length"]


@case("qa_unknown_nested_key")
def _(ctx):
    return ["qa", "train", ctx.qa_recipe(), "qa.metrik=squad"], ["qa.metrik", "unknown"]


@case("ner_wrong_type_labels")
def _(ctx):
    return ["ner", "train", ctx.ner_recipe(), "data.labels=person"], ["data.labels", "list"]


@case("override_without_equals")
def _(ctx):
    return ["pretrain", ctx.pretrain_recipe(), "train.max_steps"], ["train.max_steps", "section.key=value"]


@case("ner_stride_not_below_window")
def _(ctx):
    return ["ner", "train", ctx.ner_recipe(), "data.stride=40"], ["data.stride", "less than"]


@case("qa_query_longer_than_window")
def _(ctx):
    return ["qa", "train", ctx.qa_recipe(), "data.max_query_length=48"], ["max_query_length", "max_length"]


@case("pretrain_heads_do_not_divide_hidden")
def _(ctx):
    return ["pretrain", ctx.pretrain_recipe(), "model.num_heads=3"], ["num_heads", "hidden_size"]


@case("ner_model_path_missing")
def _(ctx):
    return ["ner", "train", ctx.ner_recipe(), f"model.path={ctx.tmp / 'nowhere'}"], [str(ctx.tmp / "nowhere")]


@case("qa_model_path_is_a_file")
def _(ctx):
    path = ctx.file("encoder.bin", b"\x00" * 64)
    return ["qa", "train", ctx.qa_recipe(), f"model.path={path}"], [str(path)]


@case("prepare_tokenizer_path_without_tokenizer")
def _(ctx):
    empty = ctx.tmp / "tokenizer"
    empty.mkdir()
    good = ctx.file("good.txt", "Some words here.\n" * 20)
    return ["prepare", prepare_recipe(ctx, good), f"tokenizer.path={empty}"], [str(empty), "tokenizer"]


@case("recipe_not_a_mapping")
def _(ctx):
    path = ctx.file("recipe.yaml", "- a\n- b\n")
    return ["pretrain", path], [str(path), "mapping"]


@case("recipe_invalid_yaml")
def _(ctx):
    path = ctx.file("recipe.yaml", "train: {max_steps: 3\n")
    return ["pretrain", path], [str(path), "YAML"]


@case("pretrain_output_dir_is_a_file")
def _(ctx):
    blocker = ctx.file("blocker", "keep me")
    return ["pretrain", ctx.pretrain_recipe(output_dir=str(blocker / "run"))], [str(blocker)]


@case("ner_output_dir_is_a_file")
def _(ctx):
    blocker = ctx.file("blocker", "keep me")
    return ["ner", "train", ctx.ner_recipe(), f"train.output_dir={blocker}"], [str(blocker)]


# ---- prepare --------------------------------------------------------------------------------------------


def prepare_recipe(ctx: Ctx, *inputs: Path, **data) -> Path:
    """A recipe preparing ``inputs`` over a copy of the small prepared corpus (which must survive a failure)."""
    prepared = ctx.copy("prepared")
    return ctx.recipe(
        {
            "data": {"inputs": [str(p) for p in inputs], "prepared_dir": str(prepared), **data},
            "tokenizer": {"vocab_size": 300, "min_frequency": 1},
        }
    )


@case("prepare_input_missing")
def _(ctx):
    path = ctx.tmp / "missing.txt"
    return ["prepare", prepare_recipe(ctx, path)], [str(path)]


@case("prepare_input_is_directory")
def _(ctx):
    path = ctx.tmp / "folder.txt"
    path.mkdir()
    return ["prepare", prepare_recipe(ctx, path)], [str(path), "is a directory"]


@case("prepare_invalid_utf8")
def _(ctx):
    path = ctx.file("bad.txt", b"good line one\ngood line two\nbad \xff\xfe line\n")
    return ["prepare", prepare_recipe(ctx, path)], [f"{path}:3", "UTF-8"]


@case("prepare_binary_file")
def _(ctx):
    path = ctx.file("image.txt", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    return ["prepare", prepare_recipe(ctx, path)], [str(path)]


@case("prepare_empty_file")
def _(ctx):
    path = ctx.file("empty.txt", "")
    return ["prepare", prepare_recipe(ctx, path)], [str(path), "empty"]


@case("prepare_long_line_without_spaces")
def _(ctx):
    path = ctx.file("long.txt", "The first line is fine.\n" + "abcdefghij" * 500_000 + "\n")
    return ["prepare", prepare_recipe(ctx, path)], [f"{path}:2", "without whitespace"]


@case("prepare_jsonl_broken_json")
def _(ctx):
    path = ctx.file("docs.jsonl", '{"text": "fine"}\n{"text": "broken\n')
    return ["prepare", prepare_recipe(ctx, path)], [f"{path}:2", "JSON"]


@case("prepare_jsonl_missing_field")
def _(ctx):
    path = ctx.file("docs.jsonl", '{"text": "fine"}\n{"body": "no text"}\n')
    return ["prepare", prepare_recipe(ctx, path)], [f"{path}:2", "text"]


@case("prepare_jsonl_lone_surrogate")
def _(ctx):
    path = ctx.file("docs.jsonl", '{"text": "fine"}\n{"text": "hello \\ud800 world"}\n')
    return ["prepare", prepare_recipe(ctx, path)], [f"{path}:2", "lone surrogate"]


def prepare_into(ctx: Ctx, prepared_dir: Path) -> Path:
    """A recipe preparing a few good lines into ``prepared_dir`` (which must survive a refusal)."""
    good = ctx.file("good.txt", "Some words here.\n" * 20)
    return ctx.recipe(
        {"data": {"inputs": [str(good)], "prepared_dir": str(prepared_dir)}, "tokenizer": {"vocab_size": 300}}
    )


@case("prepare_into_a_training_run")
def _(ctx):
    run, _ = run_copy(ctx)
    return ["prepare", prepare_into(ctx, run)], [str(run), "not a prepared corpus"]


@case("prepare_into_a_folder_of_shards")
def _(ctx):
    shutil.copytree(ctx.fixture("prepared"), ctx.tmp / "corpus" / "shard-00000-of-00001")
    return ["prepare", prepare_into(ctx, ctx.tmp / "corpus"), "--force"], [
        str(ctx.tmp / "corpus"),
        "not a prepared corpus",
    ]


@case("prepare_jsonl_wrong_type")
def _(ctx):
    path = ctx.file("docs.jsonl", '{"text": "fine"}\n{"text": 42}\n')
    return ["prepare", prepare_recipe(ctx, path)], [f"{path}:2", "text"]


@case("prepare_prepared_dir_is_a_file")
def _(ctx):
    blocker = ctx.file("blocker", "keep me")
    return ["prepare", prepare_into(ctx, blocker)], [str(blocker)]


@case("prepare_no_inputs")
def _(ctx):
    return ["prepare", prepare_recipe(ctx)], ["data.inputs"]


# ---- pretrain and export ------------------------------------------------------------------------------------


@case("pretrain_prepared_dir_is_a_file")
def _(ctx):
    blocker = ctx.file("blocker", "keep me")
    return ["pretrain", ctx.pretrain_recipe(), f"data.prepared_dir={blocker}"], [str(blocker)]


@case("pretrain_resume_missing")
def _(ctx):
    return ["pretrain", ctx.pretrain_recipe(), "--resume", ctx.tmp / "nothing"], [str(ctx.tmp / "nothing")]


@case("export_checkpoint_missing")
def _(ctx):
    return ["export", ctx.tmp / "nothing", "--out", ctx.tmp / "out"], [str(ctx.tmp / "nothing")]


@case("export_empty_run_dir")
def _(ctx):
    run = ctx.tmp / "run"
    run.mkdir()
    return ["export", run, "--out", ctx.tmp / "out"], [str(run), "checkpoint"]


@case("export_checkpoint_is_a_file")
def _(ctx):
    path = ctx.file("checkpoint", "not a checkpoint")
    return ["export", path, "--out", ctx.tmp / "out"], [str(path)]


def run_copy(ctx: Ctx) -> tuple[Path, Path]:
    """A copy of the pretraining run and its latest checkpoint."""
    from spanlm.train.checkpoint import latest_checkpoint

    run = ctx.copy("pretrain_run", "run")
    return run, latest_checkpoint(run)


def as_saved(checkpoint: Path) -> None:
    """Record the checkpoint's files in its manifest as they are now: a checkpoint written that way (e.g. by a run
    whose weights went NaN), not one damaged afterwards (which the manifest catches: the truncated case)."""
    manifest = checkpoint / "manifest.json"
    sizes = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({name: (checkpoint / name).stat().st_size for name in sizes}))


@case("export_checkpoint_nan_weight")
def _(ctx):
    run, checkpoint = run_copy(ctx)
    name = poison(checkpoint / "model.safetensors")
    as_saved(checkpoint)
    return ["export", run, "--out", ctx.tmp / "out"], [str(checkpoint / "model.safetensors"), name, "non-finite"]


@case("export_checkpoint_truncated_weights")
def _(ctx):
    run, checkpoint = run_copy(ctx)
    truncate(checkpoint / "model.safetensors")
    return ["export", run, "--out", ctx.tmp / "out"], [str(checkpoint / "model.safetensors"), "bytes", "damaged"]


@case("export_out_is_a_file")
def _(ctx):
    run, _ = run_copy(ctx)
    blocker = ctx.file("out", "keep me")
    return ["export", run, "--out", blocker], [str(blocker)]


@case("export_out_is_a_directory_of_other_things")
def _(ctx):
    run, _ = run_copy(ctx)
    folder = ctx.tmp / "documents"
    ctx.file("documents/thesis.tex", "keep me")
    return ["export", run, "--out", folder], [str(folder), "not an earlier spanlm export"]


@case("export_out_is_another_training_run")
def _(ctx):
    run, _ = run_copy(ctx)
    other = ctx.copy("pretrain_run", "other-run")  # config.yaml, checkpoints/, metrics.jsonl: all would go
    return ["export", run, "--out", other], [str(other), "not an earlier spanlm export"]


@case("export_out_is_a_transformers_checkpoint")
def _(ctx):
    run, _ = run_copy(ctx)
    ctx.file("bert-base/config.json", "{}")
    ctx.file("bert-base/model.safetensors", b"weights")
    return ["export", run, "--out", ctx.tmp / "bert-base"], [str(ctx.tmp / "bert-base"), "not an earlier spanlm export"]


@case("export_out_is_a_project_with_a_recipe")
def _(ctx):
    run, _ = run_copy(ctx)
    ctx.file("project/config.yaml", "seed: 0\n")
    ctx.file("project/thesis.tex", "keep me")
    return ["export", run, "--out", ctx.tmp / "project"], [str(ctx.tmp / "project"), "not an earlier spanlm export"]


@case("export_out_is_an_export_with_notes")
def _(ctx):
    run, _ = run_copy(ctx)
    for name in ("spanlm_objective.json", "config.json", "config.yaml", "model.safetensors"):
        ctx.file(f"exported/{name}", "{}")
    ctx.file("exported/NOTES.txt", "keep me")
    return ["export", run, "--out", ctx.tmp / "exported"], [str(ctx.tmp / "exported"), "also holds NOTES.txt"]


@case("export_of_a_fine_tuning_run")
def _(ctx):
    run, checkpoint = run_copy(ctx)
    recipe = yaml.safe_load((checkpoint / "config.yaml").read_text(encoding="utf-8"))
    (checkpoint / "config.yaml").write_text(yaml.safe_dump({**recipe, "ner": {"threshold": 0.0}}), encoding="utf-8")
    as_saved(checkpoint)
    return ["export", run, "--out", ctx.tmp / "out"], ["a `spanlm ner train` run", str(run / "model")]


@case("export_over_an_earlier_export_fails_cleanly")
def _(ctx):
    run, checkpoint = run_copy(ctx)
    earlier = ctx.tmp / "exported"
    earlier.mkdir()
    for name in ("spanlm_objective.json", "config.json"):  # an earlier export: must survive the failed one
        (earlier / name).write_text("{}")
    poison(checkpoint / "model.safetensors")
    as_saved(checkpoint)
    return ["export", run, "--out", earlier], [str(checkpoint / "model.safetensors"), "non-finite"]


@case("ner_train_encoder_nan_weight")
def _(ctx):
    encoder = ctx.copy("encoder", "encoder")
    name = poison(encoder / "model.safetensors")
    recipe = ctx.ner_recipe()
    return ["ner", "train", recipe, f"model.path={encoder}"], [str(encoder / "model.safetensors"), name, "non-finite"]


@case("ner_train_encoder_tokenizer_past_embeddings")
def _(ctx):
    encoder = ctx.copy("encoder", "encoder")
    other_tokenizer(ctx, encoder, size_delta=40)
    return ["ner", "train", ctx.ner_recipe(), f"model.path={encoder}"], [str(encoder), "embedding"]


@case("ner_train_encoder_only_pickle")
def _(ctx):
    import torch

    encoder = ctx.copy("encoder", "encoder")
    (encoder / "model.safetensors").unlink()
    torch.save({"weight": torch.zeros(2)}, encoder / "pytorch_model.bin")
    return ["ner", "train", ctx.ner_recipe(), f"model.path={encoder}"], [str(encoder), "pickled"]


# ---- NER train -----------------------------------------------------------------------------------------------

CONLL_OK = "Holmes\tB-person\nmet\tO\nWatson\tB-person\n\nParis\tB-location\nis\tO\nbig\tO\n"


@case("ner_train_missing")
def _(ctx):
    return ["ner", "train", ctx.ner_recipe(train=ctx.tmp / "missing.conll")], [str(ctx.tmp / "missing.conll")]


@case("ner_train_is_directory")
def _(ctx):
    folder = ctx.tmp / "train.conll"
    folder.mkdir()
    return ["ner", "train", ctx.ner_recipe(train=folder)], [str(folder), "is a directory"]


@case("ner_conll_invalid_utf8_line")
def _(ctx):
    path = ctx.file("train.conll", CONLL_OK.encode() + b"caf\xe9\tO\n")
    return ["ner", "train", ctx.ner_recipe(train=path)], [f"{path}:8:", "UTF-8"]


@case("ner_conll_missing_column")
def _(ctx):
    path = ctx.file("train.conll", CONLL_OK + "lonely\n")
    return ["ner", "train", ctx.ner_recipe(train=path)], [f"{path}:8:", "column"]


@case("ner_conll_bad_tag")
def _(ctx):
    path = ctx.file("train.conll", CONLL_OK + "\nLondon\tX-location\n")
    return ["ner", "train", ctx.ner_recipe(train=path)], [f"{path}:9:", "X-location"]


@case("ner_conll_unknown_label")
def _(ctx):
    path = ctx.file("train.conll", CONLL_OK + "\nLondon\tB-city\n")
    return ["ner", "train", ctx.ner_recipe(train=path), "data.labels=[person,location]"], [str(path), "city"]


@case("ner_train_empty")
def _(ctx):
    path = ctx.file("train.conll", "")
    return ["ner", "train", ctx.ner_recipe(train=path)], [str(path)]


@case("ner_dev_empty")
def _(ctx):
    path = ctx.file("dev.conll", "\n\n")
    return ["ner", "train", ctx.ner_recipe(dev=path)], [str(path)]


@case("ner_train_binary")
def _(ctx):
    path = ctx.file("train.conll", b"\x00\x01\x02PK\x03\x04" + bytes(range(256)))
    return ["ner", "train", ctx.ner_recipe(train=path)], [str(path)]


@case("ner_jsonl_wrong_types")
def _(ctx):
    path = ctx.file("train.jsonl", '{"text": "Holmes met Watson", "entities": "Holmes"}\n')
    return ["ner", "train", ctx.ner_recipe(train=path, format="jsonl")], [f"{path}:1", "entities"]


@case("ner_jsonl_entity_out_of_range")
def _(ctx):
    path = ctx.file("train.jsonl", '{"text": "Holmes", "entities": [{"start": 0, "end": 60, "label": "person"}]}\n')
    return ["ner", "train", ctx.ner_recipe(train=path, format="jsonl")], [f"{path}:1"]


# ---- NER model directories: eval / predict --------------------------------------------------------------------


def truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def poison(path: Path, tensor: str | None = None) -> str:
    """Set one value of a tensor of the safetensors file ``path`` to NaN; returns the tensor's name."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    name = tensor or sorted(n for n, t in tensors.items() if t.is_floating_point())[0]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})
    return name


def other_tokenizer(ctx: Ctx, model: Path, size_delta: int = 0) -> None:
    """Replace the tokenizer of ``model`` by one trained on other text (``size_delta`` more tokens than the
    embedding rows allow)."""
    from transformers import AutoConfig

    from spanlm.data.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer

    rows = AutoConfig.from_pretrained(str(model)).vocab_size
    texts = ["zebra quartz lumberjack xylophone " * 3, "völlig andere wörter hier"] * 50
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=rows + size_delta, min_frequency=1))
    if len(tokenizer) < rows + size_delta:
        tokenizer.add_tokens([f"extra{i}" for i in range(rows + size_delta - len(tokenizer))])
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (model / name).unlink(missing_ok=True)
    save_tokenizer(tokenizer, model)


def ner_eval(model: Path, data: Path = CONLL_DEV, *extra) -> list:
    return ["ner", "eval", model, "--data", data, "--output", model.parent / "eval.json", *extra]


@case("ner_model_missing")
def _(ctx):
    return ner_eval(ctx.tmp / "nothing"), [str(ctx.tmp / "nothing")]


@case("ner_model_truncated_safetensors")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    truncate(model / "model.safetensors")
    return ner_eval(model), [str(model / "model.safetensors")]


@case("ner_model_truncated_head")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    truncate(model / "ner_head.safetensors")
    return ner_eval(model), [str(model / "ner_head.safetensors")]


@case("ner_model_only_pickle")
def _(ctx):
    import torch

    model = ctx.copy("ner_model", "model")
    (model / "model.safetensors").unlink()
    torch.save({"weight": torch.zeros(2)}, model / "pytorch_model.bin")
    return ner_eval(model), [str(model), "pytorch_model.bin", "safetensors"]


@case("ner_model_nan_encoder_weight")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    name = poison(model / "model.safetensors")
    return ner_eval(model), [str(model / "model.safetensors"), name, "non-finite"]


@case("ner_model_nan_head_weight")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    name = poison(model / "ner_head.safetensors")
    return ner_eval(model), [str(model / "ner_head.safetensors"), name, "non-finite"]


@case("ner_model_tokenizer_past_embeddings")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    other_tokenizer(ctx, model, size_delta=50)
    return ner_eval(model), [str(model), "embedding"]


@case("ner_model_other_tokenizer")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    other_tokenizer(ctx, model, size_delta=-100)
    return ner_eval(model), [str(model), "tokenizer", "not the one"]


@case("ner_model_labels_broken")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    (model / "labels.json").write_text('["person", ', encoding="utf-8")
    return ner_eval(model), [str(model / "labels.json"), "JSON"]


@case("ner_model_labels_wrong_type")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    (model / "labels.json").write_text('{"person": 0}', encoding="utf-8")
    return ner_eval(model), [str(model / "labels.json"), "list"]


@case("ner_model_recipe_missing")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    (model / "recipe.yaml").unlink()
    return ner_eval(model), [str(model), "recipe.yaml"]


@case("ner_model_config_broken")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    (model / "config.json").write_text("{", encoding="utf-8")
    return ner_eval(model), [str(model / "config.json")]


@case("ner_model_is_a_file")
def _(ctx):
    path = ctx.file("model", "not a model")
    return ner_eval(path), [str(path)]


@case("ner_eval_unknown_label")
def _(ctx):
    path = ctx.file("dev.conll", "Holmes\tB-wizard\nmet\tO\n")
    return ner_eval(ctx.copy("ner_model", "model"), path, "--on-bad-record", "error"), [f"{path}:1", "wizard"]


@case("ner_eval_data_is_directory")
def _(ctx):
    folder = ctx.tmp / "dev.conll"
    folder.mkdir()
    return ner_eval(ctx.copy("ner_model", "model"), folder), [str(folder), "is a directory"]


@case("ner_eval_output_dir_missing")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    return ["ner", "eval", model, "--data", CONLL_DEV, "--output", ctx.tmp / "no" / "eval.json"], [
        str(ctx.tmp / "no" / "eval.json")
    ]


@case("ner_predict_input_is_directory")
def _(ctx):
    folder = ctx.tmp / "texts.jsonl"
    folder.mkdir()
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--input", folder], [str(folder), "is a directory"]


@case("ner_predict_invalid_utf8")
def _(ctx):
    path = ctx.file("texts.txt", b"fine text\nmore fine text\n\xc3\x28 broken\n")
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--input", path], [f"{path}:3", "UTF-8"]


@case("ner_predict_jsonl_text_wrong_type")
def _(ctx):
    path = ctx.file("texts.jsonl", '{"text": "fine"}\n{"text": ["not", "a", "string"]}\n')
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--input", path], [f"{path}:2", "text"]


@case("ner_predict_jsonl_missing_text")
def _(ctx):
    path = ctx.file("texts.jsonl", '{"body": "fine"}\n')
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--input", path], [f"{path}:1", "text"]


# ---- QA -----------------------------------------------------------------------------------------------------


def qa_eval(ctx: Ctx, data: Path) -> list:
    return ["qa", "eval", ctx.copy("qa_model", "model"), "--data", data]


def qa_train_on(ctx: Ctx, data: Path) -> list:
    return ["qa", "train", ctx.qa_recipe(train=str(data))]


@case("qa_train_answer_start_off")
def _(ctx):
    path = ctx.file("train.json", squad(CONTEXT, [question("q2", "harbour board", 3)]))
    return qa_train_on(ctx, path), [str(path), "id q2", "answer_start 3 is off", "occurs at 55"]


@case("qa_train_answer_occurs_far_from_start")
def _(ctx):
    path = ctx.file("train.json", squad(CONTEXT, [question("q7", "painted red", 30)]))
    return qa_train_on(ctx, path), [str(path), "id q7", "answer_start 30 is off", "occurs at"]


@case("qa_train_answer_not_in_context")
def _(ctx):
    path = ctx.file("train.json", squad(CONTEXT, [question("q9", "a castle", 5)]))
    return qa_train_on(ctx, path), [str(path), "id q9", "does not occur"]


@case("qa_not_json")
def _(ctx):
    path = ctx.file("dev.json", '{"data": [\n  oops\n]}')
    return qa_eval(ctx, path), [f"{path}:2", "JSON"]


@case("qa_not_squad")
def _(ctx):
    path = ctx.file("dev.json", '{"questions": []}')
    return qa_eval(ctx, path), [str(path), "'data'"]


@case("qa_context_wrong_type")
def _(ctx):
    path = ctx.file(
        "dev.json", json.dumps({"data": [{"paragraphs": [{"context": 7, "qas": [question("q1", "7", 0)]}]}]})
    )
    return qa_eval(ctx, path), [str(path), "context"]


@case("qa_missing_answers_field")
def _(ctx):
    path = ctx.file("dev.json", squad(CONTEXT, [{"id": "q3", "question": "When?"}]))
    return qa_eval(ctx, path), [str(path), "id q3", "missing 'answers'"]


@case("qa_empty_file")
def _(ctx):
    path = ctx.file("dev.json", "")
    return qa_eval(ctx, path), [str(path)]


@case("qa_data_is_directory")
def _(ctx):
    folder = ctx.tmp / "dev.json"
    folder.mkdir()
    return qa_eval(ctx, folder), [str(folder), "is a directory"]


@case("qa_empty_dev_set")
def _(ctx):
    path = ctx.file("dev.json", json.dumps({"data": []}))
    return ["qa", "train", ctx.qa_recipe(dev=str(path))], [str(path), "no usable question"]


@case("qa_train_invalid_utf8")
def _(ctx):
    path = ctx.file("train.json", b'{"data": [\n{"paragraphs": "\xff"}]}')
    return ["qa", "train", ctx.qa_recipe(train=str(path))], [f"{path}:2", "UTF-8"]


@case("qa_model_only_pickle")
def _(ctx):
    import torch

    model = ctx.copy("qa_model", "model")
    (model / "model.safetensors").unlink()
    torch.save({"weight": torch.zeros(2)}, model / "pytorch_model.bin")
    return ["qa", "eval", model, "--data", SQUAD], [str(model), "pytorch_model.bin"]


@case("qa_model_truncated_safetensors")
def _(ctx):
    model = ctx.copy("qa_model", "model")
    truncate(model / "model.safetensors")
    return ["qa", "eval", model, "--data", SQUAD], [str(model / "model.safetensors")]


@case("qa_model_nan_weight")
def _(ctx):
    model = ctx.copy("qa_model", "model")
    name = poison(model / "model.safetensors")
    return ["qa", "eval", model, "--data", SQUAD], [str(model / "model.safetensors"), name, "non-finite"]


@case("qa_model_threshold_wrong_type")
def _(ctx):
    model = ctx.copy("qa_model", "model")
    (model / "qa.json").write_text('{"no_answer_threshold": "high"}', encoding="utf-8")
    return ["qa", "eval", model, "--data", SQUAD], [str(model / "qa.json"), "no_answer_threshold"]


@case("qa_model_other_tokenizer")
def _(ctx):
    model = ctx.copy("qa_model", "model")
    other_tokenizer(ctx, model, size_delta=-100)
    return ["qa", "eval", model, "--data", SQUAD], [str(model), "tokenizer", "not the one"]


@case("ner_model_weights_of_another_architecture")
def _(ctx):
    import torch
    from safetensors.torch import save_file

    model = ctx.copy("ner_model", "model")
    save_file({"weight": torch.zeros(2)}, str(model / "model.safetensors"))
    return ner_eval(model), [str(model), "lack"]


@case("ner_model_head_of_another_model")
def _(ctx):
    import torch
    from safetensors.torch import save_file

    model = ctx.copy("ner_model", "model")
    save_file({"weight": torch.zeros(2)}, str(model / "ner_head.safetensors"))
    return ner_eval(model), [str(model / "ner_head.safetensors"), "does not fit"]


@case("qa_predict_missing_question")
def _(ctx):
    path = ctx.file("questions.jsonl", '{"context": "Some text."}\n')
    return ["qa", "predict", ctx.copy("qa_model", "model"), "--input", path], [f"{path}:1", "question"]


@case("qa_predict_empty_question")
def _(ctx):
    lines = '{"question": "Who?", "context": "Holmes."}\n{"question": " ", "context": "x"}\n'
    path = ctx.file("questions.jsonl", lines)
    return ["qa", "predict", ctx.copy("qa_model", "model"), "--input", path], [f"{path}:2", "empty question"]


@case("qa_predict_id_of_a_list")
def _(ctx):
    path = ctx.file("questions.jsonl", '{"id": [1], "question": "Who?", "context": "Holmes."}\n')
    return ["qa", "predict", ctx.copy("qa_model", "model"), "--input", path], [f"{path}:1", "'id' must be str or int"]


@case("qa_predict_input_is_directory")
def _(ctx):
    folder = ctx.tmp / "questions.jsonl"
    folder.mkdir()
    return ["qa", "predict", ctx.copy("qa_model", "model"), "--input", folder], [str(folder), "is a directory"]


def test_qa_eval_scores_every_question(qa_model, tmp_path, capsys):
    """An answer whose answer_start is off (too far to repair) keeps its question in the metric, scored on
    its text as the official scripts do; the notice names the file, the question and what is off."""
    path = tmp_path / "dev.json"
    path.write_text(
        squad(CONTEXT, [question("q1", "1858", 43), question("q2", "harbour board", 3), question("q3", "a castle", 5)])
    )
    code, out, err = run_cli(capsys, ["qa", "eval", qa_model, "--data", path, "--device", "cpu"])
    assert code == 0, err
    assert json.loads(out)["questions"] == 3
    assert (
        f"{path}: 2 answer(s) without a span" in err
        and "id q2: answer_start 3 is off: 'harbour board' occurs at 55" in err
    )
    assert "id q3: answer 'a castle' does not occur in the context" in err


def grapheme_bounds(text: str) -> set[int]:
    import regex

    return {match.start() for match in regex.finditer(r"\X", text)} | {len(text)}


def test_ner_predictions_keep_grapheme_clusters_whole(ner_model, tmp_path, capsys):
    """Every predicted entity (a threshold that makes every cell one) starts and ends on a grapheme cluster
    boundary: a combining accent (stripped by the normaliser, so in no token) stays with its base letter,
    an emoji sequence and CRLF stay whole; and the offsets index the text exactly."""
    texts = ["Cafe\u0301 Zoe\u0308 met Rene\u0301e .", "Holmes 👩\u200d🔬 Watson\r\nin London .", "Ǹ̈ x̧̌ y"]
    path = tmp_path / "texts.jsonl"
    path.write_text(
        "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8"
    )
    code, out, err = run_cli(
        capsys, ["ner", "predict", ner_model, "--input", path, "--threshold=-1e9", "--device", "cpu"]
    )
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in records] == texts
    cut = [
        (r["text"], e["start"], e["end"])
        for r in records
        for e in r["entities"]
        if not {e["start"], e["end"]} <= grapheme_bounds(r["text"])
    ]
    assert all(e["text"] == r["text"][e["start"] : e["end"]] for r in records for e in r["entities"])
    assert sum(len(r["entities"]) for r in records) > 0 and cut == []
    assert any(r["text"][e["start"] : e["end"]] == "Cafe\u0301" for r in records for e in r["entities"])


def test_ner_crlf_files_read_as_lf(tmp_path):
    """A CoNLL file with CRLF line ends reads exactly as with LF; a JSONL text with CRLF keeps its offsets."""
    from spanlm.ner.data import ReadOptions, read_documents

    conll = CONLL_TRAIN.read_text(encoding="utf-8")
    lf, crlf = tmp_path / "lf.conll", tmp_path / "crlf.conll"
    lf.write_bytes(conll.encode())
    crlf.write_bytes(conll.replace("\n", "\r\n").encode())
    assert read_documents(crlf, ReadOptions(format="conll"))[0] == read_documents(lf, ReadOptions(format="conll"))[0]
    text = "Holmes lives\r\nin London\r\n"
    jsonl = tmp_path / "crlf.jsonl"
    jsonl.write_text(
        json.dumps(
            {
                "text": text,
                "entities": [{"start": 0, "end": 6, "label": "person"}, {"start": 17, "end": 23, "label": "location"}],
            }
        )
        + "\r\n"
    )
    (document,), _ = read_documents(jsonl, ReadOptions(format="jsonl"))
    assert document.text == text and [text[e.start : e.end] for e in document.entities] == ["Holmes", "London"]


# ---- round two: damaged metadata, outputs onto inputs, special files, the other subcommands ----------------


@case("prepare_meta_json_not_json")
def _(ctx):
    recipe = ctx.pretrain_recipe()
    meta = ctx.tmp / "prepared" / "meta.json"
    meta.write_text('{"format_version": ', encoding="utf-8")
    return ["prepare", recipe], [str(meta), "not valid JSON", "--force"]


@case("pretrain_meta_json_not_utf8")
def _(ctx):
    recipe = ctx.pretrain_recipe()
    meta = ctx.tmp / "prepared" / "meta.json"
    meta.write_bytes(b"\xff\xfe{}")
    return ["pretrain", recipe], [str(meta), "not UTF-8", "--force"]


@case("pretrain_meta_json_a_list")
def _(ctx):
    recipe = ctx.pretrain_recipe()
    meta = ctx.tmp / "prepared" / "meta.json"
    meta.write_text("[]", encoding="utf-8")
    return ["pretrain", recipe], [str(meta), "a mapping expected"]


@case("pretrain_prepared_tokenizer_without_meta_json")
def _(ctx):
    recipe = ctx.pretrain_recipe()
    (ctx.tmp / "prepared" / "meta.json").unlink()
    return ["pretrain", recipe], [str(ctx.tmp / "prepared"), "no meta.json", "--force"]


@case("prepare_tokenizer_json_not_a_tokenizer")
def _(ctx):
    recipe = ctx.pretrain_recipe()
    tokenizer = ctx.copy("prepared", "other") / "tokenizer"
    (tokenizer / "tokenizer.json").write_text('{"version": "1.0"}', encoding="utf-8")
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    data["tokenizer"] = {"path": str(tokenizer)}
    data["data"]["prepared_dir"] = str(ctx.tmp / "new")
    return ["prepare", ctx.recipe(data, "tok.yaml")], [str(tokenizer / "tokenizer.json"), "not a tokenizer"]


@case("pretrain_runs_txt_not_utf8")
def _(ctx):
    recipe = ctx.pretrain_recipe(max_steps=1)
    ctx.file("prepared/runs.txt", b"/some/run\n\xff\xfe\n")
    return ["pretrain", recipe], [str(ctx.tmp / "prepared" / "runs.txt"), "not UTF-8"]


@case("pretrain_resume_trackers_json_not_utf8")
def _(ctx):
    run, _ = run_copy(ctx)
    prepared = ctx.copy("prepared")
    (prepared / "runs.txt").write_text(f"{run.resolve()}\n", encoding="utf-8")  # as training on it records
    recipe = pretrain_recipe(prepared, run)
    recipe["data"]["inputs"] = [str(ctx.fixture("prepared").parent / "in" / "english.txt")]
    recipe["train"]["max_steps"] = 2
    (run / "trackers.json").write_bytes(b'{"mlflow": "\xff"}')
    return ["pretrain", ctx.recipe(recipe), "--resume", "auto"], [str(run / "trackers.json"), "not UTF-8"]


@case("ner_model_tokenizer_json_not_a_tokenizer")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    (model / "tokenizer.json").write_text('{"truncation": null}', encoding="utf-8")
    return ner_eval(model), [str(model / "tokenizer.json"), "not a tokenizer"]


@case("qa_model_tokenizer_config_not_json")
def _(ctx):
    model = ctx.copy("qa_model", "model")
    (model / "tokenizer_config.json").write_text("{'single': 'quotes'}", encoding="utf-8")
    path = ctx.file("questions.jsonl", '{"question": "Who?", "context": "Holmes did."}\n')
    return ["qa", "predict", model, "--input", path], [str(model / "tokenizer_config.json"), "not valid JSON"]


def texts_file(ctx) -> Path:
    return ctx.file("texts.jsonl", '{"text": "Holmes met Watson in London ."}\n')


@case("ner_predict_output_is_the_input")
def _(ctx):
    path = texts_file(ctx)
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--input", path, "--output", path], [
        "--output is the input",
        str(path),
    ]


@case("ner_predict_output_is_a_link_to_the_input")
def _(ctx):
    path = texts_file(ctx)
    link = ctx.tmp / "link.jsonl"
    link.symlink_to(path)
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--input", path, "--output", link], [
        "--output is the input"
    ]


@case("ner_predict_output_is_a_hard_link_to_the_input")
def _(ctx):
    path = texts_file(ctx)
    link = ctx.tmp / "other-name.jsonl"
    link.hardlink_to(path)
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--input", path, "--output", link], [
        "--output is the input"
    ]


@case("ner_predict_output_onto_the_model")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    return ["ner", "predict", model, "--input", texts_file(ctx), "--output", model / "config.json"], [
        str(model / "config.json"),
        "--output is inside the input",
    ]


@case("ner_eval_predictions_onto_the_data")
def _(ctx):
    data = ctx.file("dev.conll", CONLL_DEV.read_text(encoding="utf-8"))
    model = ctx.copy("ner_model", "model")
    return ["ner", "eval", model, "--data", data, "--predictions", data], ["--predictions is the input", str(data)]


@case("ner_eval_output_onto_the_data")
def _(ctx):
    data = ctx.file("dev.conll", CONLL_DEV.read_text(encoding="utf-8"))
    return ["ner", "eval", ctx.copy("ner_model", "model"), "--data", data, "--output", data], ["--output is the input"]


@case("ner_eval_output_and_predictions_one_file")
def _(ctx):
    same = ctx.tmp / "scores.json"
    argv = ner_eval(ctx.copy("ner_model", "model"), CONLL_DEV, "--predictions", same)
    argv[argv.index("--output") + 1] = same
    return argv, [str(same), "--output is --predictions"]


@case("ner_eval_output_onto_the_labels")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    return ["ner", "eval", model, "--data", CONLL_DEV, "--output", model / "labels.json"], [
        str(model / "labels.json"),
        "--output is inside the input",
    ]


@case("qa_predict_output_is_the_input")
def _(ctx):
    path = ctx.file("questions.jsonl", '{"question": "Who?", "context": "Holmes did."}\n')
    return ["qa", "predict", ctx.copy("qa_model", "model"), "--input", path, "--output", path], [
        "--output is the input"
    ]


@case("qa_eval_predictions_onto_the_data")
def _(ctx):
    data = ctx.file("dev.json", SQUAD.read_text(encoding="utf-8"))
    return ["qa", "eval", ctx.copy("qa_model", "model"), "--data", data, "--predictions", data], [
        "--predictions is the input"
    ]


@case("qa_eval_predictions_onto_the_model_weights")
def _(ctx):
    model = ctx.copy("qa_model", "model")
    return ["qa", "eval", model, "--data", SQUAD, "--predictions", model / "model.safetensors"], [
        "--predictions is inside the input"
    ]


@case("export_out_is_the_run_directory")
def _(ctx):
    run, _ = run_copy(ctx)
    return ["export", run, "--out", run], [str(run), "--out is the input"]


@case("export_out_is_the_checkpoint")
def _(ctx):
    _, checkpoint = run_copy(ctx)
    return ["export", checkpoint, "--out", checkpoint], ["--out is the input", str(checkpoint)]


@case("export_out_inside_the_checkpoint")
def _(ctx):
    _, checkpoint = run_copy(ctx)
    return ["export", checkpoint, "--out", checkpoint / "hf"], ["--out is inside the input", str(checkpoint)]


@case("export_out_holds_the_run")
def _(ctx):
    run, _ = run_copy(ctx)
    # looks like an earlier export: only the input check refuses
    (run.parent / "spanlm_objective.json").write_text("{}")
    return ["export", run, "--out", run.parent], ["--out holds the input"]


@case("prepare_into_the_inputs_directory")
def _(ctx):
    text = ctx.file("corpus/english.txt", "Holmes met Watson.\n" * 20)
    recipe = ctx.recipe({"data": {"inputs": [str(text)], "prepared_dir": str(text.parent)}})
    return ["prepare", recipe], ["data.prepared_dir holds the input", str(text)]


@case("prepare_onto_an_input_file")
def _(ctx):
    text = ctx.file("english.txt", "Holmes met Watson.\n" * 20)
    recipe = ctx.recipe({"data": {"inputs": [str(text)], "prepared_dir": str(text)}})
    return ["prepare", recipe], ["data.prepared_dir is the input", str(text)]


@case("compare_out_onto_a_runs_metrics")
def _(ctx):
    run, _ = run_copy(ctx)
    return ["compare", run, "--metric", "loss", "--out", run / "metrics.jsonl"], [
        str(run / "metrics.jsonl"),
        "--out is inside the input",
    ]


@case("preview_jsonl_onto_the_recipe")
def _(ctx):
    recipe = ctx.pretrain_recipe()
    return ["preview", recipe, "--jsonl", recipe], ["--jsonl is the input", str(recipe)]


@case("preview_jsonl_onto_an_input")
def _(ctx):
    text = ctx.file("english.txt", "Holmes met Watson.\n" * 20)
    recipe = ctx.recipe({"data": {"inputs": [str(text)], "prepared_dir": str(ctx.tmp / "p")}})
    return ["preview", recipe, "--jsonl", text], ["--jsonl is the input"]


def fifo(ctx, name: str) -> Path:
    path = ctx.tmp / name
    os.mkfifo(path)
    return path


@case("prepare_input_is_a_fifo")
def _(ctx):
    path = fifo(ctx, "stream.txt")
    return ["prepare", prepare_recipe(ctx, path)], [str(path), "named pipe", "not a regular file"]


@case("prepare_input_is_a_device")
def _(ctx):
    return ["prepare", prepare_recipe(ctx, Path("/dev/null"))], ["/dev/null", "character device"]


@case("pretrain_recipe_is_a_fifo")
def _(ctx):
    path = fifo(ctx, "recipe.yaml")
    return ["pretrain", path], [str(path), "named pipe"]


@case("ner_predict_input_is_a_fifo")
def _(ctx):
    path = fifo(ctx, "texts.jsonl")
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--input", path], [str(path), "named pipe"]


@case("ner_eval_data_is_a_fifo")
def _(ctx):
    path = fifo(ctx, "dev.conll")
    return ner_eval(ctx.copy("ner_model", "model"), path), [str(path), "named pipe"]


@case("ner_train_data_is_a_fifo")
def _(ctx):
    path = fifo(ctx, "train.conll")
    return ["ner", "train", ctx.ner_recipe(train=path)], [str(path), "named pipe"]


@case("qa_predict_input_is_a_fifo")
def _(ctx):
    path = fifo(ctx, "questions.jsonl")
    return ["qa", "predict", ctx.copy("qa_model", "model"), "--input", path], [str(path), "named pipe"]


@case("qa_train_data_is_a_fifo")
def _(ctx):
    path = fifo(ctx, "train.json")
    return ["qa", "train", ctx.qa_recipe(train=str(path))], [str(path), "named pipe"]


@case("ner_genia_archive_is_a_fifo")
def _(ctx):
    path = fifo(ctx, "GENIAcorpus3.02.xml")
    splits = ctx.tmp / "splits"
    ctx.file("splits/train.txt", "123\n")
    return ["ner", "genia", path, "--splits", splits, "--out", ctx.tmp / "out"], [str(path), "named pipe"]


@case("report_run_missing")
def _(ctx):
    return ["report", ctx.tmp / "nothing"], [str(ctx.tmp / "nothing"), "no such run directory"]


@case("report_metrics_broken")
def _(ctx):
    run, _ = run_copy(ctx)
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"kind": "train", "step": \n{"kind": "train", "step": 9, "loss": 1.0}\n')
    return ["report", run], [f"{run / 'metrics.jsonl'}:", "not valid JSON"]


@case("report_curriculum_broken")
def _(ctx):
    run, _ = run_copy(ctx)
    (run / "curriculum.yaml").write_text("phases: [{name: a, steps: 2}\n", encoding="utf-8")
    return ["report", run], [str(run / "curriculum.yaml"), "not valid YAML"]


@case("compare_second_run_missing")
def _(ctx):
    run, _ = run_copy(ctx)
    return ["compare", run, ctx.tmp / "other", "--metric", "loss", "--kind", "train", "--out", ctx.tmp / "c.png"], [
        f"{ctx.tmp / 'other'}: no such run directory"
    ]


@case("recipes_copy_unknown_name")
def _(ctx):
    return ["recipes", "copy", "pretrain/nonexistent", ctx.tmp / "r.yaml"], ["pretrain/nonexistent"]


@case("recipes_copy_onto_an_existing_file")
def _(ctx):
    dest = ctx.file("mine.yaml", "train: {max_steps: 3}\n")
    return ["recipes", "copy", "pretrain/spanbert", dest], [str(dest), "--force"]


@case("demo_out_is_a_file")
def _(ctx):
    out = ctx.file("demo", "keep me")
    return ["demo", "--quick", "--out", out], [str(out)]


@case("preview_step_past_the_phases")
def _(ctx):
    recipe = ctx.pretrain_recipe(max_steps=3)
    return ["preview", recipe, "phases=[{name: a, steps: 2}, {name: b, steps: 1}]", "--step", "4"], [
        "--step 4: the phases train steps 1–3"
    ]


@case("preview_recipe_missing")
def _(ctx):
    return ["preview", ctx.tmp / "nope.yaml"], [str(ctx.tmp / "nope.yaml"), "does not exist"]


@case("preview_input_missing")
def _(ctx):
    path = ctx.tmp / "missing.txt"
    recipe = ctx.recipe({"data": {"inputs": [str(path)], "prepared_dir": str(ctx.tmp / "p")}})
    return ["preview", recipe], [str(path)]


# ---- the table ----------------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def ctx(request, tmp_path) -> Ctx:
    return Ctx(tmp_path, request)


# ---- sentence classification (spanlm cls) -----------------------------------------------------------------


@case("cls_dev_label_train_never_had")
def _(ctx):
    dev = ctx.file("dev.tsv", "sentence\tlabel\ngood\t1\nodd\t2\n")
    return ["cls", "train", ctx.cls_recipe(dev=str(dev))], [f"{dev}:3", "label '2'", "(0, 1:"]


@case("cls_missing_column")
def _(ctx):
    train = ctx.file("train.tsv", "index\tsentence1\tlabel\n0\tA cat.\tentailment\n")
    return ["cls", "train", ctx.cls_recipe(train=str(train), task="rte")], [f"{train}:1", "no column 'sentence2'"]


@case("cls_pair_task_given_one_column")
def _(ctx):
    train = ctx.file("pairs.jsonl", '{"text": "a", "text_pair": "b", "label": "1"}\n{"text": "c", "label": "0"}\n')
    recipe = ctx.cls_recipe(train=str(train), dev="", task=None, text_pair_field="text_pair")
    return ["cls", "train", recipe], [f"{train}:2", "no text pair", "'text_pair'"]


@case("cls_regression_label_not_a_number")
def _(ctx):
    train = ctx.file("scores.jsonl", '{"text": "a", "label": 0.5}\n{"text": "b", "label": "high"}\n')
    recipe = ctx.recipe(
        {
            **cls_recipe(ctx.fixture("encoder"), ctx.tmp / "run", train=str(train), dev="", task=None),
            "cls": {"problem": "regression"},
        }
    )
    return ["cls", "train", recipe], [f"{train}:2", "'label'", "number", '"high"']


@case("cls_predict_given_an_ner_model")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    return ["cls", "predict", model, "--text", "fine"], [str(model), "not a spanlm cls model", "cls.json"]


@case("cls_unknown_task")
def _(ctx):
    return ["cls", "train", ctx.cls_recipe(), "data.task=sst5"], ["data", "unknown task 'sst5'", "sst2"]


@case("cls_metric_of_the_other_problem")
def _(ctx):
    return ["cls", "train", ctx.cls_recipe(), "cls.metrics=[pearson]"], ["cls.metrics", "pearson", "classification"]


# ---- sentence classification, continued: every input of train / eval / predict ------------------------------

SST2_DEV = REPO / "data" / "cls" / "sst2" / "dev.tsv"


@pytest.fixture(scope="module")
def cls_model(tiny_encoder_dir, tmp_path_factory) -> Path:
    """The model/ directory of one step of `cls train` on a few SST-2 sentences."""
    out = tmp_path_factory.mktemp("cls_model") / "run"
    recipe = out.parent / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(cls_recipe(tiny_encoder_dir, out, dev="")), encoding="utf-8")
    assert main(["cls", "train", str(recipe), "train.max_steps=1"]) == 0
    return out / "model"


FIXTURE_NAMES["cls_model"] = "cls_model"


def cls_train_case(name: str, files: dict[str, str | bytes], data: dict, expected: list[str], **recipe_changes):
    """A `cls train` case whose data settings ``data`` may name ``files`` written first ({NAME} → their paths)."""

    @case(f"cls_{name}")
    def _(ctx):
        paths = {key: ctx.file(key, text) for key, text in files.items()}
        settings = {
            k: (
                v.format(**{n.replace(".", "_").replace("/", "_"): p for n, p in paths.items()})
                if isinstance(v, str)
                else v
            )
            for k, v in data.items()
        }
        recipe = cls_recipe(ctx.fixture("encoder"), ctx.tmp / "run", **settings)
        for section, values in recipe_changes.items():
            recipe.setdefault(section, {}).update(values)
        path = ctx.recipe(recipe, "cls.yaml")
        return ["cls", "train", path], [needle.format(tmp=ctx.tmp) for needle in expected]


JSONL = {"task": None, "dev": ""}
cls_train_case(
    "train_missing_file",
    {},
    {"train": "/nonexistent-spanlm/nowhere.tsv"},
    ["nowhere.tsv", "no such file"],
)
cls_train_case(
    "train_not_utf8",
    {"train.tsv": b"sentence\tlabel\n\xff\xfe caf\xe9\t1\n"},
    {"train": "{train_tsv}"},
    ["train.tsv", "UTF-8"],
)
cls_train_case("train_empty", {"train.tsv": ""}, {"train": "{train_tsv}"}, ["train.tsv", "empty"])
cls_train_case(
    "train_header_only", {"train.tsv": "sentence\tlabel\n"}, {"train": "{train_tsv}"}, ["train.tsv", "no example"]
)
cls_train_case(
    "jsonl_broken_line",
    {"t.jsonl": '{"text": "a", "label": "1"}\n{"text": "b", "label":\n'},
    {"train": "{t_jsonl}", **JSONL},
    ["t.jsonl:2", "JSON"],
)
cls_train_case(
    "jsonl_not_an_object", {"t.jsonl": '["a", "1"]\n'}, {"train": "{t_jsonl}", **JSONL}, ["t.jsonl:1", "object"]
)
cls_train_case(
    "jsonl_no_text", {"t.jsonl": '{"label": "1"}\n'}, {"train": "{t_jsonl}", **JSONL}, ["t.jsonl:1", "'text'"]
)
cls_train_case(
    "jsonl_text_a_number",
    {"t.jsonl": '{"text": 5, "label": "1"}\n'},
    {"train": "{t_jsonl}", **JSONL},
    ["t.jsonl:1", "'text'"],
)
cls_train_case(
    "jsonl_no_label", {"t.jsonl": '{"text": "fine"}\n'}, {"train": "{t_jsonl}", **JSONL}, ["t.jsonl:1", "'label'"]
)
cls_train_case(
    "jsonl_label_a_list",
    {"t.jsonl": '{"text": "fine", "label": [1]}\n'},
    {"train": "{t_jsonl}", **JSONL},
    ["t.jsonl:1", "'label'"],
)
cls_train_case(
    "csv_no_label_column", {"t.csv": "text,score\nfine,1\n"}, {"train": "{t_csv}", **JSONL}, ["t.csv", "'label'"]
)
cls_train_case("tsv_row_short_of_columns", {"t.tsv": "sentence\tlabel\nfine\n"}, {"train": "{t_tsv}"}, ["t.tsv:2"])
cls_train_case(
    "custom_field_missing",
    {"t.jsonl": '{"text": "a", "label": "1"}\n'},
    {"train": "{t_jsonl}", **JSONL, "text_field": "sentence"},
    ["t.jsonl:1", "'sentence'"],
)
cls_train_case("labels_given_twice", {}, {"labels": ["0", "0"]}, ["data", "labels"])
cls_train_case(
    "labels_given_miss_one",
    {"t.tsv": "sentence\tlabel\nfine\t1\nbad\t0\n"},
    {"train": "{t_tsv}", "labels": ["1"]},
    ["t.tsv:3", "'0'"],
)
cls_train_case("unknown_format", {}, {"format": "xml"}, ["data.format", "one of"])
cls_train_case("max_length_zero", {}, {"max_length": 0}, ["max_length"])
cls_train_case("max_length_beyond_positions", {}, {"max_length": 100000}, ["100000"])
cls_train_case("dev_missing", {}, {"dev": "/nonexistent-spanlm/dev.tsv"}, ["dev.tsv", "no such file"])
cls_train_case("dev_not_utf8", {"dev.tsv": b"sentence\tlabel\n\xff\t1\n"}, {"dev": "{dev_tsv}"}, ["dev.tsv", "UTF-8"])
cls_train_case(
    "model_path_missing",
    {},
    {},
    ["nowhere", "no such directory", "model.path"],
    model={"path": "/nonexistent-spanlm/nowhere"},
)
cls_train_case("model_path_a_file", {"enc.txt": "x"}, {}, ["enc.txt"], model={"path": "{tmp}/enc.txt"})
cls_train_case("model_dropout_out_of_range", {}, {}, ["dropout", "[0, 1)"], model={"dropout": 1.5})
cls_train_case("unknown_cls_key", {}, {}, ["cls.poolingg", "unknown"], cls={"poolingg": "mean"})
cls_train_case("regression_metric_on_classes", {}, {}, ["cls.metrics", "spearman"], cls={"metrics": ["spearman"]})


@case("cls_train_an_encoder_without_tokenizer_files")
def _(ctx):
    encoder = ctx.tmp / "encoder"
    encoder.mkdir()
    for name in ("config.json", "model.safetensors"):  # the weights copied, the tokenizer forgotten
        shutil.copy(ctx.fixture("encoder") / name, encoder / name)
    recipe = ctx.recipe(cls_recipe(encoder, ctx.tmp / "run"))
    return ["cls", "train", recipe], [str(encoder), "no tokenizer files"]


@case("ner_eval_a_model_without_tokenizer_files")
def _(ctx):
    model = ctx.copy("ner_model", "model")
    for path in model.glob("tokenizer*.json"):
        path.unlink()
    (model / "vocab.txt").unlink(missing_ok=True)
    return ner_eval(model), [str(model), "no tokenizer files"]


@case("cls_train_a_directory_of_no_dataset")
def _(ctx):
    folder = ctx.folder_("folder")
    return ["cls", "train", ctx.cls_recipe(train=str(folder))], [str(folder)]


@case("cls_model_path_a_file_named")
def _(ctx):
    encoder = ctx.file("encoder.bin", b"\x00\x01")
    recipe = cls_recipe(encoder, ctx.tmp / "run")
    return ["cls", "train", ctx.recipe(recipe, "cls.yaml")], [str(encoder)]


@case("cls_model_path_not_a_model")
def _(ctx):
    folder = ctx.tmp / "folder"
    folder.mkdir()
    return ["cls", "train", ctx.recipe(cls_recipe(folder, ctx.tmp / "run"), "cls.yaml")], [str(folder)]


@case("cls_output_dir_is_the_encoder")
def _(ctx):
    encoder = ctx.copy("encoder")
    recipe = cls_recipe(encoder, encoder)
    return ["cls", "train", ctx.recipe(recipe, "cls.yaml")], ["train.output_dir is the input", "model.path"]


@case("cls_resume_on_other_labels")
def _(ctx):
    """The labels read from the data (none named) are resumed by; the same sentences relabelled are refused."""
    run = ctx.tmp / "run"
    train = ctx.file("train.tsv", "sentence\tlabel\n" + "fine\t1\nbad\t0\n" * 4)
    recipe = ctx.recipe(cls_recipe(ctx.fixture("encoder"), run, train=str(train), dev=""), "cls.yaml")
    assert main(["cls", "train", str(recipe), "train.max_steps=1"]) == 0
    train.write_text("sentence\tlabel\n" + "fine\tgood\nbad\tpoor\n" * 4, encoding="utf-8")
    return ["cls", "train", recipe, "train.max_steps=2", "--resume", "auto"], [
        "data.labels: ['0', '1'] → ['good', 'poor']",
        "resuming with changed settings",
    ]


def cls_model_case(name: str, verb: str, build: Callable[[Ctx, Path], tuple[list, list[str]]]):
    @case(f"cls_{verb}_{name}")
    def _(ctx):
        argv, expected = build(ctx, ctx.copy("cls_model", "model"))
        return ["cls", verb, *argv], expected


cls_model_case("model_missing", "eval", lambda c, m: ([c.tmp / "nowhere", "--data", SST2_DEV], ["nowhere"]))
cls_model_case("model_a_file", "eval", lambda c, m: ([c.file("m.txt", "x"), "--data", SST2_DEV], ["m.txt"]))
cls_model_case("data_missing", "eval", lambda c, m: ([m, "--data", c.tmp / "dev.tsv"], ["dev.tsv", "no such file"]))
cls_model_case("data_a_directory", "eval", lambda c, m: ([m, "--data", m], [str(m), "directory"]))
cls_model_case(
    "data_not_utf8",
    "eval",
    lambda c, m: ([m, "--data", c.file("dev.tsv", b"sentence\tlabel\n\xff\t1\n")], ["dev.tsv", "UTF-8"]),
)
cls_model_case(
    "data_label_the_model_never_had",
    "eval",
    lambda c, m: ([m, "--data", c.file("dev.tsv", "sentence\tlabel\nfine\t7\n")], ["dev.tsv:2", "'7'"]),
)
cls_model_case("data_empty", "eval", lambda c, m: ([m, "--data", c.file("dev.tsv", "")], ["dev.tsv", "no example"]))
cls_model_case(
    "output_a_directory",
    "eval",
    lambda c, m: ([m, "--data", SST2_DEV, "--output", o := c.folder_("out")], [str(o), "is a directory"]),
)
cls_model_case(
    "predictions_onto_the_data",
    "eval",
    lambda c, m: (
        [m, "--data", d := c.file("dev.tsv", SST2_DEV.read_text()), "--predictions", d],
        ["--predictions is the input"],
    ),
)
cls_model_case(
    "weights_cut_short",
    "eval",
    lambda c, m: (cut(m / "model.safetensors"), [m, "--data", SST2_DEV])[1:] + (["model.safetensors"],),
)
cls_model_case(
    "config_json_broken",
    "eval",
    lambda c, m: ((m / "config.json").write_text("{"), [m, "--data", SST2_DEV])[1:] + (["config.json"],),
)
cls_model_case(
    "input_empty", "predict", lambda c, m: ([m, "--input", c.file("in.jsonl", "")], ["in.jsonl", "no texts"])
)
cls_model_case(
    "input_blank_lines", "predict", lambda c, m: ([m, "--input", c.file("in.txt", "\n\n")], ["in.txt", "no texts"])
)
cls_model_case(
    "input_missing", "predict", lambda c, m: ([m, "--input", c.tmp / "in.jsonl"], ["in.jsonl", "no such file"])
)
cls_model_case("input_a_directory", "predict", lambda c, m: ([m, "--input", c.tmp], [str(c.tmp), "directory"]))
cls_model_case(
    "input_broken_json",
    "predict",
    lambda c, m: ([m, "--input", c.file("in.jsonl", '{"text": \n')], ["in.jsonl:1", "JSON"]),
)
cls_model_case(
    "input_no_text",
    "predict",
    lambda c, m: ([m, "--input", c.file("in.jsonl", '{"txt": "a"}\n')], ["in.jsonl:1", "'text'"]),
)
cls_model_case(
    "input_not_utf8", "predict", lambda c, m: ([m, "--input", c.file("in.txt", b"caf\xe9\n")], ["in.txt", "UTF-8"])
)
cls_model_case(
    "output_a_directory",
    "predict",
    lambda c, m: ([m, "--text", "fine", "--output", o := c.folder_("out")], [str(o), "is a directory"]),
)
cls_model_case(
    "output_is_the_input",
    "predict",
    lambda c, m: ([m, "--input", i := c.file("in.txt", "fine\n"), "--output", i], ["--output is the input"]),
)
cls_model_case(
    "output_inside_the_model",
    "predict",
    lambda c, m: ([m, "--text", "fine", "--output", m / "p.jsonl"], ["--output is inside the input"]),
)
cls_model_case(
    "labels_json_broken",
    "predict",
    lambda c, m: ((m / "cls.json").write_text("["), [m, "--text", "fine"])[1:] + (["cls.json"],),
)
cls_model_case(
    "pooling_unknown",
    "predict",
    lambda c, m: (
        (
            (m / "cls.json").write_text(json.dumps({**json.loads((m / "cls.json").read_text()), "pooling": "max"})),
            [m, "--text", "fine"],
        )[1:]
        + (["cls.json", "'pooling' must be cls or mean"],)
    ),
)


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


# ---- spanlm eval: the suite, its tasks, the encoders and the options --------------------------------------------


def eval_suite(ctx: Ctx, mutate: Callable[[dict], object] | None = None, text: str | bytes | None = None) -> Path:
    """The quick suite (two NER steps on the WNUT fixtures) as ``mutate`` changes it, or ``text`` as it is."""
    if text is not None:
        return ctx.file("suite.yaml", text)
    suite = {
        "seeds": [0],
        "tasks": [
            {
                "name": "wnut-mini",
                "kind": "ner",
                "recipe": str(REPO / "configs/ner/wnut17.yaml"),
                "metric": "f1",
                "arms": ["fine-tuned"],
                "settings": {
                    "data.train": str(CONLL_TRAIN),
                    "data.dev": str(CONLL_DEV),
                    "data.max_len": 32,
                    "data.stride": 8,
                    "train.max_steps": 1,
                    "train.device": "cpu",
                },
            }
        ],
    }
    if mutate is not None:
        mutate(suite)
    return ctx.file("suite.yaml", yaml.safe_dump(suite))


def eval_case(name: str, build: Callable[[Ctx, Path], tuple[list, list[str]]]):
    """A `spanlm eval` case: ``build(ctx, encoder)`` → (the arguments after `eval`, what the error names)."""

    @case(f"eval_{name}")
    def _(ctx):
        argv, expected = build(ctx, ctx.fixture("encoder"))
        if "--out" not in argv:
            argv = [*argv, "--out", ctx.tmp / "out"]
        return ["eval", *argv], expected


def task(key: str, value):
    return lambda suite: suite["tasks"][0].__setitem__(key, value)


def setting(key: str, value):
    return lambda suite: suite["tasks"][0]["settings"].__setitem__(key, value)


def encoders(e: Path, *more: str) -> list:
    return ["--encoders", f"tiny={e}", f"random=random:{e}", *more]


eval_case("suite_missing", lambda c, e: ([c.tmp / "suite.yaml", *encoders(e)], ["suite.yaml", "no such file"]))
eval_case("suite_a_directory", lambda c, e: ([c.tmp, *encoders(e)], [str(c.tmp), "directory"]))
eval_case(
    "suite_binary",
    lambda c, e: ([eval_suite(c, text=b"\x89PNG\r\n\x1a\n\x00\xff"), *encoders(e)], ["suite.yaml", "UTF-8"]),
)
eval_case("suite_not_yaml", lambda c, e: ([eval_suite(c, text="tasks: [\n"), *encoders(e)], ["suite.yaml", "YAML"]))
eval_case("suite_a_list", lambda c, e: ([eval_suite(c, text="- a\n- b\n"), *encoders(e)], ["suite.yaml"]))
eval_case(
    "suite_without_tasks",
    lambda c, e: ([eval_suite(c, lambda s: s.pop("tasks")), *encoders(e)], ["suite.yaml", "tasks"]),
)
eval_case(
    "suite_tasks_empty",
    lambda c, e: ([eval_suite(c, lambda s: s.__setitem__("tasks", [])), *encoders(e)], ["suite.yaml", "tasks"]),
)
eval_case(
    "suite_unknown_key", lambda c, e: ([eval_suite(c, lambda s: s.__setitem__("seedz", [0])), *encoders(e)], ["seedz"])
)
eval_case(
    "suite_seeds_negative",
    lambda c, e: ([eval_suite(c, lambda s: s.__setitem__("seeds", [-1])), *encoders(e)], ["seeds"]),
)
eval_case(
    "task_unknown_kind", lambda c, e: ([eval_suite(c, task("kind", "summarisation")), *encoders(e)], ["summarisation"])
)
eval_case("task_unknown_metric", lambda c, e: ([eval_suite(c, task("metric", "bleu")), *encoders(e)], ["bleu"]))
eval_case(
    "task_unknown_arm", lambda c, e: ([eval_suite(c, task("arms", ["half-frozen"])), *encoders(e)], ["half-frozen"])
)
eval_case(
    "task_without_a_name", lambda c, e: ([eval_suite(c, lambda s: s["tasks"][0].pop("name")), *encoders(e)], ["name"])
)
eval_case(
    "task_recipe_missing",
    lambda c, e: ([eval_suite(c, task("recipe", str(c.tmp / "ner.yaml"))), *encoders(e)], ["ner.yaml", "no such file"]),
)
eval_case(
    "task_recipe_not_utf8",
    lambda c, e: (
        [eval_suite(c, task("recipe", str(c.file("ner.yaml", b"model:\n  path: caf\xe9\n")))), *encoders(e)],
        ["ner.yaml", "UTF-8"],
    ),
)
eval_case(
    "task_recipe_unknown_name",
    lambda c, e: ([eval_suite(c, task("recipe", "ner/nothing")), *encoders(e)], ["ner/nothing"]),
)
eval_case(
    "task_settings_not_a_mapping", lambda c, e: ([eval_suite(c, task("settings", ["a"])), *encoders(e)], ["settings"])
)
eval_case(
    "task_setting_unknown",
    lambda c, e: ([eval_suite(c, setting("train.max_stepz", 3)), *encoders(e)], ["train.max_stepz"]),
)
eval_case(
    "task_data_missing",
    lambda c, e: ([eval_suite(c, setting("data.dev", str(c.tmp / "dev.conll"))), *encoders(e)], ["data.dev"]),
)
eval_case(
    "task_data_not_of_the_recipes_format",
    lambda c, e: (
        [eval_suite(c, setting("data.dev", str(c.file("dev.conll", "Holmes Q-person\n")))), *encoders(e)],
        ["task wnut-mini", "dev.conll:1"],
    ),
)
eval_case(
    "cls_task_data_without_its_column",
    lambda c, e: (
        [
            eval_suite(
                c,
                lambda s: s["tasks"].__setitem__(
                    0,
                    {
                        "name": "sst2",
                        "kind": "cls",
                        "recipe": str(REPO / "configs/cls/sst2.yaml"),
                        "metric": "accuracy",
                        "settings": {
                            "data.train": str(SST2_DEV),
                            "data.dev": str(c.file("dev.tsv", "text\tscore\nfine\t1\n")),
                        },
                    },
                ),
            ),
            *encoders(e),
        ],
        ["task sst2", "dev.tsv:1", "sentence"],
    ),
)
eval_case(
    "encoder_missing",
    lambda c, e: ([eval_suite(c), "--encoders", f"tiny={c.tmp / 'nowhere'}"], ["nowhere", "no such directory"]),
)
eval_case(
    "encoder_a_file",
    lambda c, e: (
        [eval_suite(c), "--encoders", f"tiny={c.file('enc.bin', 'x')}"],
        ["enc.bin", "is a file, not a directory"],
    ),
)
eval_case(
    "encoder_not_a_model",
    lambda c, e: (
        [eval_suite(c), "--encoders", f"tiny={(c.tmp / 'empty').mkdir() or c.tmp / 'empty'}"],
        ["empty", "config.json"],
    ),
)
eval_case("encoder_without_a_name", lambda c, e: ([eval_suite(c), "--encoders", str(e)], ["NAME=DIR"]))
eval_case("encoder_name_with_a_slash", lambda c, e: ([eval_suite(c), "--encoders", f"a/b={e}"], ["a name is letters"]))
eval_case(
    "encoder_names_twice",
    lambda c, e: ([eval_suite(c), "--encoders", f"tiny={e}", f"tiny=random:{e}"], ["its own name"]),
)
eval_case("baseline_unknown", lambda c, e: ([eval_suite(c), *encoders(e), "--baseline", "nobody"], ["nobody"]))
eval_case("seeds_twice", lambda c, e: ([eval_suite(c), *encoders(e), "--seeds", "0", "0"], ["--seeds"]))
eval_case("out_is_an_encoder", lambda c, e: ([eval_suite(c), *encoders(e), "--out", e], ["--out is the input"]))
eval_case(
    "out_holds_the_suite",
    lambda c, e: ([s := eval_suite(c), *encoders(e), "--out", s.parent], ["--out holds the input", "suite"]),
)
eval_case("out_is_a_file", lambda c, e: ([eval_suite(c), *encoders(e), "--out", c.file("out.txt", "x")], ["out.txt"]))
eval_case(
    "windows_beyond_positions", lambda c, e: ([eval_suite(c, setting("data.max_len", 4096)), *encoders(e)], ["4096"])
)


@case("ner_predict_output_a_directory")
def _(ctx):
    out = ctx.folder_("out")
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--text", "Holmes .", "--output", out], [
        f"{out}: is a directory"
    ]


@case("ner_predict_input_empty")
def _(ctx):
    path = ctx.file("texts.jsonl", "")
    return ["ner", "predict", ctx.copy("ner_model", "model"), "--input", path], [str(path), "no texts"]


@case("qa_predict_input_empty")
def _(ctx):
    path = ctx.file("questions.jsonl", "\n")
    return ["qa", "predict", ctx.copy("qa_model", "model"), "--input", path], [str(path), "no questions"]


def test_table_is_large_enough():
    assert len(CASES) >= 100 and len({c.name for c in CASES}) == len(CASES)
    assert len([c for c in CASES if c.name.startswith(("cls_", "eval_"))]) >= 60


@pytest.mark.parametrize("bad", CASES, ids=[c.name for c in CASES])
def test_bad_input(bad: Case, ctx: Ctx, capsys):
    argv, expected = bad.build(ctx)
    before = snapshot(ctx.tmp)
    code, _, err = run_cli(capsys, argv)
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith(f"spanlm {argv[0]}: error: ")]
    assert code == 2 and len(errors) == 1, err
    assert "Traceback" not in err
    for needle in expected:
        assert needle in errors[0], (needle, errors[0])
    after = snapshot(ctx.tmp)
    assert {k: after.get(k) for k in before} == before, "a file written before changed or went"


NUMERIC_OPTIONS = [
    (["ner", "eval", "MODEL", "--data", "x.conll", "--batch-size", "0"], "--batch-size: 0 must be at least 1"),
    (["ner", "predict", "MODEL", "--text", "x", "--batch-size", "-3"], "--batch-size: -3 must be at least 1"),
    (["qa", "predict", "MODEL", "--input", "q.jsonl", "--batch-size", "0"], "--batch-size: 0 must be at least 1"),
    (["qa", "eval", "MODEL", "--data", "d.json", "--batch-size", "2.5"], "--batch-size: '2.5' is not an integer"),
    (["ner", "eval", "MODEL", "--data", "x.conll", "--noise", "nan"], "--noise: 'nan' is not a finite number"),
    (["ner", "eval", "MODEL", "--data", "x.conll", "--noise", "1.5"], "--noise: 1.5 must be in [0, 1]"),
    (["ner", "eval", "MODEL", "--data", "x.conll", "--noise-seed", "-1"], "--noise-seed: -1 must be at least 0"),
    (["ner", "predict", "MODEL", "--text", "x", "--threshold", "inf"], "--threshold: 'inf' is not a finite number"),
    (["cls", "predict", "MODEL", "--text", "x", "--batch-size", "0"], "--batch-size: 0 must be at least 1"),
    (["preview", "recipe.yaml", "--n", "-1"], "--n: -1 must be at least 0"),
    (["preview", "recipe.yaml", "--stats-blocks", "-1"], "--stats-blocks: -1 must be at least 1"),
    (["preview", "recipe.yaml", "--step", "0"], "--step: 0 must be at least 1"),
    (["demo", "--seeds", "0", "-2"], "--seeds: -2 must be at least 0"),
]


@pytest.mark.parametrize("argv, expected", NUMERIC_OPTIONS, ids=[" ".join(a[:2] + a[-2:]) for a, _ in NUMERIC_OPTIONS])
def test_numeric_options_are_checked_like_their_config_keys(argv, expected, capsys):
    """A bad number is refused by the argument parser (exit 2, the option named), before any file is read."""
    with pytest.raises(SystemExit) as error:
        main(argv)
    err = capsys.readouterr().err
    assert error.value.code == 2 and expected in err and "Traceback" not in err, err
