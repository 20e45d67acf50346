"""docs/huggingface.md's snippets run as written (exports, continued pretraining, Trainer), in small form."""

from __future__ import annotations

import os
import shlex

import pytest

from helpers import REPO, TINY_RUN, copy_of, doc_section
from spanlm.cli import main

PAGE = "docs/huggingface.md"


@pytest.fixture(scope="module")
def workdir(readme_runs, tmp_path_factory):
    """A copy of the directory where the README's earlier commands ran (prepare, a tiny SpanBERT, its export):
    these snippets write there."""
    return copy_of(readme_runs, tmp_path_factory.mktemp("readme_hf") / "work")


def commands(bash: str) -> list[list[str]]:
    """The snippet's commands (continuation lines joined, comments dropped), split into words."""
    joined = bash.replace("\\\n", " ")
    return [
        shlex.split(os.path.expandvars(line))
        for line in joined.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_exports_load_with_their_heads(workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    (code,) = doc_section(PAGE, "Exports that transformers loads with their heads")
    namespace = {}
    exec(compile(code, PAGE, "exec"), namespace)
    assert type(namespace["model"]).__name__ == "BertForMaskedLM"
    assert capsys.readouterr().out.startswith("[")  # the fill-mask guesses


def test_continued_pretraining_from_a_stock_checkpoint(workdir, monkeypatch, capsys):
    import torch
    from transformers import AutoConfig, AutoTokenizer, BertForMaskedLM

    monkeypatch.chdir(workdir)
    checkpoint = workdir / "bert-base-uncased"  # a stand-in: a stock BertForMaskedLM made by transformers
    tokenizer = AutoTokenizer.from_pretrained("runs/export/spanbert")
    torch.manual_seed(0)
    BertForMaskedLM(
        AutoConfig.for_model(
            "bert",
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).save_pretrained(str(checkpoint))
    tokenizer.save_pretrained(str(checkpoint))
    monkeypatch.setenv("CHECKPOINT", str(checkpoint))
    (bash,) = doc_section(PAGE, "Continued pretraining from a Hugging Face checkpoint", language="bash")
    (command,) = commands(bash)
    assert command[:2] == ["spanlm", "pretrain"]
    assert main([*command[1:], *TINY_RUN]) == 0
    assert (
        f"heads from {checkpoint}: mlm_head loaded (BertForMaskedLM weights in bert-base-uncased); sbo_head fresh "
        "(not in the checkpoint)" in capsys.readouterr().err
    )


def test_maskers_in_the_trainer(workdir, monkeypatch):
    from spanlm.data.shards import PreparedCorpus
    from spanlm.objectives import build_objective
    from spanlm.pretrain.recipe import load_recipe

    monkeypatch.chdir(workdir)
    (code,) = doc_section(PAGE, "spanlm's maskers in your own `Trainer`")
    namespace = {}
    exec(compile(code, PAGE, "exec"), namespace)
    export = workdir / "runs/hf-trainer/export"
    assert {"model.safetensors", "heads.safetensors", "config.json"} <= {p.name for p in export.iterdir()}
    # spanlm continues the Trainer's model with both of its heads.
    recipe = load_recipe(REPO / "configs/pretrain/spanbert.yaml", [f"model.path={export}", "tokenizer.vocab_size=2000"])
    objective = build_objective(recipe, PreparedCorpus(recipe.data.prepared_dir))
    assert objective.head_report == {
        "mlm_head": "loaded (BertForMaskedLM weights in export)",
        "sbo_head": "loaded (heads.safetensors)",
    }
