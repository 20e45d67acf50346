"""SpanBoundaryModel: SpanBERT's loss on a stock transformers *ForMaskedLM, equal to spanlm's own objective."""

from __future__ import annotations

import torch
from objectives.test_hf_heads import perturbed
from objectives.test_objectives import fixed_batch, prepared, tiny_recipe  # noqa: F401  (prepared: fixture)

from spanlm.collators import IGNORE_INDEX
from spanlm.data.shards import PreparedCorpus
from spanlm.models.span_boundary import SpanBoundaryModel
from spanlm.objectives import build_objective


def test_loss_equals_spanlms_spanbert_objective_on_the_same_weights_and_batch(prepared, tmp_path):
    corpus = PreparedCorpus(prepared)
    objective = perturbed(build_objective(tiny_recipe(prepared, "spanbert", tmp_path), corpus))
    objective.export(tmp_path / "export", corpus.tokenizer)
    model = SpanBoundaryModel.from_export(tmp_path / "export").eval()
    assert type(model.masked_lm).__name__ == "BertForMaskedLM"
    assert model.masked_lm.get_input_embeddings().__class__ is torch.nn.Embedding  # the stock model is left stock

    batch = fixed_batch(objective, prepared)
    labels = torch.full((batch["input_ids"].numel(),), IGNORE_INDEX).index_put(
        (batch["target_index"],), batch["target_labels"]
    )
    with torch.no_grad():
        expected = objective(batch)["loss"]
        got = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"].long(),
            labels=labels.view_as(batch["input_ids"]),
            sbo_left=batch["sbo_left"],
            sbo_right=batch["sbo_right"],
            sbo_relative=batch["sbo_relative"],
            sbo_labels=batch["sbo_labels"],
        ).loss
    assert len(batch["sbo_labels"]) > 0
    assert torch.allclose(got, expected, atol=1e-5), (float(got), float(expected))


def test_gradients_reach_the_tied_embedding_from_both_heads(prepared, tmp_path):
    corpus = PreparedCorpus(prepared)
    objective = build_objective(tiny_recipe(prepared, "spanbert", tmp_path), corpus)
    objective.export(tmp_path / "export", corpus.tokenizer)
    model = SpanBoundaryModel.from_export(tmp_path / "export")
    batch = fixed_batch(objective, prepared)
    labels = torch.full((batch["input_ids"].numel(),), IGNORE_INDEX).view_as(
        batch["input_ids"]
    )  # no MLM target: SBO alone
    loss = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"].long(),
        labels=labels,
        sbo_left=batch["sbo_left"],
        sbo_right=batch["sbo_right"],
        sbo_relative=batch["sbo_relative"],
        sbo_labels=batch["sbo_labels"],
    ).loss
    loss.backward()
    embedding = model.masked_lm.get_input_embeddings().weight
    assert embedding.grad[batch["sbo_labels"]].abs().sum() > 0  # the SBO decoder is the embedding
    assert model.sbo_head.dense1.weight.grad.abs().sum() > 0
