"""Exports whose heads transformers loads, and continued pretraining from transformers checkpoints with their heads.

Checked against the stock classes: ``AutoModelForMaskedLM`` / ``pipeline("fill-mask")`` /
``ElectraForPreTraining`` on a spanlm export give spanlm's own logits, and a stock ``*ForMaskedLM``
directory continued by spanlm gives transformers' own MLM loss on the same batch.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from objectives.test_objectives import fixed_batch, prepared, tiny_recipe  # noqa: F401  (prepared: fixture)
from safetensors.torch import load_file, save_file

from spanlm.data.shards import PreparedCorpus
from spanlm.data.tokenizer import save_tokenizer
from spanlm.errors import InputError
from spanlm.objectives import build_objective
from spanlm.objectives.masked_batch import encode, gather_rows

FAMILIES = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "deberta-v2": "DebertaV2ForMaskedLM",
    "electra": "ElectraForMaskedLM",
}


def perturbed(objective):
    """Move every weight away from its initialisation, so equal outputs are not a coincidence of seeds."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in objective.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return objective.eval()


def spanlm_mlm_logits(objective, batch) -> torch.Tensor:
    """(N, V) vocabulary logits of spanlm's MLM head at the batch's targets."""
    with torch.no_grad():
        return objective.mlm_head(gather_rows(encode(objective.backbone, batch), batch["target_index"]))


def hf_logits_at_targets(model, batch) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long()).logits  # (B, L, V)
    return logits.flatten(0, 1).index_select(0, batch["target_index"])  # (N, V)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_loads_as_the_families_masked_lm_with_spanlms_logits(prepared, tmp_path, family, caplog):
    from transformers import AutoModel, AutoModelForMaskedLM

    corpus = PreparedCorpus(prepared)
    objective = perturbed(build_objective(tiny_recipe(prepared, "spanbert", tmp_path, family=family), corpus))
    objective.export(tmp_path / "export", corpus.tokenizer)
    save_tokenizer(corpus.tokenizer, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"] == [FAMILIES[family]]

    with caplog.at_level(logging.WARNING):
        model, info = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "export"), output_loading_info=True)
    assert type(model).__name__ == FAMILIES[family] and not info["missing_keys"]
    assert "corrupted" not in caplog.text
    batch = fixed_batch(objective, prepared)
    assert torch.allclose(hf_logits_at_targets(model.eval(), batch), spanlm_mlm_logits(objective, batch), atol=1e-5)
    # SBO has no transformers class: it stays beside the weights under spanlm's names.
    assert set(load_file(str(tmp_path / "export" / "heads.safetensors"))) == {
        k for k in objective.state_dict() if k.startswith("sbo_head.")
    }
    # AutoModel loads the encoder with nothing freshly initialised (BERT / RoBERTa: the stored untrained pooler).
    _, info = AutoModel.from_pretrained(str(tmp_path / "export"), output_loading_info=True)
    assert not info["missing_keys"]


def test_fill_mask_pipeline_returns_spanlms_top_tokens(prepared, tmp_path):
    from transformers import pipeline

    corpus = PreparedCorpus(prepared)
    objective = perturbed(build_objective(tiny_recipe(prepared, "mlm", tmp_path), corpus))
    objective.export(tmp_path / "export", corpus.tokenizer)
    save_tokenizer(corpus.tokenizer, tmp_path / "export")
    assert not (tmp_path / "export" / "heads.safetensors").exists()  # the MLM head is all there is, in the weights

    tokenizer = corpus.tokenizer
    text = f"Alice was beginning to get very {tokenizer.mask_token} of sitting by her sister."
    fill = pipeline("fill-mask", model=str(tmp_path / "export"), top_k=5)
    got = [candidate["token"] for candidate in fill(text)]
    encoded = tokenizer(text, return_tensors="pt")
    position = int((encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0])
    batch = {**encoded, "target_index": torch.tensor([position])}
    expected = spanlm_mlm_logits(objective, batch)[0].topk(5).indices.tolist()
    assert got == expected


@pytest.mark.parametrize("sharing", ["es", "gdes"])
def test_electra_export_is_electra_for_pretraining_with_the_rtd_head(prepared, tmp_path, sharing):
    from transformers import AutoModelForMaskedLM, ElectraForPreTraining

    corpus = PreparedCorpus(prepared)
    recipe = tiny_recipe(prepared, "electra", tmp_path, family="electra")
    recipe.objective.electra.sharing = sharing
    objective = perturbed(build_objective(recipe, corpus))
    objective.export(tmp_path / "export", corpus.tokenizer)
    assert not (tmp_path / "export" / "heads.safetensors").exists()

    batch = fixed_batch(objective, prepared)
    discriminator = ElectraForPreTraining.from_pretrained(str(tmp_path / "export")).eval()
    with torch.no_grad():
        hidden = objective.discriminator(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long()
        ).last_hidden_state
        positions = batch["attention_mask"].flatten().nonzero().squeeze(1)
        expected = objective.rtd_head(hidden, positions)  # (T,)
        got = discriminator(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long()
        ).logits.flatten()[positions]
    assert torch.allclose(got, expected, atol=1e-5)

    generator = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "export" / "generator")).eval()
    assert type(generator).__name__ == "ElectraForMaskedLM"
    with torch.no_grad():
        rows = objective.mlm_head(gather_rows(encode(objective.generator, batch), batch["target_index"]))
    assert torch.allclose(hf_logits_at_targets(generator, batch), rows, atol=1e-5)


def save_stock_masked_lm(family: str, corpus: PreparedCorpus, directory: Path, tied: bool = True) -> torch.nn.Module:
    """A transformers *ForMaskedLM of ``family`` made and saved by transformers alone, with the corpus's tokenizer."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    special = corpus.special_ids
    extra = (
        {"max_position_embeddings": 64 + special["pad"] + 1} if family == "roberta" else {"max_position_embeddings": 64}
    )
    config = AutoConfig.for_model(
        family,
        vocab_size=corpus.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        pad_token_id=special["pad"],
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        tie_word_embeddings=tied,
        **extra,
    )
    torch.manual_seed(7)
    model = AutoModelForMaskedLM.from_config(config)
    with torch.no_grad():  # a trained-looking head: not its zero-bias, unit-LayerNorm initialisation
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(str(directory))
    corpus.tokenizer.save_pretrained(str(directory))
    return model.eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_continuing_a_stock_masked_lm_gives_transformers_own_loss(prepared, tmp_path, family):
    """Step-1 loss of spanlm's MLM objective from a stock *ForMaskedLM = that model's own MLM loss on the batch."""
    corpus = PreparedCorpus(prepared)
    stock = save_stock_masked_lm(family, corpus, tmp_path / "stock")
    objective = build_objective(
        tiny_recipe(prepared, "mlm", tmp_path, family=family, path=str(tmp_path / "stock")), corpus
    ).eval()
    assert objective.head_report == {"mlm_head": f"loaded ({FAMILIES[family]} weights in stock)"}

    batch = fixed_batch(objective, prepared)
    labels = (
        torch.full(batch["input_ids"].shape, -100).flatten().index_put((batch["target_index"],), batch["target_labels"])
    )
    with torch.no_grad():
        expected = stock(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"].long(),
            labels=labels.view_as(batch["input_ids"]),
        ).loss
        got = objective(batch)["loss"]
    assert torch.allclose(got, expected, atol=1e-5), (float(got), float(expected))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_untied_decoder_is_continued_and_exported_as_the_checkpoints_own(prepared, tmp_path, family):
    """A stock *ForMaskedLM whose decoder is its own (tie_word_embeddings: false): spanlm's head keeps that decoder
    (its logits are the stock model's), and the export holds it (transformers' logits again)."""
    from transformers import AutoModelForMaskedLM

    corpus = PreparedCorpus(prepared)
    stock = save_stock_masked_lm(family, corpus, tmp_path / "stock", tied=False)
    assert stock.get_output_embeddings().weight.data_ptr() != stock.get_input_embeddings().weight.data_ptr()
    objective = build_objective(
        tiny_recipe(prepared, "mlm", tmp_path, family=family, path=str(tmp_path / "stock")), corpus
    ).eval()
    batch = fixed_batch(objective, prepared)
    expected = hf_logits_at_targets(stock, batch)
    assert torch.allclose(spanlm_mlm_logits(objective, batch), expected, atol=1e-5)
    objective.export(tmp_path / "export", corpus.tokenizer)
    exported = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "export")).eval()
    assert torch.allclose(hf_logits_at_targets(exported, batch), expected, atol=1e-5)


def test_continued_pretraining_reports_its_heads(prepared, tmp_path, capsys):
    """`spanlm pretrain` with model.path says which heads it loaded and which start fresh, and why."""
    from spanlm.cli import main
    from spanlm.config import save_config

    corpus = PreparedCorpus(prepared)
    objective = build_objective(tiny_recipe(prepared, "mlm", tmp_path), corpus)
    objective.export(tmp_path / "mlm-export", corpus.tokenizer)
    save_tokenizer(corpus.tokenizer, tmp_path / "mlm-export")
    recipe = tiny_recipe(prepared, "spanbert", tmp_path / "run", path=str(tmp_path / "mlm-export"))
    recipe.train.max_steps = 1
    save_config(recipe, tmp_path / "recipe.yaml")
    assert main(["pretrain", str(tmp_path / "recipe.yaml")]) == 0
    err = capsys.readouterr().err
    assert (
        "LOAD REPORT" not in err and "not sharded" not in err
    )  # transformers' report of the unused MLM keys is spanlm's line
    assert (
        "heads from "
        + str(tmp_path / "mlm-export")
        + ": mlm_head loaded (BertForMaskedLM weights in mlm-export); sbo_head fresh (not in the checkpoint)"
        in err
    )


def test_a_bare_encoder_checkpoint_starts_the_head_fresh(prepared, tmp_path):
    corpus = PreparedCorpus(prepared)
    build_objective(tiny_recipe(prepared, "mlm", tmp_path), corpus).backbone.save_pretrained(str(tmp_path / "bare"))
    objective = build_objective(tiny_recipe(prepared, "mlm", tmp_path, path=str(tmp_path / "bare")), corpus)
    assert objective.head_report == {"mlm_head": "fresh (not in the checkpoint)"}


def test_a_head_that_does_not_fit_the_embedding_is_a_clear_error(prepared, tmp_path):
    corpus = PreparedCorpus(prepared)
    save_stock_masked_lm("bert", corpus, tmp_path / "stock")
    weights = load_file(str(tmp_path / "stock" / "model.safetensors"))
    weights["cls.predictions.bias"] = weights["cls.predictions.bias"][:-5].clone()
    save_file(weights, str(tmp_path / "stock" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"stock: its BertForMaskedLM head has cls.predictions.bias of shape \(\d+,\)"):
        build_objective(tiny_recipe(prepared, "mlm", tmp_path, path=str(tmp_path / "stock")), corpus)


def test_a_partial_head_is_a_damaged_checkpoint(prepared, tmp_path):
    corpus = PreparedCorpus(prepared)
    save_stock_masked_lm("bert", corpus, tmp_path / "stock")
    weights = load_file(str(tmp_path / "stock" / "model.safetensors"))
    del weights["cls.predictions.transform.dense.weight"]
    save_file(weights, str(tmp_path / "stock" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match="head is incomplete"):
        build_objective(tiny_recipe(prepared, "mlm", tmp_path, path=str(tmp_path / "stock")), corpus)
