"""The NER objective on the training engine: a tiny model learns a handful of sentences to F1 1.0 (flat and
nested), training resumes exactly, the export loads back (and AutoModel reads its encoder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spanlm.config import load_config
from spanlm.errors import ConfigError, InputError
from spanlm.ner.config import NerRecipe
from spanlm.ner.predict import NerModel
from spanlm.ner.task import train_ner
from spanlm.train.checkpoint import latest_checkpoint, step_dir

SENTENCES = [
    ("Holmes met Watson in London .", [("Holmes", "PER"), ("Watson", "PER"), ("London", "LOC")]),
    ("Paris is far from Berlin .", [("Paris", "LOC"), ("Berlin", "LOC")]),
    (
        "The Bank of England is in London .",
        [("Bank of England", "ORG"), ("England", "LOC"), ("London", "LOC")],
    ),  # nested
    ("Watson works for Scotland Yard .", [("Watson", "PER"), ("Scotland Yard", "ORG")]),
    ("Nothing happened today .", []),
    ("Moriarty fled to Paris with Irene Adler .", [("Moriarty", "PER"), ("Paris", "LOC"), ("Irene Adler", "PER")]),
]


@pytest.fixture(scope="module")
def sentences_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ner") / "sentences.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for text, entities in SENTENCES:
            spans = [{"start": text.index(s), "end": text.index(s) + len(s), "label": label} for s, label in entities]
            handle.write(json.dumps({"text": text, "entities": spans}) + "\n")
    return path


def recipe(encoder_dir, data, out, *overrides):
    return load_config(
        None,
        [
            f"model.path={encoder_dir}",
            f"data.train={data}",
            f"data.dev={data}",
            "data.format=jsonl",
            "data.max_len=16",
            "data.stride=4",
            f"train.output_dir={out}",
            "train.batch_size=4",
            "train.lr=0.003",
            "train.warmup_steps=0",
            "train.eval_every=0",
            "train.num_workers=0",
            "train.device=cpu",
            "logging.report_to=[]",
            "logging.progress=false",
            "ner.head.head_size=16",
            *overrides,
        ],
        cls=NerRecipe,
    )


@pytest.mark.parametrize("kind", ["efficient", "standard"])
@pytest.mark.slow
def test_tiny_model_learns_the_sentences(tiny_encoder_dir, sentences_file, tmp_path, kind):
    """The real learning test: windows of ≤ 14 content tokens, so sentences span windows; nested gold."""
    steps = 120
    run = recipe(
        tiny_encoder_dir,
        sentences_file,
        tmp_path / "run",
        "model.dropout=0.0",
        f"train.max_steps={steps}",
        f"train.save_every={steps}",
        f"ner.head.kind={kind}",
    )
    run_dir, scores = train_ner(run, log=lambda *_: None)
    assert scores["micro"]["f1"] == 100.0, scores["micro"]  # percent
    assert scores["micro"]["n_gold"] == 13 and set(scores["per_type"]) == {"LOC", "ORG", "PER"}
    assert json.loads((run_dir / "eval.json").read_text())["micro"]["f1"] == 100.0
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] / 10

    model = NerModel(run_dir / "model", device="cpu")
    assert model.labels == ["LOC", "ORG", "PER"]
    ((document, scores_),) = model.predict_texts(["The Bank of England is in London ."])
    found = [(document.text[e.start : e.end], e.label) for e in document.entities]
    assert found == [("Bank of England", "ORG"), ("England", "LOC"), ("London", "LOC")] and min(scores_) > 0
    ((flat, _),) = model.predict_texts(["The Bank of England is in London ."], flat=True)
    assert len(flat.entities) == 2  # the nested LOC inside the ORG gives way to the higher-scored one

    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(str(run_dir / "model"))
    assert encoder.config.hidden_size == 32


def test_a_resume_on_relabelled_data_is_refused_naming_the_labels(tiny_encoder_dir, sentences_file, tmp_path):
    """The head's type ids mean the labels in their order: data whose label set changed (PER renamed HUMAN, so
    the ids trained as LOC and ORG would shift) cannot continue the run, as cls refuses it."""
    from spanlm.errors import InputError

    quiet = {"log": lambda *_: None}
    train_ner(recipe(tiny_encoder_dir, sentences_file, tmp_path / "run", "train.max_steps=1"), **quiet)
    relabelled = tmp_path / "relabelled.jsonl"
    relabelled.write_text(sentences_file.read_text(encoding="utf-8").replace('"PER"', '"HUMAN"'), encoding="utf-8")
    with pytest.raises(InputError, match=r"data.labels: \['LOC', 'ORG', 'PER'\] → \['HUMAN', 'LOC', 'ORG'\]"):
        train_ner(recipe(tiny_encoder_dir, relabelled, tmp_path / "run", "train.max_steps=2"), resume="auto", **quiet)


@pytest.mark.slow
def test_resume_is_exact(tiny_encoder_dir, sentences_file, tmp_path):
    # A constant schedule: the first leg's max_steps=3 must not change the learning rates.
    straight, _ = train_ner(
        recipe(
            tiny_encoder_dir,
            sentences_file,
            tmp_path / "a",
            "train.max_steps=6",
            "train.save_every=3",
            "train.schedule=constant",
        ),
        log=lambda *_: None,
    )
    train_ner(
        recipe(
            tiny_encoder_dir,
            sentences_file,
            tmp_path / "b",
            "train.max_steps=3",
            "train.save_every=3",
            "train.schedule=constant",
        ),
        log=lambda *_: None,
    )
    resumed, _ = train_ner(
        recipe(
            tiny_encoder_dir,
            sentences_file,
            tmp_path / "b",
            "train.max_steps=6",
            "train.save_every=3",
            "train.schedule=constant",
        ),
        resume="auto",
        log=lambda *_: None,
    )
    a = load_file(str(latest_checkpoint(straight) / "model.safetensors"))
    b = load_file(str(latest_checkpoint(resumed) / "model.safetensors"))
    assert latest_checkpoint(resumed).name == latest_checkpoint(straight).name == step_dir(Path(), 6).name
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (resumed / "config.yaml").read_text().count("- LOC") == 1  # the label order is part of the run's config

    # The window settings change every batch: a resume with another one is refused, naming it.
    with pytest.raises(InputError, match=r"data\.stride: 4 → 2"):
        train_ner(
            recipe(tiny_encoder_dir, sentences_file, tmp_path / "b", "train.max_steps=9", "data.stride=2"),
            resume="auto",
            log=lambda *_: None,
        )


def test_setup_errors(tiny_encoder_dir, sentences_file, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": "nothing here"}\n', encoding="utf-8")
    with pytest.raises(InputError, match="no entity in the training file"):
        train_ner(recipe(tiny_encoder_dir, empty, tmp_path / "r1"), log=lambda *_: None)
    with pytest.raises(ConfigError, match="exceeds the 128 positions"):
        train_ner(recipe(tiny_encoder_dir, sentences_file, tmp_path / "r2", "data.max_len=512"), log=lambda *_: None)
    with pytest.raises(ConfigError, match="data.train is required"):
        train_ner(recipe(tiny_encoder_dir, "", tmp_path / "r3"), log=lambda *_: None)
    with pytest.raises(InputError, match="unknown label 'PER'"):
        train_ner(
            recipe(tiny_encoder_dir, sentences_file, tmp_path / "r4", "data.labels=[LOC, ORG]"), log=lambda *_: None
        )


def test_the_data_check_takes_the_labels_of_the_documents_trained_on(sentences_file, tmp_path):
    """`spanlm eval`'s check of a task reads the label set as its runs do: from the first data.train_docs only."""
    from spanlm.ner.task import check_data

    check_data(recipe("unused", sentences_file, tmp_path / "r1"))
    with pytest.raises(InputError, match="unknown label 'ORG'"):  # the first two sentences: LOC and PER only
        check_data(recipe("unused", sentences_file, tmp_path / "r2", "data.train_docs=2"))
    quiet = tmp_path / "quiet_first.jsonl"
    lines = sentences_file.read_text(encoding="utf-8").splitlines()
    quiet.write_text("\n".join([lines[4], *lines]) + "\n", encoding="utf-8")  # "Nothing happened today ." first
    with pytest.raises(InputError, match=r"no entity in the training file \(data.train_docs: its first 1\)"):
        check_data(recipe("unused", quiet, tmp_path / "r3", "data.train_docs=1"))
