"""Shared fixtures: small corpora prepared with spanlm itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import helpers
from spanlm.config import from_dict
from spanlm.pretrain.recipe import Recipe

# The masking tests' corpora and batches, shared with the objective folders' masker tests.
pytest_plugins = ["masking_corpora"]

# Fixtures that train a model, build a package or environment, or run a whole spanlm command: a test using one
# is an integration test, marked `slow` here (left out of `make test-fast`) whether or not it says so itself.
INTEGRATION_FIXTURES = {
    "readme_runs",  # the README's prepare, pretrain and export commands, made tiny
    "evaluated",  # evaluate/test_eval.py: a whole `spanlm eval` suite
    "workdir",  # test_readme_hf.py, models/test_charbert_hf.py: a tiny pretraining run and its export
    "tiny_model",  # ner/test_attack.py: `ner train`
    "trained",  # ner/test_cli.py: `ner train` in the test
    "ner_model",  # test_bad_inputs.py: `ner train`
    "qa_model",  # test_bad_inputs.py: `qa train`
    "pretrain_run",  # test_bad_inputs.py: `pretrain`
    "wheel",  # test_recipes.py: an sdist and a wheel built by pip
    "target_python",  # test_gpu_check.py: a clean venv
    "transformers4",  # data/test_tokenizer.py: a venv with transformers 4
    "study_environment",  # test_*_study.py: an examples/ study's script, run small
}

# The training-engine tests: those using the folder's toy corpus (`prepared`) pretrain on it.
TRAINING_ENGINE = Path(__file__).parent / "train"


def pytest_configure(config):
    """Every test runs torch on one intra-op thread, for the whole session: the tests' tiny models gain nothing
    from more, on shared, busy cores a thread per core spin-waits for the others (a resume test ran several
    times slower on torch's default of one thread per core), and one thread gives the same sums, so the same
    run, on every machine.
    The processes the tests start get one too (OMP_NUM_THREADS, unless set): a run in a subprocess then
    sums as the test's own reference does, bit for bit (a test that needs another count sets its own)."""
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Mark `slow` the users of INTEGRATION_FIXTURES and the training-engine tests that pretrain; then put the
    files holding slow tests first, each file's tests together and in their order.

    Why the order: `make test` hands whole files to two processes (pytest-xdist's loadfile, told to keep this
    order). A file whose one long test starts last leaves the other process idle until it ends; started
    first, the many quick files fill the other process meanwhile."""
    for item in items:
        engine = item.path.is_relative_to(TRAINING_ENGINE) and "prepared" in item.fixturenames
        if engine or INTEGRATION_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.slow)
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort: files stay whole and in order


@pytest.fixture(scope="session")
def study_environment():
    """The environment an examples/ study's script runs in: this Python's ``spanlm`` first on PATH, and ``SPANLM``
    the forked one (forked_spanlm: its commands forked from a server that imported torch and transformers once
    per test process; on Linux)."""
    import shutil
    import sys
    import tempfile

    import forked_spanlm

    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if not sys.platform.startswith("linux"):
        yield environment
        return
    directory = Path(tempfile.mkdtemp(prefix="forked-spanlm-"))  # short: a socket's path has 107 bytes at most
    server_socket = directory / "server"
    environment |= {"SPANLM": str(forked_spanlm.shim(directory, server_socket))}
    environment |= {forked_spanlm.SOCKET_VARIABLE: str(server_socket)}
    server = forked_spanlm.start_server(server_socket, environment)
    yield environment
    server.stdin.close()
    server.wait(timeout=60)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def embedded_prepared(tmp_path_factory) -> Path:
    """The embedded English corpus prepared once per test session (WordPiece, vocab 2000)."""
    from spanlm.data.prepare import prepare

    out = tmp_path_factory.mktemp("embedded")
    recipe = from_dict(
        Recipe,
        {
            "data": {
                "inputs": helpers.EMBEDDED_INPUTS,
                "prepared_dir": str(out / "prepared"),
            },
            "tokenizer": {"vocab_size": 2000},
        },
    )
    return prepare(recipe, log=lambda *_: None)


@pytest.fixture(scope="session")
def tiny_encoder_dir(embedded_prepared, tmp_path_factory) -> Path:
    """A tiny BERT (hidden 32, 2 layers) with the embedded corpus's tokenizer, saved as a Hugging Face directory."""
    import torch

    from spanlm.data.shards import PreparedCorpus
    from spanlm.models import BackboneConfig, build_backbone

    corpus = PreparedCorpus(embedded_prepared)
    torch.manual_seed(0)
    model = build_backbone(
        BackboneConfig(
            family="bert", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=128
        ),
        corpus,
    )
    out = tmp_path_factory.mktemp("tiny_encoder")
    model.save_pretrained(str(out))
    corpus.tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def readme_runs(tmp_path_factory) -> Path:
    """A directory where the README's first commands ran, made tiny (``helpers.TINY_RUN``): ``spanlm prepare``
    of configs/prepare/english.yaml, ``spanlm pretrain`` of configs/pretrain/spanbert.yaml and ``spanlm export``
    to runs/export/spanbert; data/ and configs/ link to the checkout's. One pretraining run and export for the
    README tests of the session: each works in a copy (:func:`helpers.copy_of`), as its snippets write there."""
    from spanlm.cli import main

    directory = tmp_path_factory.mktemp("readme_runs")
    (directory / "data").symlink_to(helpers.REPO / "data")
    (directory / "configs").symlink_to(helpers.REPO / "configs")
    previous = os.getcwd()
    os.chdir(directory)
    try:
        assert main(["prepare", str(helpers.REPO / "configs/prepare/english.yaml"), "tokenizer.vocab_size=2000"]) == 0
        assert main(["pretrain", str(helpers.REPO / "configs/pretrain/spanbert.yaml"), *helpers.TINY_RUN]) == 0
        assert main(["export", "runs/pretrain/spanbert", "--out", "runs/export/spanbert"]) == 0
    finally:
        os.chdir(previous)
    return directory


@pytest.fixture
def offline_datasets_cache(tmp_path, monkeypatch) -> Path:
    """An empty `datasets` cache of this test's own, with the Hub offline: what HF_DATASETS_CACHE=… and
    HF_HUB_OFFLINE=1 set when datasets is imported (also exported, for subprocesses)."""
    import datasets
    import huggingface_hub.constants

    cache = tmp_path / "datasets_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache
